"""The GPU check: ours on Keras's JAX and PyTorch backends against transformers, on one NVIDIA GPU, one table.

Made for a machine that has PyTorch, JAX, transformers, tokenizers, safetensors and sentencepiece but no
TensorFlow (keras and what it needs beyond that image travel as wheels: docs/performance.md has the carry list
and the command). In about 5-8 minutes it:

1. writes a full-size random-weight checkpoint in the BAAI/bge-m3 file layout on that machine
   (tests/tiny_checkpoint.py's writer, size "full"; `--model DIR` uses a checkpoint already there);
2. runs transformers' XLMRobertaModel + the two heads (bgem3_embeddings/bench/torch_m3.py) on one padded batch
   of mixed lengths at float32 (TF32 off: the reference), bfloat16 and float16 (eager attention: transformers'
   own error in each half dtype), and times it at float16 and bfloat16 with SDPA attention;
3. runs ours, BGEM3Encoder, on each Keras backend asked for (JAX and PyTorch by default) at the same three
   precisions, in a process where `import tensorflow` fails (tests/no_tensorflow.py), checks dense, sparse and
   ColBERT outputs against the float32 reference, and times the dense output;
4. times one training step (bgem3_embeddings/bench/finetune_step.py, as `bgem3 bench --finetune` does on the
   CPU): ours, full fine-tuning with AdamW, on each of those backends, beside FlagEmbedding's trainer model
   (`EncoderOnlyEmbedderM3Model` + torch AdamW) on the same batch (--train-shape QUERIESxGROUPxTOKENS, unified
   fine-tuning, float32); FlagEmbedding's row is skipped, with a line saying so, where it is not installed
   (the GPU image has no FlagEmbedding);
5. prints the tables and writes them, with all figures as JSON, to --out.

Without a GPU (--device cuda and no NVIDIA device on the machine) it says so in one line and times nothing.

Every engine runs in its own process (JAX takes most of the GPU's memory for itself; no engine's compiled
kernels or allocator state helps another). Timing: batch x length token ids (all real tokens) per shape, the
first call (JAX compiles there) timed apart, then calls until --min-seconds have passed; tokens/s counts
batch x length per call, and every call returns its vectors to the host.

Tolerances: float32 (TF32 off on both sides): max |ours - reference| <= 1e-5 on the L2-normalised dense and
ColBERT vectors and on sparse weights scaled by max(1, their largest value). bfloat16 / float16: ours within
HALF_FACTOR x transformers' own error in that dtype (eager attention, against the same reference) plus one
unit of that dtype's precision (2^-8 bf16, 2^-11 fp16): half precision is judged against what the reference
implementation itself loses there.

    python benchmarks/gpu_check.py --out DIR                      # the GPU machine: full size, CUDA
    python benchmarks/gpu_check.py --tiny --device cpu            # the same steps on the tiny checkpoint, CPU

Exit status 0 when every engine ran and every parity row is within its tolerance; 1 otherwise (the table says
which); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout: the package and tests/ come from there
    sys.path.insert(0, str(ROOT))

PRECISIONS = ("float32", "bfloat16", "float16")
BACKENDS = ("jax", "torch")
OUTPUTS = ("dense_vecs", "sparse_weights", "colbert_vecs")
FP32_TOLERANCE = 1e-5
HALF_FACTOR = 2.0
HALF_UNIT = {"bfloat16": 2.0**-8, "float16": 2.0**-11}
# The reference's own timing rows: transformers with PyTorch's fused attention, in both half dtypes.
SDPA_PRECISIONS = ("float16", "bfloat16")
BASELINE = ("transformers-sdpa", "float16")  # what "x transformers fp16 SDPA" divides by
FULL_SHAPES = ((32, 512), (128, 64))
TINY_SHAPES = ((4, 32), (8, 16))
# The training step's batch: queries x group x passage tokens (queries of TRAIN_QUERY_TOKENS). The issue's
# 16 x 8 x 512 needs about 4x the activations of 4 x 8 x 512, more than one GPU holds without checkpointing.
FULL_TRAIN_SHAPE, TINY_TRAIN_SHAPE = (4, 8, 512), (2, 2, 16)
TRAIN_QUERY_TOKENS = 32
PAD_ID, BOS_ID, EOS_ID, FIRST_PLAIN_ID = 1, 0, 2, 4


# ------------------------------------------------------------------------------------------------ inputs
def parity_batch(vocab_size: int, max_length: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Eight right-padded rows of mixed lengths (the longest `max_length`), random plain token ids."""
    rng = np.random.default_rng(seed)
    lengths = sorted({max_length, max(3, max_length * 3 // 4), max(3, max_length // 2), 17, 9, 5, 3, 4})
    lengths = (lengths + [max_length] * 8)[:8]
    ids = np.full((8, max_length), PAD_ID, np.int32)
    mask = np.zeros((8, max_length), np.int32)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(FIRST_PLAIN_ID, vocab_size - 1, n)
        ids[row, 0], ids[row, n - 1] = BOS_ID, EOS_ID
        mask[row, :n] = 1
    return ids, mask


def timing_batch(vocab_size: int, batch: int, length: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """`batch` rows of exactly `length` real tokens (<s> ... </s>), no padding."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(FIRST_PLAIN_ID, vocab_size - 1, (batch, length)).astype(np.int32)
    ids[:, 0], ids[:, -1] = BOS_ID, EOS_ID
    return ids, np.ones_like(ids)


def time_calls(call: Any, ids: np.ndarray, mask: np.ndarray, min_seconds: float) -> dict[str, float]:
    """First call (compilation) timed apart, one more warm call, then calls until min_seconds (at least 3)."""
    start = time.perf_counter()
    call(ids, mask)
    first = time.perf_counter() - start
    call(ids, mask)
    calls, start = 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - start < min_seconds:
        call(ids, mask)
        calls += 1
    elapsed = time.perf_counter() - start
    return {"tokens_per_s": ids.size * calls / elapsed, "first_call_s": first, "calls": calls}


# ------------------------------------------------------------------------------------------------ engines
def _torch_exact(torch: Any) -> None:
    """float32 matmuls in full float32 (no TF32), as the reference and the float32 tolerance assume."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def run_transformers(spec: dict, out: Path) -> dict:
    """transformers' model + heads: eager outputs in each precision, SDPA timing in the half dtypes."""
    import torch

    from bgem3_embeddings.bench.torch_m3 import load_torch_m3

    _torch_exact(torch)
    device = torch.device(spec["device"])
    inputs = np.load(spec["inputs"])
    result: dict[str, Any] = {"device_name": _torch_device_name(torch, device), "torch": torch.__version__}

    def as_torch(a: np.ndarray) -> Any:
        return torch.from_numpy(a.astype(np.int64)).to(device)

    for precision in spec["precisions"]:
        model = load_torch_m3(spec["model"]).to(device=device, dtype=getattr(torch, precision))
        with torch.inference_mode():
            dense, sparse, colbert = model(as_torch(inputs["ids"]), as_torch(inputs["mask"]))
        np.savez(out / f"transformers-{precision}.npz", dense_vecs=dense.cpu().numpy(),
                 sparse_weights=sparse.cpu().numpy(), colbert_vecs=colbert.cpu().numpy())  # fmt: skip
        del model
    timings: dict[str, Any] = {}
    for precision in SDPA_PRECISIONS if spec["shapes"] else ():  # nothing to time: no model to load
        if time.time() > spec["deadline"]:
            timings[precision] = {"error": "not run: out of time"}
            continue
        model = load_torch_m3(spec["model"], attn_implementation="sdpa")
        model = model.to(device=device, dtype=getattr(torch, precision))

        def dense_only(ids: np.ndarray, mask: np.ndarray, model: Any = model) -> np.ndarray:
            with torch.inference_mode():
                hidden = model.encoder(input_ids=as_torch(ids), attention_mask=as_torch(mask))[0]
                return torch.nn.functional.normalize(hidden[:, 0].float(), dim=-1).cpu().numpy()

        timings[precision] = {
            f"{b}x{n}": time_calls(dense_only, *timing_batch(spec["vocab_size"], b, n), spec["min_seconds"])
            for b, n in spec["shapes"]
        }
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    result["sdpa_timings"] = timings
    return result


def _torch_device_name(torch: Any, device: Any) -> str:
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device))
    return f"{device.type} ({os.cpu_count()} CPUs)"


def run_ours(spec: dict, out: Path) -> dict:
    """BGEM3Encoder on spec['backend'] in each precision: parity outputs and dense-output timing."""
    import keras

    from bgem3_embeddings.encoder import BGEM3Encoder

    if keras.backend.backend() != spec["backend"]:
        raise RuntimeError(f"Keras runs on {keras.backend.backend()}, not {spec['backend']}")
    if spec["backend"] == "torch":
        import torch

        _torch_exact(torch)
    inputs = np.load(spec["inputs"])
    result: dict[str, Any] = {"keras": keras.__version__, "runs": {}}
    if spec["backend"] == "jax":
        import jax

        result["jax"] = jax.__version__
        result["jax_devices"] = [str(d) for d in jax.devices()]
    for precision in spec["precisions"]:
        if time.time() > spec["deadline"]:
            result["runs"][precision] = {"error": "not run: out of time"}
            continue
        start = time.perf_counter()
        encoder = BGEM3Encoder(spec["model"], precision=precision, device=spec["device"], weights_cache=False)
        run: dict[str, Any] = {"load_s": time.perf_counter() - start, "compute_dtype": encoder.compute_dtype}
        got = encoder.run_batch(inputs["ids"], inputs["mask"], OUTPUTS)
        np.savez(out / f"ours-{spec['backend']}-{precision}.npz", **{k: np.asarray(got[k]) for k in OUTPUTS})

        def dense_only(ids: np.ndarray, mask: np.ndarray, encoder: Any = encoder) -> np.ndarray:
            return np.asarray(encoder.run_batch(ids, mask, ("dense_vecs",))["dense_vecs"])

        run["timings"] = {
            f"{b}x{n}": time_calls(dense_only, *timing_batch(spec["vocab_size"], b, n), spec["min_seconds"])
            for b, n in spec["shapes"]
        }
        result["runs"][precision] = run
        del encoder
    result["tensorflow_imported"] = "tensorflow" in sys.modules
    return result


# ------------------------------------------------------------------------------------------------ training
def run_training_step(spec: dict) -> dict:
    """One training step, timed (bgem3_embeddings/bench/finetune_step.py's measure: a warm-up step, then
    spec['steps'] steps), on spec['device']; ours on the process's Keras backend or FlagEmbedding's."""
    from bgem3_embeddings.bench.finetune_step import measure

    return measure({**spec, "engine": "ours" if spec["engine"] == "ours-train" else "flagembedding"})


def flagembedding_missing() -> str | None:
    """Why FlagEmbedding's trainer cannot run here (what is not installed), or None when it can."""
    needed = ("FlagEmbedding", "datasets", "accelerate")  # its finetune package imports the other two
    missing = [m for m in needed if m not in sys.modules and importlib.util.find_spec(m) is None]
    return f"{', '.join(missing)} not installed on this machine" if missing else None


def training_batch(model: Path, shape: tuple[int, int, int], workdir: Path) -> tuple[Path, int]:
    """The step's batch (bench/finetune_bench.py's fixed batch: every text at its full length) as .npz;
    returns its path and its real tokens."""
    from bgem3_embeddings.bench.finetune_bench import FinetuneBenchOptions, fixed_batch
    from bgem3_embeddings.bench.finetune_step import save_batch
    from bgem3_embeddings.tokenizer import BGEM3Tokenizer

    queries, group, tokens = shape
    options = FinetuneBenchOptions(batch_size=queries, group_size=group, passage_max_len=tokens,
                                   query_max_len=min(TRAIN_QUERY_TOKENS, tokens))  # fmt: skip
    batch = fixed_batch(BGEM3Tokenizer.from_dir(model), options)
    save_batch(workdir / "train-batch.npz", batch)
    return workdir / "train-batch.npz", batch.tokens


def training_rows(base: dict, backends: list[str], workdir: Path) -> list[dict]:
    """Ours on each backend, then FlagEmbedding's trainer, each timed in its own process; a row that cannot
    run says why."""
    runs = [("ours-train", backend) for backend in backends] + [("flagembedding-train", "")]
    rows = []
    for engine, backend in runs:
        row: dict[str, Any] = {"engine": "ours" if engine == "ours-train" else "flagembedding",
                               "backend": backend or "torch"}  # fmt: skip
        missing = flagembedding_missing() if engine == "flagembedding-train" else None
        if missing is not None:
            row["skipped"] = f"not run: {missing}"
        else:
            name = f"train-{row['engine']}-{row['backend']}"
            row |= run_engine({**base, "engine": engine, "backend": backend, "name": name, "row": name},
                              workdir)  # fmt: skip
        rows.append(row)
    theirs = rows[-1]
    for row in rows[:-1]:
        if "tokens_per_s" in row and "tokens_per_s" in theirs:
            row["vs_flagembedding"] = row["tokens_per_s"] / theirs["tokens_per_s"]
    return rows


def format_training(rows: list[dict], header: str) -> str:
    """The training step's table: tokens/s, step and warm-up time, peak GPU memory, ratio to FlagEmbedding."""
    head = (f"{'engine':<18}{'backend':<11}{'tok/s':>12}{'step s':>9}{'1st step s':>12}{'GPU peak MB':>13}"
            f"{'peak RSS MB':>13}{'x FlagEmbedding':>17}")  # fmt: skip
    lines = [header, "", head, "-" * len(head)]
    for r in rows:
        left = f"{r['engine']:<18}{r['backend']:<11}"
        if "skipped" in r or "error" in r:
            lines.append(left + (r.get("skipped") or f"failed: {r['error']}"))
            continue
        step = sum(r["step_s"]) / len(r["step_s"])
        lines.append(
            left + f"{r['tokens_per_s']:>12,.0f}{step:>9.3f}{r['first_step_s']:>12.1f}"
            f"{_n(r.get('device_peak_mb'), ',.0f'):>13}{r['peak_rss_mb']:>13,.0f}"
            f"{_n(r.get('vs_flagembedding'), '.2f') + 'x':>17}"
        )
    lines.append("tok/s: real tokens (queries + passages) per second of a timed step (forward, backward, "
                 "AdamW); 1st step s: the warm-up step (JAX compiles there)")  # fmt: skip
    return "\n".join(lines)


def no_gpu_line(device: str) -> str | None:
    """One line when --device cuda finds no NVIDIA GPU on this machine (nothing is timed then), else None."""
    if device != "cuda" or Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi"):
        return None
    return ("gpu_check: no GPU on this machine (no /dev/nvidiactl, no nvidia-smi): nothing timed; "
            "--device cpu runs the same steps on the CPU")  # fmt: skip


def worker_main(spec_path: Path) -> None:
    """One engine, in this process: `gpu_check.py --worker SPEC.json` (started by `main`)."""
    spec = json.loads(spec_path.read_text())
    if spec["engine"] in ("ours", "ours-train") and spec["backend"] != "tensorflow":
        from tests.no_tensorflow import hide_tensorflow

        hide_tensorflow()  # as on the GPU image, which has no TensorFlow
        os.environ["KERAS_BACKEND"] = spec["backend"]
    out = Path(spec["out"])
    if spec["engine"] in ("ours-train", "flagembedding-train"):
        result = run_training_step(spec)
    elif spec["engine"] == "transformers":
        result = run_transformers(spec, out)
    else:
        result = run_ours(spec, out)
    Path(spec["result"]).write_text(json.dumps(result, indent=1))


def run_engine(spec: dict, workdir: Path, script: Path = Path(__file__)) -> dict:
    """Run one engine in a fresh interpreter until the deadline; its failure is reported, not raised.

    `script --worker SPEC.json` runs it (this file's `worker_main` by default; gpu_profile.py has its own).
    """
    default = spec["engine"] if spec["engine"] == "transformers" else f"ours-{spec['backend']}"
    name = spec.get("name") or default
    spec = {**spec, "result": str(workdir / f"{name}.json"), "out": str(workdir)}
    spec_path = workdir / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    # The checkout first, then the caller's path (on the GPU machine: where the carried wheels went).
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": path}
    if spec.get("backend"):
        env["KERAS_BACKEND"] = spec["backend"]
    env["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"  # no TF32 in JAX's float32 matmuls either
    if spec["device"] == "cpu":
        env.update({"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""})
    timeout = max(1.0, spec["deadline"] - time.time() + 30)  # a worker past the deadline skips its runs
    try:
        done = subprocess.run([sys.executable, str(script), "--worker", str(spec_path)], env=env,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"{name} ran past the time budget"}
    if done.returncode != 0 or not Path(spec["result"]).is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"error": f"{name} exit {done.returncode}: {' | '.join(tail)}"}
    return dict(json.loads(Path(spec["result"]).read_text()))


# ------------------------------------------------------------------------------------------------ parity
Arrays = dict[str, np.ndarray]


def output_errors(got: Arrays, ref: Arrays, mask: np.ndarray) -> dict[str, float | None]:
    """Max |got - ref| per output: dense rows, sparse weights / max(1, largest weight), real ColBERT rows.

    >>> ref = {"dense_vecs": np.ones((1, 2)), "sparse_weights": np.array([[4.0, 0.0]]),
    ...        "colbert_vecs": np.ones((1, 1, 2))}
    >>> got = {**ref, "sparse_weights": np.array([[3.0, 0.0]])}
    >>> output_errors(got, ref, np.array([[1, 1]]))["sparse_weights"]
    0.25
    """
    real = mask[:, 1:].astype(bool)  # ColBERT rows of the tokens after <s> (right padding: real ones first)
    largest = float(np.abs(ref["sparse_weights"]).max())
    # Deep random weights can drive every token's sparse pre-activation below zero: with an all-zero reference
    # an all-zero answer would "match" whatever the code does, so sparse is then not compared (None).
    diff = float(np.abs(got["sparse_weights"] - ref["sparse_weights"]).max())
    sparse = diff / max(1.0, largest) if largest else None
    return {
        "dense_vecs": float(np.abs(got["dense_vecs"] - ref["dense_vecs"]).max()),
        "sparse_weights": sparse,
        "colbert_vecs": float(np.abs(got["colbert_vecs"][real] - ref["colbert_vecs"][real]).max()),
    }


def worst_error(errors: dict[str, float | None]) -> float:
    """The largest of `output_errors`' figures (an output not compared, None, is left out)."""
    return max(e for e in errors.values() if e is not None)


def within(errors: dict[str, float | None], allowed: float | None) -> bool:
    """The verdict: every compared output within `allowed`; no tolerance (None) is no pass."""
    return allowed is not None and worst_error(errors) <= allowed


def tolerance(precision: str, transformers_error: float | None) -> float | None:
    """The largest error ours may have in this precision (see the module docstring)."""
    if precision == "float32":
        return FP32_TOLERANCE
    if transformers_error is None:
        return None
    return HALF_FACTOR * transformers_error + HALF_UNIT[precision]


# ------------------------------------------------------------------------------------------------ report
def build_rows(
    results: dict[str, dict], workdir: Path, mask: np.ndarray, shapes: list[str], precisions: list[str]
) -> list[dict]:
    """One row per (engine, precision) asked for: errors, tolerance, verdict, tokens/s per shape."""
    rows: list[dict] = []
    tf = results["transformers"]
    ref_path = workdir / "transformers-float32.npz"
    ref = dict(np.load(ref_path)) if ref_path.is_file() else None
    theirs_error: dict[str, float] = {}
    for precision in precisions:
        path = workdir / f"transformers-{precision}.npz"
        row: dict[str, Any] = {"engine": "transformers", "backend": "torch", "precision": precision}
        if "error" in tf or ref is None or not path.is_file():
            row["error"] = tf.get("error", "no reference outputs")
        elif precision == "float32":
            row["note"] = "reference (eager attention, TF32 off)"
        else:
            row["errors"] = output_errors(dict(np.load(path)), ref, mask)
            theirs_error[precision] = worst_error(row["errors"])
            row["note"] = "transformers' own error in this dtype"
        rows.append(row)
    for precision in SDPA_PRECISIONS:
        row = {"engine": "transformers-sdpa", "backend": "torch", "precision": precision}
        timing = tf.get("sdpa_timings", {}).get(precision)
        if timing is None or "error" in timing:
            row["error"] = (timing or tf).get("error", "not run")
        else:
            row["timings"] = timing
        rows.append(row)
    for name, res in results.items():
        if name == "transformers":
            continue
        backend = name.removeprefix("ours-")
        for precision in precisions:
            row = {"engine": "ours", "backend": backend, "precision": precision}
            run = res.get("runs", {}).get(precision)
            path = workdir / f"ours-{backend}-{precision}.npz"
            if "error" in res or run is None or "error" in run:
                row["error"] = (run or res).get("error", "not run")
            elif ref is None:
                row["error"] = "no reference to compare with"
                row["timings"] = run["timings"]
            else:
                row["errors"] = output_errors(dict(np.load(path)), ref, mask)
                row["tolerance"] = tolerance(precision, theirs_error.get(precision))
                row["ok"] = within(row["errors"], row["tolerance"])
                row["timings"] = run["timings"]
                row["compute_dtype"] = run["compute_dtype"]
            rows.append(row)
    baseline = next((r for r in rows if (r["engine"], r["precision"]) == BASELINE and "timings" in r), None)
    for row in rows:
        if baseline is not None and "timings" in row:
            row["vs_baseline"] = {
                s: row["timings"][s]["tokens_per_s"] / baseline["timings"][s]["tokens_per_s"] for s in shapes
            }
    return rows


def _e(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def _n(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(rows: list[dict], shapes: list[str], header: str) -> str:
    """The check's one table (the baseline column divides by transformers fp16 SDPA tokens/s)."""
    tok = "".join(f"{'tok/s ' + s:>16}" for s in shapes)
    ratio = "".join(f"{'x tf16 ' + s:>15}" for s in shapes)
    head = (f"{'engine':<18}{'backend':<11}{'precision':<10}{'dense':>9}{'sparse':>9}{'colbert':>9}"
            f"{'tolerance':>10}  {'parity':<7}{tok}{ratio}{'1st call s':>12}")  # fmt: skip
    lines = [header, "", head, "-" * len(head)]
    for r in rows:
        left = f"{r['engine']:<18}{r['backend']:<11}{r['precision']:<10}"
        if "error" in r:
            lines.append(f"{left}failed: {r['error']}")
            continue
        errors = r.get("errors", {})
        verdict = "ok" if r.get("ok") else ("FAIL" if "ok" in r else "")
        timings, ratios = r.get("timings", {}), r.get("vs_baseline", {})
        first = max((t["first_call_s"] for t in timings.values()), default=None)
        lines.append(
            left
            + "".join(f"{_e(errors.get(k)):>9}" for k in OUTPUTS)
            + f"{_e(r.get('tolerance')):>10}  {verdict:<7}"
            + "".join(f"{_n(timings.get(s, {}).get('tokens_per_s'), ',.0f'):>16}" for s in shapes)
            + "".join(f"{_n(ratios.get(s), '.2f') + 'x':>15}" for s in shapes)
            + f"{_n(first, '.1f'):>12}"
            + (f"  ({r['note']})" if r.get("note") else "")
        )
    lines += [
        "",
        "dense / sparse / colbert: max |ours - transformers float32| (sparse / max(1, its largest weight));",
        "tokens/s: dense output, batch x length real tokens per call, vectors back on the host; "
        "1st call s: the slowest shape's first call (JAX compiles there)",
    ]
    if any("errors" in r and r["errors"]["sparse_weights"] is None for r in rows):
        lines.append("sparse: not compared (-): the reference's sparse weights are all zero on this random "
                     "checkpoint, so equal outputs would prove nothing; the CPU parity tests compare them")
    key = ("ours", "jax", "bfloat16")
    jax_bf16 = next((r for r in rows if (r["engine"], r["backend"], r["precision"]) == key), None)
    if jax_bf16 is not None and "vs_baseline" in jax_bf16:
        lines.append(f"target: ours on JAX bf16 >= 1.0x transformers fp16 SDPA at {shapes[0]}: "
                     f"{jax_bf16['vs_baseline'][shapes[0]]:.2f}x")  # fmt: skip
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ main
def make_checkpoint(out: Path, tiny: bool) -> Path:
    """tests/tiny_checkpoint.py's writer: the BAAI/bge-m3 layout, random weights, tiny or full size."""
    from tests.tiny_checkpoint import make_tiny_checkpoint

    return Path(make_tiny_checkpoint(out, weights="safetensors", size="tiny" if tiny else "full", seed=0))


def parse_shapes(text: str, smallest: int = 2) -> list[tuple[int, int]]:
    """ "32x512,128x64" -> [(32, 512), (128, 64)]; each size at least `smallest`."""
    try:
        shapes = [tuple(int(n) for n in part.split("x")) for part in text.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 2 or min(s) < smallest for s in shapes):
        raise argparse.ArgumentTypeError(f"shapes are BATCHxLENGTH[,BATCHxLENGTH...], got {text!r}")
    return [(s[0], s[1]) for s in shapes]


def parse_train_shape(text: str) -> tuple[int, int, int]:
    """ "4x8x512" -> (4, 8, 512): queries, group size, passage tokens (each at least 1; tokens at least 3)."""
    try:
        queries, group, tokens = (int(n) for n in text.split("x"))
    except ValueError:
        queries = group = tokens = 0
    if min(queries, group) < 1 or tokens < 3:
        raise argparse.ArgumentTypeError(f"the training shape is QUERIESxGROUPxTOKENS (4x8x512): {text!r}")
    return queries, group, tokens


def add_machine_arguments(
    parser: argparse.ArgumentParser,
    *,
    worker: bool = True,
    tiny: str = "tiny checkpoint, small shapes (a test run)",
) -> None:
    """The options every GPU script here shares: --tiny, --device, --model (and the hidden --worker of the
    scripts that start an engine per process through `run_engine`)."""
    if worker:
        parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tiny", action="store_true", help=tiny)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--model", type=Path, help="a checkpoint on this machine (default: write one)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_machine_arguments(parser)
    parser.add_argument("--backends", default=",".join(BACKENDS), help="Keras backends for ours (jax,torch)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--shapes", type=parse_shapes, help="BATCHxLENGTH,... (default 32x512,128x64)")
    parser.add_argument("--min-seconds", type=float, help="timed calls per shape last at least this long")
    parser.add_argument("--budget-s", type=float, default=470.0, help="the whole check's time budget")
    parser.add_argument("--out", type=Path, help="where the table and the JSON go (default: a temp dir)")
    parser.add_argument("--train-shape", type=parse_train_shape,
                        help="QUERIESxGROUPxTOKENS of the training step (default 4x8x512; --tiny 2x2x16)")
    parser.add_argument("--train-steps", type=int, help="timed training steps after the warm-up (default 2)")
    parser.add_argument("--no-train", action="store_true", help="do not time the training step")
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker_main(args.worker)
        return 0
    no_gpu = no_gpu_line(args.device)
    if no_gpu is not None:
        print(no_gpu)
        return 1
    deadline = time.time() + args.budget_s
    backends = [b for b in args.backends.split(",") if b]
    precisions = [p for p in args.precisions.split(",") if p]
    bad = [b for b in backends if b not in ("jax", "torch", "tensorflow")] + [
        p for p in precisions if p not in PRECISIONS
    ]
    if bad or "float32" not in precisions:
        parser.error(f"backends are jax / torch / tensorflow, precisions {'/'.join(PRECISIONS)} with float32 "
                     f"among them (the reference); got {', '.join(bad) or args.precisions}")  # fmt: skip
    shapes = args.shapes or list(TINY_SHAPES if args.tiny else FULL_SHAPES)
    min_seconds = args.min_seconds if args.min_seconds is not None else (0.1 if args.tiny else 2.0)
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-work-") as tmp:
        workdir = Path(tmp)
        started = time.perf_counter()
        model = args.model or make_checkpoint(workdir / "checkpoint", args.tiny)
        checkpoint_s = time.perf_counter() - started
        config = json.loads((model / "config.json").read_text())
        ids, mask = parity_batch(config["vocab_size"], min(512, max(n for _, n in shapes)))
        np.savez(workdir / "inputs.npz", ids=ids, mask=mask)
        base = {"model": str(model), "device": args.device, "inputs": str(workdir / "inputs.npz"),
                "precisions": precisions, "shapes": shapes, "vocab_size": config["vocab_size"],
                "min_seconds": min_seconds, "deadline": deadline}  # fmt: skip
        results = {"transformers": run_engine({**base, "engine": "transformers"}, workdir)}
        for backend in backends:
            results[f"ours-{backend}"] = run_engine({**base, "engine": "ours", "backend": backend}, workdir)
        names = [f"{b}x{n}" for b, n in shapes]
        rows = build_rows(results, workdir, mask, names, precisions)
        train_rows: list[dict] = []
        if not args.no_train:
            train_shape = args.train_shape or (TINY_TRAIN_SHAPE if args.tiny else FULL_TRAIN_SHAPE)
            batch, tokens = training_batch(model, train_shape, workdir)
            steps = args.train_steps or (1 if args.tiny else 2)
            train = {"model": str(model), "device": args.device, "deadline": deadline, "batch": str(batch),
                     "steps": steps, "unified": True, "lora_rank": None, "remat": False}  # fmt: skip
            train_rows = training_rows(train, backends, workdir)
            queries, group, length = train_shape
            train_header = (f"training step: {queries} queries x group {group} x {length} tokens ({tokens:,} "
                            f"tokens), full fine-tuning, unified, AdamW, float32; one warm-up step, then "
                            f"{steps} timed")  # fmt: skip
    versions = {k: v for r in results.values() for k, v in r.items() if k in ("torch", "keras", "jax")}
    header = (f"gpu_check: {results['transformers'].get('device_name', args.device)}; "
              f"{'tiny' if args.tiny else 'full-size'} random checkpoint ({checkpoint_s:.0f} s to write"
              f"{', given' if args.model else ''}); "
              + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
              + f"; {time.time() - deadline + args.budget_s:.0f} s in all")  # fmt: skip
    table = format_table(rows, names, header)
    if train_rows:
        table += "\n\n" + format_training(train_rows, train_header)
    print(table)
    (out / "gpu_check.txt").write_text(table + "\n")
    report = {"header": header, "rows": rows, "engines": results, "train_rows": train_rows}
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    failed = [r for r in rows + train_rows if "error" in r or r.get("ok") is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
