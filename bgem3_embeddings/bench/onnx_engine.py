"""ONNX Runtime as a bench engine: the checkpoint exported with torch.onnx (fp32) and quantize_dynamic (int8).

What CPU users pick instead of us (fastembed, bge-m3-lite) runs ONNX Runtime, so the bench compares with it
on the same batches. The export is transformers' XLMRobertaModel plus both heads (bench/torch_m3.py), all
three outputs, dynamic batch and length; the int8 model is ONNX Runtime's dynamic quantization (int8
weights, activations quantized per call). Both are cached beside the bench's checkpoint, keyed by the
checkpoint files' sizes and times, so a second bench run reuses them.

Needs the `bench` extra: pip install 'bgem3-embeddings[bench]' (onnx, onnxruntime; torch for the export).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import numpy as np

from bgem3_embeddings.bench.torch_m3 import OUTPUT_NAMES

logger = logging.getLogger(__name__)
ONNX_PRECISIONS = ("float32", "int8")
OPSET = 17
INSTALL_HINT = "pip install 'bgem3-embeddings[bench]' (onnx, onnxruntime)"


def _fingerprint(model_dir: Path) -> str:
    """Sizes and modification times of the checkpoint's files: a new checkpoint gets a new export."""
    digest = hashlib.sha256()
    for path in sorted(model_dir.iterdir()):
        if path.is_file():
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()[:12]


def export_dir(model_dir: str | Path, cache_dir: str | Path) -> Path:
    """Where the exports of `model_dir` are kept: CACHE_DIR/onnx-NAME-FINGERPRINT/."""
    root = Path(model_dir)
    return Path(cache_dir) / f"onnx-{root.name}-{_fingerprint(root)}"


def model_path(out_dir: Path, precision: str) -> Path:
    if precision not in ONNX_PRECISIONS:
        raise ValueError(f"onnxruntime precision must be one of {ONNX_PRECISIONS}, got {precision!r}")
    return out_dir / f"model-{precision}.onnx"


def export_fp32(model_dir: str | Path, out_dir: Path) -> Path:
    """torch.onnx export (TorchScript exporter, dynamic batch and length); weights in one external file."""
    import onnx
    import torch

    from bgem3_embeddings.bench.torch_m3 import load_torch_m3

    out = model_path(out_dir, "float32")
    if out.is_file():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    module = load_torch_m3(model_dir)
    ids = torch.tensor([[0, 5, 6, 7, 2], [0, 8, 2, 1, 1]], dtype=torch.int64)
    mask = (ids != 1).to(torch.int64)
    staging = out_dir / "export-staging"
    staging.mkdir(exist_ok=True)
    tmp = staging / "model.onnx"
    logger.info("exporting %s to ONNX (fp32)", model_dir)
    with torch.inference_mode():
        torch.onnx.export(
            module,
            (ids, mask),
            str(tmp),
            dynamo=False,
            input_names=["input_ids", "attention_mask"],
            output_names=list(OUTPUT_NAMES),
            dynamic_axes={
                "input_ids": {0: "batch", 1: "length"},
                "attention_mask": {0: "batch", 1: "length"},
                "dense_vecs": {0: "batch"},
                "sparse_weights": {0: "batch", 1: "length"},
                "colbert_vecs": {0: "batch", 1: "length_minus_1"},
            },
            opset_version=OPSET,
        )
    # Re-save with every weight in one external file (a full fp32 model exceeds protobuf's 2 GB).
    model = onnx.load(str(tmp))
    onnx.save_model(
        model, str(out), save_as_external_data=True, all_tensors_to_one_file=True, location=out.name + ".data"
    )
    for path in staging.iterdir():
        path.unlink()
    staging.rmdir()
    return out


def export_int8(fp32: Path, out_dir: Path) -> Path:
    """ONNX Runtime dynamic quantization: int8 weights, activations quantized on the fly."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out = model_path(out_dir, "int8")
    if out.is_file():
        return out
    logger.info("quantizing %s to dynamic int8", fp32)
    tmp = out.with_suffix(".partial.onnx")
    quantize_dynamic(str(fp32), str(tmp), weight_type=QuantType.QInt8, use_external_data_format=True)
    tmp.rename(out)  # the int8 weights fit one protobuf; any external data keeps its own name
    return out


def ensure_exports(model_dir: str | Path, cache_dir: str | Path, precisions: tuple[str, ...]) -> Path:
    """Export (and quantize) the models the bench will run, unless cached; returns their folder."""
    out_dir = export_dir(model_dir, cache_dir)
    fp32 = export_fp32(model_dir, out_dir)
    if "int8" in precisions:
        export_int8(fp32, out_dir)
    return out_dir


def onnx_session(path: Path) -> Any:
    """An ONNX Runtime CPU session with all graph optimisations (its defaults for threads)."""
    try:
        import onnxruntime as ort
    except ImportError as err:
        raise ImportError(f"the onnxruntime engine needs onnxruntime: {INSTALL_HINT}") from err
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_session(session: Any, input_ids: np.ndarray, attention_mask: np.ndarray) -> dict[str, np.ndarray]:
    """All three outputs of one padded batch."""
    outputs = session.run(
        list(OUTPUT_NAMES),
        {"input_ids": input_ids.astype(np.int64), "attention_mask": attention_mask.astype(np.int64)},
    )
    return dict(zip(OUTPUT_NAMES, outputs, strict=True))
