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
4. prints one table and writes it, with all figures as JSON, to --out.

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
import json
import os
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


def worker_main(spec_path: Path) -> None:
    """One engine, in this process: `gpu_check.py --worker SPEC.json` (started by `main`)."""
    spec = json.loads(spec_path.read_text())
    if spec["engine"] == "ours" and spec["backend"] != "tensorflow":
        from tests.no_tensorflow import hide_tensorflow

        hide_tensorflow()  # as on the GPU image, which has no TensorFlow
        os.environ["KERAS_BACKEND"] = spec["backend"]
    out = Path(spec["out"])
    result = run_transformers(spec, out) if spec["engine"] == "transformers" else run_ours(spec, out)
    Path(spec["result"]).write_text(json.dumps(result, indent=1))


def run_engine(spec: dict, workdir: Path, script: Path = Path(__file__)) -> dict:
    """Run one engine in a fresh interpreter until the deadline; its failure is reported, not raised.

    `script --worker SPEC.json` runs it (this file's `worker_main` by default; gpu_profile.py has its own).
    """
    name = spec["engine"] if spec["engine"] == "transformers" else f"ours-{spec['backend']}"
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
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker_main(args.worker)
        return 0
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
    versions = {k: v for r in results.values() for k, v in r.items() if k in ("torch", "keras", "jax")}
    header = (f"gpu_check: {results['transformers'].get('device_name', args.device)}; "
              f"{'tiny' if args.tiny else 'full-size'} random checkpoint ({checkpoint_s:.0f} s to write"
              f"{', given' if args.model else ''}); "
              + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
              + f"; {time.time() - deadline + args.budget_s:.0f} s in all")  # fmt: skip
    table = format_table(rows, names, header)
    print(table)
    (out / "gpu_check.txt").write_text(table + "\n")
    report = {"header": header, "rows": rows, "engines": results}
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    failed = [r for r in rows if "error" in r or r.get("ok") is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
