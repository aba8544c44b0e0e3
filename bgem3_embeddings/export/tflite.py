"""TFLite export (float16 or int8 dynamic-range weights) and a small runner for the exported model.

The converter starts from a temporary SavedModel whose signature uses TFLite builtin ops only (no Flex /
SELECT_TF_OPS), so the model runs on the stock TFLite / LiteRT runtime. Shapes stay dynamic: the
signature runner resizes its inputs to each batch.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from bgem3_embeddings.export.manifest import TOKENIZER_DIR, build_manifest, copy_tokenizer, write_manifest
from bgem3_embeddings.export.options import ExportError
from bgem3_embeddings.export.staging import staged_output

logger = logging.getLogger(__name__)

MODEL_FILE = "model.tflite"
# Names in the manifest's "weights" field.
WEIGHTS_NAME = {"float16": "float16", "int8": "int8-dynamic-range", "none": "float32"}
FLATBUFFER_LIMIT = 2**31  # TFLite flatbuffers cannot exceed 2 GB


def convert_saved_model(saved_model_dir: str | Path, quantize: str) -> bytes:
    """TFLite flatbuffer of a SavedModel's serving_default signature, weights as `quantize` says."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model_dir))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    if quantize == "float16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif quantize == "int8":
        # No representative dataset: dynamic range (int8 weights, activations quantized on the fly).
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    elif quantize != "none":
        raise ValueError(f"unknown quantize {quantize!r}")
    return converter.convert()


def export_tflite(
    encoder: Any, out: str | Path, *, quantize: str = "float16", revision: str | None = None
) -> Path:
    """Write OUT/model.tflite, OUT/tokenizer/ and OUT/export_manifest.json; returns `out`."""
    from bgem3_embeddings.export.serving import save_serving_module

    if encoder.precision != "float32":
        raise ExportError(f"tflite export needs a float32 encoder, got {encoder.precision}")
    weight_bytes = 4 * sum(int(np.prod(v.shape)) for v in encoder.model.variables)
    if quantize == "none" and weight_bytes >= FLATBUFFER_LIMIT:
        # Fail now rather than after a long conversion: the flatbuffer could not be written.
        raise ExportError(f"float32 weights ({weight_bytes / 1e9:.2f} GB) exceed TFLite's 2 GB flatbuffer "
                          f"limit: use --quantize float16 or int8")
    out = Path(out).expanduser()
    with staged_output(out) as staging:
        # The intermediate SavedModel lives inside the staging folder: removed whatever happens.
        with tempfile.TemporaryDirectory(dir=staging) as tmp:
            save_serving_module(encoder.model, tmp)
            logger.info("converting %s to TFLite (%s weights)", encoder.model_id, quantize)
            flatbuffer = convert_saved_model(tmp, quantize)
        (staging / MODEL_FILE).write_bytes(flatbuffer)
        tokenizer_files = copy_tokenizer(Path(encoder.files.root), staging / TOKENIZER_DIR)
        manifest = build_manifest(encoder, format="tflite", weights=WEIGHTS_NAME[quantize],
                                  model_file=MODEL_FILE, revision=revision, tokenizer_files=tokenizer_files)
        manifest["model_bytes"] = len(flatbuffer)
        write_manifest(staging, manifest)
    logger.info("wrote %s (%.1f MB)", out / MODEL_FILE, len(flatbuffer) / 1e6)
    return out


def _interpreter_class() -> Any:
    """LiteRT's Interpreter when installed (TF's tf.lite.Interpreter is deprecated in its favour)."""
    try:
        from ai_edge_litert.interpreter import Interpreter

        return Interpreter
    except ImportError:
        import tensorflow as tf

        return tf.lite.Interpreter


class TFLiteBGEM3:
    """Runs an exported model.tflite: call(input_ids, attention_mask) -> dict of float32 numpy arrays."""

    def __init__(self, path: str | Path, num_threads: int | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            path = path / MODEL_FILE
        self.path = path
        with warnings.catch_warnings():
            # TF's fallback Interpreter warns (deprecated in 2.21, "use LiteRT" in 2.18); it works.
            warnings.filterwarnings(
                "ignore", message=".*(tf.lite.Interpreter is deprecated|Please use the LiteRT interpreter).*"
            )
            self.interpreter = _interpreter_class()(model_path=str(path), num_threads=num_threads)
        self.runner = self.interpreter.get_signature_runner("serving_default")

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> dict[str, np.ndarray]:
        # The signature runner resizes its inputs to these shapes (dynamic batch and length).
        out = self.runner(input_ids=np.asarray(input_ids, np.int32),
                          attention_mask=np.asarray(attention_mask, np.int32))
        return {name: np.array(value) for name, value in out.items()}


def load_tflite(path: str | Path, num_threads: int | None = None) -> TFLiteBGEM3:
    """A runner for OUT/model.tflite (pass OUT or the .tflite file)."""
    return TFLiteBGEM3(path, num_threads=num_threads)
