"""Orchestrate `bgem3 bench`: corpus -> shared batches -> one subprocess per engine -> figures and report."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bgem3_embeddings.bench.corpus import build_corpus, shared_batches
from bgem3_embeddings.bench.peak import best_peaks, peak_dtypes
from bgem3_embeddings.bench.worker import (
    BATCH_ENGINES,
    KERAS_BACKENDS,
    KERASHUB_ON,
    OURS_ON,
    engine_backend,
    keras_device,
)
from bgem3_embeddings.config import BGEM3Config

logger = logging.getLogger(__name__)
FULL_TEXTS, QUICK_TEXTS = 32, 16
WORKER_TIMEOUT_S = 3600


@dataclass
class BenchOptions:
    model: str | None = None  # None: a random-init checkpoint of the real size and layout
    quick: bool = False
    batch_size: int = 256
    max_tokens: int | None = 8192
    repeats: int = 1
    seed: int = 0
    # "WEIGHTS" or "WEIGHTS:COMPUTE" (keras only): "bfloat16" lets the encoder choose the matmul dtype
    # (float32 on a CPU without native bf16), "bfloat16:bfloat16" forces bf16 matmuls.
    # "int8": our precision="int8" (TFLite + XNNPACK) and ONNX Runtime's dynamic int8.
    precisions: tuple[str, ...] = ("float32", "bfloat16", "bfloat16:bfloat16", "int8")
    # Also: keras-jax / keras-torch (ours on those Keras backends), kerashub / kerashub-jax / kerashub-torch
    # (KerasHub's XLM-RoBERTa + CLS + L2 on TensorFlow / JAX / PyTorch, bgem3_embeddings/bench/kerashub.py).
    engines: tuple[str, ...] = ("keras", "transformers", "onnxruntime", "keras-encode", "flagembedding")
    # Ours computes the dense vectors only (what KerasHub's embedder gives), not all three outputs.
    dense_only: bool = False
    # Passes over the whole engine list, one process per engine each time, engines interleaved so load
    # from other work on the machine hits all of them alike; each engine's best pass is reported.
    rounds: int = 1
    startup: bool = True  # also time import, construction and the first vector in a fresh process
    peak: bool = True  # measure the matmul peak (a process of its own) for the %peak column
    long_tokens: int = 0  # > 0: also encode one passage of this many tokens (memory of long inputs)
    cache_dir: Path = field(default_factory=lambda: Path(".cache") / "bench")
    texts: int | None = None
    # Rows of the FFN-shaped GEMM the matmul peak is measured on (BGE-M3's largest: 2048 x 1024 x 4096).
    peak_tokens: int = 2048
    # Where the Keras engines run (BGEM3Encoder's device: cpu, auto, metal, cuda, gpu); int8 and the other
    # engines stay on the CPU. A Mac user measures the Apple GPU with --device metal.
    device: str = "cpu"


# ------------------------------------------------------------------------------------------------ model
def random_checkpoint(cache_dir: Path) -> Path:
    """A full-size random-init checkpoint in the BAAI/bge-m3 layout, generated once (needs torch).

    The generator is the test suite's (tests/tiny_checkpoint.py), available in a source checkout.
    """
    out = cache_dir / "full-random-seed0"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    repo = Path(__file__).resolve().parents[2]
    if not (repo / "tests" / "tiny_checkpoint.py").is_file():
        raise FileNotFoundError(
            "no --model given and the random checkpoint generator (tests/tiny_checkpoint.py "
            "of a source checkout) is not available: pass --model"
        )
    if importlib.util.find_spec("torch") is None:
        raise FileNotFoundError(
            "no --model given: generating a random checkpoint needs torch (the dev extra)"
        )
    logger.warning("generating a full-size random checkpoint in %s (2.3 GB, a few minutes)", out)
    sys.path.insert(0, str(repo))
    from tests.tiny_checkpoint import make_tiny_checkpoint

    out.mkdir(parents=True, exist_ok=True)
    return Path(make_tiny_checkpoint(out, weights="safetensors", size="full", seed=0))


def resolve_model(options: BenchOptions) -> Path:
    if options.model is None:
        return random_checkpoint(options.cache_dir)
    from bgem3_embeddings.checkpoint.files import resolve_checkpoint

    return resolve_checkpoint(options.model).root


# ------------------------------------------------------------------------------------------------ figures
def forward_flops(config: BGEM3Config, batch: int, length: int) -> float:
    """FLOPs (2 x multiply-adds) of one encoder forward over a padded (batch, length) input."""
    H, F, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    tokens = batch * length
    dense = 2.0 * tokens * (4 * H * H + 2 * H * F)
    attention = 2.0 * 2 * batch * length * length * H  # q k^T and probs v
    return L * (dense + attention)


def parameter_count(config: BGEM3Config) -> int:
    """Encoder + heads parameters (pooler excluded: it is never loaded)."""
    H, F, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    embeddings = (config.vocab_size + config.max_position_embeddings + config.type_vocab_size) * H + 2 * H
    layer = 4 * (H * H + H) + (H * F + F) + (F * H + H) + 4 * H
    heads = (H * config.colbert_dim + config.colbert_dim) + (H + 1)
    return embeddings + L * layer + heads


def usable_cpu_count() -> int:
    """The CPUs this process may run on (taskset / cgroup affinity where the OS says, else the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def summarize(
    results: list[dict],
    corpus_tokens: int,
    texts: int,
    flops: float,
    padded: int,
    peaks: dict[str, float],
    weights_mb: float,
) -> list[dict]:
    """Per-engine figures: tokens/s, texts/s, GFLOP/s, % of peak, RSS; ratios come in `ratios`."""
    rows = []
    for r in results:
        if "error" in r:
            rows.append({"engine": r["engine"], "precision": r["precision"], "error": r["error"]})
            continue
        wall, cpu = r["wall_s"], r["cpu_s"]
        gflops = flops / wall / 1e9
        compute = r.get("compute_dtype", r["precision"])
        peak = peaks.get(compute)  # % of the peak of the dtype the matmuls actually ran in
        rows.append(
            {
                "engine": r["engine"],
                "precision": r["precision"],
                "compute_dtype": compute,
                "tokens_per_s": corpus_tokens / wall,
                "texts_per_s": texts / wall,
                "tokens_per_cpu_s": corpus_tokens / cpu if cpu > 0 else None,
                "wall_s": wall,
                "cpu_s": cpu,
                "gflops_per_s": gflops,
                "peak_fraction": gflops / peak if peak else None,
                "load_s": r["load_s"],
                "rss_start_mb": r["rss_start_mb"],
                "rss_loaded_mb": r["rss_loaded_mb"],
                # Resident after warm-up: memory-mapped weights (the converted cache, TFLite, ONNX external
                # data) only count once the first batches have touched them.
                "rss_warm_mb": r.get("rss_warm_mb"),
                "model_resident_mb": _resident(r),
                "model_resident_vs_fp32_weights": _resident(r) / weights_mb,
                "peak_rss_load_mb": r["peak_rss_load_mb"],
                "peak_rss_encode_mb": r["peak_rss_encode_mb"],
                "peak_rss_mb": r["peak_rss_mb"],
                "loadavg": r["loadavg"],
                "threads": r["threads"],
                "padded_tokens": padded,
                **(
                    {"dense_cosine_vs_keras_fp32": r["dense_cosine_vs_keras_fp32"]}
                    if "dense_cosine_vs_keras_fp32" in r
                    else {}
                ),
                **({k: r[k] for k in _PASSED_ON if k in r}),
            }
        )
    return rows


# Worker figures a row carries as they are, where the engine reported them.
_PASSED_ON = ("long_tokens", "round_walls", "keras_backend", "tensorflow_imported")


def _resident(r: dict) -> float:
    """RSS added by the model: after warm-up where measured, else right after loading."""
    return float(r.get("rss_warm_mb") or r["rss_loaded_mb"]) - r["rss_start_mb"]


def ratios(rows: list[dict]) -> dict[str, float]:
    """Throughput of ours / theirs on the same work: wall time, and CPU time (robust on a busy machine)."""
    by = {(r["engine"], r["precision"]): r for r in rows if "error" not in r}
    pairs = {
        "keras_fp32_vs_transformers_fp32": (("keras", "float32"), ("transformers", "float32")),
        "keras_bf16_vs_transformers_bf16_autocast": (("keras", "bfloat16"), ("transformers", "bfloat16")),
        "keras_bf16_bf16_compute_vs_transformers_bf16_autocast": (
            ("keras", "bfloat16:bfloat16"),
            ("transformers", "bfloat16"),
        ),
        "keras_bf16_vs_transformers_fp32": (("keras", "bfloat16"), ("transformers", "float32")),
        "keras_bf16_vs_keras_fp32": (("keras", "bfloat16"), ("keras", "float32")),
        "keras_fp32_vs_onnxruntime_fp32": (("keras", "float32"), ("onnxruntime", "float32")),
        "keras_int8_vs_onnxruntime_int8": (("keras", "int8"), ("onnxruntime", "int8")),
        "keras_int8_vs_keras_fp32": (("keras", "int8"), ("keras", "float32")),
        "onnxruntime_fp32_vs_transformers_fp32": (("onnxruntime", "float32"), ("transformers", "float32")),
        "keras_encode_fp32_vs_flagembedding_fp32": (
            ("keras-encode", "float32"),
            ("flagembedding", "float32"),
        ),
        **{
            f"{OURS_ON[b].replace('-', '_')}_fp32_vs_{KERASHUB_ON[b].replace('-', '_')}_fp32": (
                (OURS_ON[b], "float32"),
                (KERASHUB_ON[b], "float32"),
            )
            for b in KERAS_BACKENDS
        },
    }
    out = {}
    for name, (ours, theirs) in pairs.items():
        if ours in by and theirs in by:
            out[name] = by[theirs]["wall_s"] / by[ours]["wall_s"]
            out[name + "_cpu_time"] = by[theirs]["cpu_s"] / by[ours]["cpu_s"]
    return out


# ------------------------------------------------------------------------------------------------ running
def run_worker(spec: dict, workdir: Path) -> dict:
    """Run one engine in a fresh interpreter; an engine that fails is reported, not fatal."""
    name = f"{spec['engine']}-{spec['precision'].replace(':', '-')}"
    spec_path, out_path = workdir / f"{name}.spec.json", workdir / f"{name}.result.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    backend = engine_backend(spec["engine"])
    if backend is not None:  # Keras reads it once, at import: the worker's process starts with it
        env["KERAS_BACKEND"] = backend
    logger.debug("running %s", name)  # the caller says what runs
    proc = subprocess.run(
        [sys.executable, "-m", "bgem3_embeddings.bench.worker", str(spec_path), str(out_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=WORKER_TIMEOUT_S,
    )
    if proc.returncode != 0 or not out_path.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {
            "engine": spec["engine"],
            "precision": spec["precision"],
            "error": f"exit {proc.returncode}: {' | '.join(tail)}",
        }
    return json.loads(out_path.read_text())


def split_precision(spec: str) -> tuple[str, str]:
    """ "bfloat16" -> ("bfloat16", "auto"); "bfloat16:float32" -> ("bfloat16", "float32")."""
    weights, _, compute = spec.partition(":")
    return weights, compute or "auto"


def plan(options: BenchOptions, cpu_flags: frozenset[str] | None = None) -> list[tuple[str, str]]:
    """(engine, precision) runs in order; FlagEmbedding only when installed, end-to-end runs in fp32.

    transformers runs plain float precisions only (bf16 = autocast); onnxruntime runs float32 and int8
    (when onnx and onnxruntime are installed); keras runs that resolve to the same weights and compute
    dtypes on this CPU are run once.
    """
    from bgem3_embeddings.devices import DeviceChoice, choose_compute_dtype, read_cpu_flags

    flags = read_cpu_flags() if cpu_flags is None else cpu_flags
    gpu = DeviceChoice("gpu", "/GPU:0")  # any GPU computes in the weights' dtype
    runs = []
    for engine in options.engines:
        if engine == "flagembedding" and importlib.util.find_spec("FlagEmbedding") is None:
            logger.warning("FlagEmbedding is not installed: no comparison with BGEM3FlagModel")
            continue
        if engine == "onnxruntime" and not all(
            importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime", "torch")
        ):
            logger.warning("onnx / onnxruntime / torch not installed: no ONNX Runtime comparison")
            continue
        if engine in ("keras-encode", "flagembedding"):
            runs.append((engine, "float32"))
            continue
        if engine in (OURS_ON["jax"], OURS_ON["torch"], *KERASHUB_ON.values()):
            module = "keras_hub" if engine in KERASHUB_ON.values() else engine_backend(engine)
            if importlib.util.find_spec(module or "") is None:
                logger.warning("%s is not installed: no %s engine", module, engine)
                continue
        seen = set()
        for spec in options.precisions:
            weights, compute = split_precision(spec)
            # int8 (TFLite) is ours on TensorFlow alone; KerasHub and transformers run plain float dtypes.
            if weights == "int8" and engine != "keras" and engine != "onnxruntime":
                continue
            if engine in ("transformers", *KERASHUB_ON.values()) and compute != "auto":
                continue
            if engine == "onnxruntime":
                if weights in ("float32", "int8") and compute == "auto":
                    runs.append((engine, weights))
                continue
            device = DeviceChoice("cpu", "/CPU:0") if keras_device(options.device, weights) == "cpu" else gpu
            resolved = (weights, choose_compute_dtype(weights, device, flags, compute))
            if engine in OURS_ON.values() and resolved in seen:
                continue
            seen.add(resolved)
            runs.append((engine, spec))
    return runs


def keep_best_round(best: dict[tuple[str, str], dict], key: tuple[str, str], out: dict) -> None:
    """Keep in `best[key]` the faster of the run so far and `out` (a run without an error beats one with),
    with every round's wall time in "round_walls".

        >>> best = {}
        >>> keep_best_round(best, ("keras", "float32"), {"wall_s": 2.0})
        >>> keep_best_round(best, ("keras", "float32"), {"wall_s": 1.5})
        >>> best[("keras", "float32")]
        {'wall_s': 1.5, 'round_walls': [2.0, 1.5]}
    """
    walls = [*best.get(key, {}).get("round_walls", []), out.get("wall_s")]
    if (
        key not in best
        or ("error" in best[key] and "error" not in out)
        or ("error" not in out and out["wall_s"] < best[key]["wall_s"])
    ):
        best[key] = out
    best[key]["round_walls"] = walls


def run_bench(options: BenchOptions, progress: Any = None) -> dict[str, Any]:
    """Everything `bgem3 bench` prints, as one dict (also what --json writes)."""
    say = progress or (lambda message: None)
    model = resolve_model(options)
    config = BGEM3Config.from_json_file(model / "config.json")
    from bgem3_embeddings.tokenizer import BGEM3Tokenizer

    tokenizer = BGEM3Tokenizer.from_dir(model)  # the encoder's own tokenizer
    n = options.texts or (QUICK_TEXTS if options.quick else FULL_TEXTS)
    corpus = build_corpus(tokenizer, n, seed=options.seed)
    batches = shared_batches(corpus.token_ids, options.batch_size, options.max_tokens)
    lengths = [len(t) for t in corpus.token_ids]
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    flops = sum(forward_flops(config, len(b), max(lengths[i] for i in b)) for b in batches)
    weights_mb = parameter_count(config) * 4 / 2**20
    result: dict[str, Any] = {
        "model": str(model),
        "random_init": options.model is None,
        "corpus": {
            "texts": n,
            "tokens": corpus.num_tokens,
            "padded_tokens": padded,
            "batches": len(batches),
            "min_tokens": min(lengths),
            "max_tokens": max(lengths),
            "seed": options.seed,
        },
        "batching": {"batch_size": options.batch_size, "max_tokens": options.max_tokens},
        "dense_only": options.dense_only,
        "forward_gflop": flops / 1e9,
        "fp32_weights_mb": weights_mb,
        "cpus": usable_cpu_count(),
        "device": options.device,
        "python": sys.version.split()[0],
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "loadavg_start": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory(prefix="bgem3-bench-") as tmp:
        workdir = Path(tmp)
        corpus_path = workdir / "corpus.json"
        corpus_path.write_text(
            json.dumps({"texts": corpus.texts, "token_ids": corpus.token_ids, "batches": batches})
        )
        peak: dict[str, Any] = {}
        if options.peak:
            say("measuring the matmul peak (tensorflow, torch)")
            peak = run_worker(
                {
                    "engine": "peak",
                    "precision": "-",
                    "libraries": ["tensorflow", "torch"],
                    "tokens": options.peak_tokens,
                    "dtypes": list(peak_dtypes(options.precisions)),
                },
                workdir,
            )
        result["matmul_peak_gflops"] = peak.get("peaks", {})
        peaks = best_peaks(result["matmul_peak_gflops"])
        result["matmul_peak_best_gflops"] = peaks
        base = {
            "model": str(model),
            "corpus": str(corpus_path),
            "batch_size": options.batch_size,
            "max_tokens": options.max_tokens,
            "max_length": max(lengths),
            "repeats": options.repeats,
            "dense_out": None,
            "device": options.device,
            "outputs": ["dense_vecs"] if options.dense_only else None,
            "hf_cache": str(workdir / "hf-cache"),  # KerasHub's offline view of the checkpoint
        }
        runs = plan(options)
        onnx_precisions = sorted({p for e, p in runs if e == "onnxruntime"})
        if onnx_precisions:
            say(f"exporting the checkpoint to ONNX ({', '.join(onnx_precisions)}; cached)")
            export = run_worker(
                {
                    **base,
                    "engine": "onnx-export",
                    "precision": "-",
                    "onnx_cache": str(options.cache_dir),
                    "onnx_precisions": onnx_precisions,
                },
                workdir,
            )
            if "error" in export:
                logger.warning("ONNX export failed: %s", export["error"])
            base["onnx_dir"] = export.get("onnx_dir")
            result["onnx_export"] = export
        if ("keras", "int8") in runs:
            # Converted once, outside the timed runs: the first int8 process would otherwise build the float
            # model, convert (minutes, ~10 GB peak) and carry that memory into its resident figures.
            say("converting the checkpoint to int8 (TFLite; cached)")
            convert = run_worker({**base, "engine": "int8-convert", "precision": "int8"}, workdir)
            if "error" in convert:
                logger.warning("int8 conversion failed: %s", convert["error"])
            result["int8_convert"] = convert
        best: dict[tuple[str, str], dict] = {}
        for round_index in range(options.rounds):
            for engine, precision in runs:
                note = f" (round {round_index + 1})" if options.rounds > 1 else ""
                say(f"running {engine} {precision}{note}")
                dense_path = workdir / f"{engine}-{precision}-{round_index}.npy"
                batch_engine = engine in BATCH_ENGINES
                spec = {
                    **base,
                    "engine": engine,
                    "precision": precision,
                    "dense_out": str(dense_path) if batch_engine else None,
                }
                if engine == "onnxruntime" and not base.get("onnx_dir"):
                    out = {"engine": engine, "precision": precision, "error": "ONNX export failed"}
                else:
                    out = run_worker(spec, workdir)
                if batch_engine and dense_path.is_file():
                    out["_dense"] = str(dense_path)
                keep_best_round(best, (engine, precision), out)
        raw = list(best.values())
        _dense_agreement(raw)
        if options.startup:
            say("timing a fresh process: import, construction, first vector")
            startup_spec = {**base, "engine": "keras-startup", "precision": "float32"}
            result["startup"] = run_worker(startup_spec, workdir)
        if options.long_tokens:
            say(f"encoding one {options.long_tokens}-token passage")
            result["long_input"] = run_worker(
                {**base, "engine": "keras-long", "precision": "float32", "long_tokens": options.long_tokens},
                workdir,
            )
        rows = summarize(raw, corpus.num_tokens, n, flops, padded, peaks, weights_mb)
    result["engines"] = rows
    result["ratios"] = ratios(rows)
    result["keras_backends"] = backend_comparison(rows)
    result["loadavg_end"] = os.getloadavg()[0]
    return result


def backend_comparison(rows: list[dict], precision: str = "float32") -> list[dict]:
    """Per Keras backend: ours and KerasHub's tokens/s (wall and per CPU-second) and their ratio, for the
    backends where at least one of the two ran (a failed or missing engine's figures are None)."""
    by = {(r["engine"], r["precision"]): r for r in rows}
    out = []
    for backend in KERAS_BACKENDS:
        ours, theirs = by.get((OURS_ON[backend], precision)), by.get((KERASHUB_ON[backend], precision))
        if ours is None and theirs is None:
            continue
        ok = [r if r is not None and "error" not in r else None for r in (ours, theirs)]
        entry: dict[str, Any] = {"backend": backend, "precision": precision}
        for side, r in zip(("ours", "kerashub"), ok, strict=True):
            entry[f"{side}_tokens_per_s"] = r["tokens_per_s"] if r else None
            entry[f"{side}_tokens_per_cpu_s"] = r["tokens_per_cpu_s"] if r else None
        entry["ratio"] = ok[1]["wall_s"] / ok[0]["wall_s"] if ok[0] and ok[1] else None
        entry["ratio_cpu_time"] = ok[1]["cpu_s"] / ok[0]["cpu_s"] if ok[0] and ok[1] else None
        out.append(entry)
    return out


def _dense_agreement(raw: list[dict]) -> None:
    """Dense-vector cosine of every engine against ours in float32 (parity and precision loss at a glance)."""
    ref = next(
        (r for r in raw if r.get("engine") == "keras" and r.get("precision") == "float32" and "_dense" in r),
        None,
    )
    if ref is None:
        return
    base = np.load(ref["_dense"])
    for r in raw:
        if "_dense" in r:
            other = np.load(r.pop("_dense"))
            r["dense_cosine_vs_keras_fp32"] = float(np.einsum("ij,ij->i", base, other).mean())
    ref.pop("_dense", None)
