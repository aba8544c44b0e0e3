"""One benchmark engine in its own process: load, warm up, run the shared batches, report JSON.

    python -m bgem3_embeddings.bench.worker SPEC.json RESULT.json

Running each engine alone in a fresh process makes its peak RSS its own (TensorFlow and PyTorch never
share a process) and keeps one engine's thread pools and caches from slowing the next.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bgem3_embeddings.batching import pad_batch

logger = logging.getLogger(__name__)
ENGINES = (
    "keras",
    "keras-jax",
    "keras-torch",
    "kerashub",
    "kerashub-jax",
    "kerashub-torch",
    "keras-encode",
    "keras-long",
    "transformers",
    "onnxruntime",
    "onnx-export",
    "int8-convert",
    "flagembedding",
    "peak",
)
# Engines that run the shared padded batches (all three outputs) rather than texts through an encode API.
BATCH_ENGINES = (
    "keras",
    "keras-jax",
    "keras-torch",
    "kerashub",
    "kerashub-jax",
    "kerashub-torch",
    "transformers",
    "onnxruntime",
)
# Ours on each Keras backend, and KerasHub's XLM-RoBERTa on the same backend (bench/kerashub.py).
OURS_ON = {"tensorflow": "keras", "jax": "keras-jax", "torch": "keras-torch"}
KERASHUB_ON = {"tensorflow": "kerashub", "jax": "kerashub-jax", "torch": "kerashub-torch"}
KERAS_BACKENDS = tuple(OURS_ON)
ALL_OUTPUTS = ("dense_vecs", "sparse_weights", "colbert_vecs")
PAD_ID = 1


def _proc_status_mb(field: str) -> float | None:
    """A memory field of /proc/self/status (e.g. VmRSS, VmHWM) in MB; None where /proc is unavailable."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def rss_mb() -> float:
    """Current resident set size (MB), from /proc (Linux) or ru_maxrss as a fallback."""
    value = _proc_status_mb("VmRSS")
    return peak_rss_mb() if value is None else value


def peak_rss_mb() -> float:
    """Peak RSS of this process so far (MB); Linux reports ru_maxrss in KiB, macOS in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (Linux: clear_refs 5) so a later peak counts only what follows."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def hwm_mb() -> float:
    """Peak RSS since the last reset_peak_rss (VmHWM), or the lifetime peak where that is unavailable."""
    value = _proc_status_mb("VmHWM")
    return peak_rss_mb() if value is None else value


# ------------------------------------------------------------------------------------------------ engines
def engine_backend(engine: str) -> str | None:
    """The Keras backend an engine runs on (its process starts with KERAS_BACKEND set to it); None for
    the engines without Keras (transformers, ONNX Runtime, FlagEmbedding, the matmul peak)."""
    for backend in KERAS_BACKENDS:
        if engine in (OURS_ON[backend], KERASHUB_ON[backend]):
            return backend
    return "tensorflow" if engine in ("keras-encode", "keras-long", "keras-startup", "int8-convert") else None


def keras_device(device: str, precision: str) -> str:
    """The device a Keras engine runs on: `bgem3 bench --device`, except int8 (CPU only)."""
    return "cpu" if precision.partition(":")[0] == "int8" else device


def _keras(spec: dict, token_ids: list[list[int]]) -> tuple[Callable[[list[int]], Any], Any]:
    from bgem3_embeddings.encoder import BGEM3Encoder

    weights, _, compute = spec["precision"].partition(":")  # "bfloat16" or "bfloat16:float32"
    encoder = BGEM3Encoder(
        spec["model"],
        precision=weights,
        compute_dtype=compute or "auto",
        device=keras_device(spec.get("device", "cpu"), weights),
        max_tokens_per_batch=spec.get("max_tokens"),
    )

    outputs = tuple(spec.get("outputs") or ALL_OUTPUTS)

    def run(batch: list[int]) -> Any:
        ids, mask = pad_batch([token_ids[i] for i in batch], PAD_ID)
        return encoder.run_batch(ids, mask, outputs)["dense_vecs"]

    return run, encoder


def _kerashub(spec: dict, token_ids: list[list[int]]) -> Callable[[list[int]], Any]:
    """KerasHub's XLMRobertaBackbone + CLS + L2 (its XLMRobertaTextEmbedder) on the same checkpoint, run
    the way a Keras user runs a model: predict_on_batch (jit-compiled on JAX, a tf.function on TensorFlow)."""
    from bgem3_embeddings.bench.kerashub import load_kerashub_embedder

    embedder = load_kerashub_embedder(spec["model"], spec["hf_cache"], dtype=spec["precision"])

    def run(batch: list[int]) -> Any:
        ids, mask = pad_batch([token_ids[i] for i in batch], PAD_ID)
        return embedder.predict_on_batch({"token_ids": ids, "padding_mask": mask})

    return run


def _keras_encode(spec: dict) -> Callable[[list[str]], Any]:
    from bgem3_embeddings.encoder import BGEM3Encoder

    encoder = BGEM3Encoder(
        spec["model"],
        precision=spec["precision"],
        device=keras_device(spec.get("device", "cpu"), spec["precision"]),
        show_progress=False,
        max_tokens_per_batch=spec.get("max_tokens"),
    )
    return lambda texts: encoder.encode(texts, batch_size=spec["batch_size"], max_length=spec["max_length"])


def _transformers(spec: dict, token_ids: list[list[int]]) -> Callable[[list[int]], Any]:
    """transformers' XLMRobertaModel + the two heads (all three outputs); bf16 = torch autocast."""
    import torch

    from bgem3_embeddings.bench.torch_m3 import load_torch_m3

    model = load_torch_m3(spec["model"])
    bf16 = spec["precision"] == "bfloat16"

    def run(batch: list[int]) -> Any:
        ids, mask = pad_batch([token_ids[i] for i in batch], PAD_ID)
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            dense, _, _ = model(
                torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(mask.astype(np.int64))
            )
            return dense.numpy()

    return run


def _onnxruntime(spec: dict, token_ids: list[list[int]]) -> Callable[[list[int]], Any]:
    """The checkpoint's torch.onnx export (fp32) or its dynamic int8 quantization, on ONNX Runtime."""
    from bgem3_embeddings.bench.onnx_engine import model_path, onnx_session, run_session

    session = onnx_session(model_path(Path(spec["onnx_dir"]), spec["precision"]))

    def run(batch: list[int]) -> Any:
        ids, mask = pad_batch([token_ids[i] for i in batch], PAD_ID)
        return run_session(session, ids, mask)["dense_vecs"]

    return run


def _flagembedding(spec: dict) -> Callable[[list[str]], Any]:
    from FlagEmbedding import BGEM3FlagModel

    model = BGEM3FlagModel(spec["model"], use_fp16=False, devices="cpu")
    return lambda texts: model.encode(texts, batch_size=spec["batch_size"], max_length=spec["max_length"])


# ------------------------------------------------------------------------------------------------ runs
def _import_framework(engine: str) -> None:
    """Import the engine's libraries first: 'model resident' then counts the model, not the runtime."""
    if engine in ("transformers", "flagembedding"):
        import torch
        from transformers import XLMRobertaModel  # noqa: F401

        torch.ones(4).sum()  # start the runtime (thread pools) before the baseline
    elif engine == "onnxruntime":
        import onnxruntime  # noqa: F401
    elif engine_backend(engine) != "tensorflow" or engine.startswith("kerashub"):
        import keras

        if engine.startswith("kerashub"):
            import keras_hub  # noqa: F401
        else:
            import bgem3_embeddings.encoder  # noqa: F401 - the model code on this backend

        keras.ops.convert_to_numpy(keras.ops.sum(keras.ops.ones(4)))  # start the backend's runtime
    else:
        import tensorflow as tf

        import bgem3_embeddings.encoder  # noqa: F401 - Keras and the model code

        tf.reduce_sum(tf.ones(4))  # start the eager runtime (thread pools, devices) before the baseline


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def run_engine(spec: dict) -> dict:
    """Load the engine, warm it up, time `spec['repeats']` passes over the corpus; figures as a dict."""
    data = json.loads(Path(spec["corpus"]).read_text())
    token_ids, texts, batches = data["token_ids"], data["texts"], data["batches"]
    _import_framework(spec["engine"])
    result: dict[str, Any] = {
        "engine": spec["engine"],
        "precision": spec["precision"],
        "rss_start_mb": rss_mb(),
    }
    t0 = time.perf_counter()
    if spec["engine"] in BATCH_ENGINES:
        if spec["engine"] in OURS_ON.values():
            run_batch, encoder = _keras(spec, token_ids)
            result["compute_dtype"] = encoder.compute_dtype
        elif spec["engine"] in KERASHUB_ON.values():
            run_batch = _kerashub(spec, token_ids)
            result["compute_dtype"] = spec["precision"]
        elif spec["engine"] == "onnxruntime":
            run_batch = _onnxruntime(spec, token_ids)
            result["compute_dtype"] = spec["precision"]
        else:
            run_batch = _transformers(spec, token_ids)
        result["load_s"] = time.perf_counter() - t0
        result["rss_loaded_mb"] = rss_mb()
        result["peak_rss_load_mb"] = hwm_mb()
        # Warm-up: the longest and the shortest batch (graph tracing, kernel selection, allocator growth).
        for batch in (batches[0], batches[-1]):
            run_batch(batch)
        result["rss_warm_mb"] = rss_mb()
        dense = np.zeros((len(token_ids), 0), np.float32)

        def one_pass() -> None:
            nonlocal dense
            for batch in batches:
                vecs = np.asarray(run_batch(batch), np.float32)
                if dense.shape[1] != vecs.shape[1]:
                    dense = np.zeros((len(token_ids), vecs.shape[1]), np.float32)
                dense[batch] = vecs
    else:
        encode = (_keras_encode if spec["engine"] == "keras-encode" else _flagembedding)(spec)
        result["load_s"] = time.perf_counter() - t0
        result["rss_loaded_mb"] = rss_mb()
        result["peak_rss_load_mb"] = hwm_mb()
        # Warm-up through the same call path: the shortest and the longest text.
        by_length = sorted(texts, key=len)
        encode([by_length[0], by_length[-1]])

        def one_pass() -> None:
            encode(texts)

    reset_peak_rss()
    passes = [_timed(one_pass) for _ in range(spec.get("repeats", 1))]
    best = min(passes)
    result.update(
        {
            "wall_s": best[0],
            "cpu_s": best[1],
            "passes": passes,
            "peak_rss_mb": peak_rss_mb(),
            "peak_rss_encode_mb": hwm_mb(),
            "threads": _threads(spec["engine"]),
            "loadavg": os.getloadavg()[0],
        }
    )
    if engine_backend(spec["engine"]) is not None:
        import keras

        result["keras_backend"] = keras.backend.backend()
        # On JAX and PyTorch the model is meant to run without TensorFlow: say when it was imported anyway.
        result["tensorflow_imported"] = "tensorflow" in sys.modules
    if spec.get("dense_out") and spec["engine"] in BATCH_ENGINES:
        np.save(spec["dense_out"], dense)
    return result


def run_long(spec: dict) -> dict:
    """Encode one passage of spec['long_tokens'] tokens (all outputs); peak RSS above the loaded model."""
    from bgem3_embeddings.encoder import BGEM3Encoder

    data = json.loads(Path(spec["corpus"]).read_text())
    body = [t for ids in data["token_ids"] for t in ids[1:-1]]
    n = spec["long_tokens"] - 2
    body = (body * (n // max(len(body), 1) + 1))[:n]
    ids = np.array([[0, *body, 2]], dtype=np.int32)
    _import_framework("keras")
    result: dict[str, Any] = {
        "engine": "keras-long",
        "precision": spec["precision"],
        "long_tokens": ids.shape[1],
        "rss_start_mb": rss_mb(),
    }
    device = keras_device(spec.get("device", "cpu"), spec["precision"])
    encoder = BGEM3Encoder(spec["model"], precision=spec["precision"], device=device)
    result["rss_loaded_mb"] = rss_mb()
    reset_peak_rss()
    wall, cpu = _timed(
        lambda: encoder.run_batch(ids, np.ones_like(ids), ("dense_vecs", "sparse_weights", "colbert_vecs"))
    )
    result.update(
        {
            "wall_s": wall,
            "cpu_s": cpu,
            "peak_rss_encode_mb": hwm_mb(),
            "peak_rss_mb": peak_rss_mb(),
            "loadavg": os.getloadavg()[0],
        }
    )
    result["peak_above_loaded_mb"] = result["peak_rss_encode_mb"] - result["rss_loaded_mb"]
    return result


def run_int8_convert(spec: dict) -> dict:
    """Build (or find cached) the int8 flatbuffer of spec['model'], as BGEM3Encoder(precision="int8") does."""
    from bgem3_embeddings.encoder import BGEM3Encoder

    start = time.perf_counter()
    BGEM3Encoder(spec["model"], precision="int8", device="cpu")
    return {
        "engine": "int8-convert",
        "precision": "int8",
        "seconds": time.perf_counter() - start,
        "peak_rss_mb": hwm_mb(),
    }


def run_startup(spec: dict) -> dict:
    """What a fresh process pays before its first vector: import, construction, first and second query.

    Import is this package's encoder module (TensorFlow and Keras with it); construction is
    BGEM3Encoder(checkpoint) (reading and porting the weights); the first vector is one short query with
    all three outputs (graph tracing and optimisation happen here); the second shows the steady state.
    """
    query = "What is BGE M3?"
    outputs = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    start = time.perf_counter()
    from bgem3_embeddings.encoder import BGEM3Encoder

    imported = time.perf_counter()
    device = keras_device(spec.get("device", "cpu"), spec["precision"])
    encoder = BGEM3Encoder(spec["model"], precision=spec["precision"], device=device)
    built = time.perf_counter()
    encoder.encode(query, **outputs)
    first = time.perf_counter()
    encoder.encode(query + " And BM25?", **outputs)
    second = time.perf_counter()
    return {
        "engine": "keras-startup",
        "precision": spec["precision"],
        "import_s": imported - start,
        "construct_s": built - imported,
        "first_vector_s": first - built,
        "second_vector_s": second - first,
        "loadavg": os.getloadavg()[0],
    }


def _threads(engine: str) -> dict:
    backend = engine_backend(engine)
    if engine == "onnxruntime" or backend == "jax":
        return {}
    if engine in ("transformers", "flagembedding") or backend == "torch":
        import torch

        return {"torch_intra_op": torch.get_num_threads()}
    import tensorflow as tf

    return {
        "tf_intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
        "tf_inter_op": tf.config.threading.get_inter_op_parallelism_threads(),
    }


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(args[0]).read_text())
    backend = engine_backend(spec["engine"])
    if backend is not None:  # before anything imports Keras, which reads it once
        os.environ["KERAS_BACKEND"] = backend
    if spec["engine"] == "peak":
        from bgem3_embeddings.bench.peak import DTYPES, measure_peaks

        result: dict[str, Any] = {
            "engine": "peak",
            "peaks": measure_peaks(
                spec.get("libraries", ("tensorflow",)), spec.get("tokens", 2048), spec.get("dtypes", DTYPES)
            ),
        }
    elif spec["engine"] == "onnx-export":
        from bgem3_embeddings.bench.onnx_engine import ensure_exports

        start = time.perf_counter()
        out_dir = ensure_exports(spec["model"], spec["onnx_cache"], tuple(spec["onnx_precisions"]))
        result = {"engine": "onnx-export", "onnx_dir": str(out_dir), "seconds": time.perf_counter() - start}
    elif spec["engine"] == "int8-convert":
        result = run_int8_convert(spec)
    elif spec["engine"] == "keras-startup":
        result = run_startup(spec)
    elif spec["engine"] == "keras-long":
        result = run_long(spec)
    else:
        result = run_engine(spec)
    Path(args[1]).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
