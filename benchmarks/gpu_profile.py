"""Where the time goes on a GPU: ours on JAX beside transformers fp16 SDPA, kernel kind by kernel kind.

Issue 42's open target is ours on JAX bf16 at 1.0x transformers fp16 SDPA at 32 x 512 (0.78x on an H200,
0.98x with no attention at all: docs/performance.md). This run says which kernels make the difference, in one
call, each engine in its own process (gpu_check.run_engine):

- ours: `BGEM3Encoder` at --precision on Keras' JAX backend, `import tensorflow` failing; a `jax.profiler`
  trace of --calls dense-output calls after a warm-up, and XLA's optimized program for the 24 layers
  (`--xla_dump_to`, the `jit_encoder_stack` module);
- transformers: `XLMRobertaModel` with SDPA attention at float16 (bgem3_embeddings/bench/torch_m3.py), the
  same calls under `torch.profiler`.

Both traces are read by benchmarks/trace_summary.py: GPU kernel time per call by kind (GEMM, attention,
GELU, norm / reduce, copy / convert, other elementwise), the device's busy time against the wall time (idle =
host overhead the GPU waited through), and each engine's top kernels. XLA's fusions are named by what their
computation holds (a kernel named after a fusion that holds `erf` is the GELU). Written to --out: the table
(gpu_profile.txt), the figures (gpu_profile.json), and in gpu_profile_traces.tar both traces
(*_trace.json.gz, for Perfetto or chrome://tracing) and the program (ours_stack_hlo.txt.gz).

    python benchmarks/gpu_profile.py --model CHECKPOINT --out DIR                  # the GPU machine
    python benchmarks/gpu_profile.py --tiny --device cpu --shape 4x32 --calls 2    # the same steps, CPU
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import gpu_check  # noqa: E402  (the checkpoint, the batches, one process per engine)
import trace_summary  # noqa: E402

BASELINE = "transformers fp16"
STACK_MODULE = "jit_encoder_stack"
TRACES = "gpu_profile_traces.tar"  # both traces and ours' program (backends/jax/runner.py's 24 layers)


def run_ours(spec: dict, out: Path) -> dict:
    """Ours on JAX: warm-up, then `calls` calls under jax.profiler; the trace and the stack's program."""
    import jax
    import keras

    from bgem3_embeddings.encoder import BGEM3Encoder

    if keras.backend.backend() != "jax":
        raise RuntimeError(f"Keras runs on {keras.backend.backend()}, not jax")
    encoder = BGEM3Encoder(
        spec["model"], precision=spec["precision"], device=spec["device"], weights_cache=False
    )
    ids, mask = gpu_check.timing_batch(spec["vocab_size"], *spec["shape"])

    def dense_only(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return np.asarray(encoder.run_batch(ids, mask, ("dense_vecs",))["dense_vecs"])

    for _ in range(spec["warmup"]):
        dense_only(ids, mask)
    trace_dir = out / "jax-trace"
    jax.profiler.start_trace(str(trace_dir), create_perfetto_trace=True)
    start = time.perf_counter()
    for _ in range(spec["calls"]):
        dense_only(ids, mask)
    wall = time.perf_counter() - start
    jax.profiler.stop_trace()
    traces = sorted(trace_dir.rglob("perfetto_trace.json.gz"))
    if not traces:
        raise RuntimeError(f"jax.profiler wrote no perfetto_trace.json.gz under {trace_dir}")
    shutil.copy(traces[-1], out / "ours_trace.json.gz")
    device_name = str(jax.devices()[0].device_kind)
    return {"wall_s": wall, "calls": spec["calls"], "jax": jax.__version__, "keras": keras.__version__,
            "device_name": device_name, "compute_dtype": encoder.compute_dtype}  # fmt: skip


def run_transformers(spec: dict, out: Path) -> dict:
    """transformers fp16 with SDPA (float32 on the CPU): warm-up, then `calls` calls under torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bgem3_embeddings.bench.torch_m3 import load_torch_m3

    device = torch.device(spec["device"])
    dtype = torch.float16 if device.type == "cuda" else torch.float32  # CPU half GEMMs are emulated
    model = load_torch_m3(spec["model"], attn_implementation="sdpa").to(device=device, dtype=dtype)
    ids, mask = gpu_check.timing_batch(spec["vocab_size"], *spec["shape"])

    def dense_only(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            as_torch = [torch.from_numpy(a.astype(np.int64)).to(device) for a in (ids, mask)]
            hidden = model.encoder(input_ids=as_torch[0], attention_mask=as_torch[1])[0]
            return torch.nn.functional.normalize(hidden[:, 0].float(), dim=-1).cpu().numpy()

    for _ in range(spec["warmup"]):
        dense_only(ids, mask)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiler:
        start = time.perf_counter()
        for _ in range(spec["calls"]):
            dense_only(ids, mask)
        wall = time.perf_counter() - start
    raw = out / "transformers_trace.json"
    profiler.export_chrome_trace(str(raw))
    with raw.open("rb") as source, gzip.open(out / "transformers_trace.json.gz", "wb") as target:
        shutil.copyfileobj(source, target)
    raw.unlink()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({os.cpu_count()} CPUs)"
    return {"wall_s": wall, "calls": spec["calls"], "torch": torch.__version__, "device_name": name,
            "dtype": str(dtype).removeprefix("torch.")}  # fmt: skip


def worker_main(spec_path: Path) -> None:
    """One engine, in this process: `gpu_profile.py --worker SPEC.json` (started by gpu_check.run_engine)."""
    spec = json.loads(spec_path.read_text())
    out = Path(spec["out"])
    if spec["engine"] == "ours":
        from tests.no_tensorflow import hide_tensorflow

        hide_tensorflow()  # as on the GPU image
        os.environ["KERAS_BACKEND"] = "jax"
        dump = (
            f"--xla_dump_to={out / 'xla-dump'} --xla_dump_hlo_as_text --xla_dump_hlo_module_re=encoder_stack"
        )
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {dump}".strip()
        result = run_ours(spec, out)
    else:
        result = run_transformers(spec, out)
    Path(spec["result"]).write_text(json.dumps(result, indent=1))


def stack_program(workdir: Path) -> str:
    """The largest optimized text of the 24-layer program XLA dumped (the timed shape's), or ''."""
    dumps = [p for p in (workdir / "xla-dump").glob(f"*{STACK_MODULE}*after_optimizations.txt")]
    return max((p.read_text() for p in dumps), key=len, default="")


def program_digest(hlo_text: str) -> dict[str, Any]:
    """What the program holds: fusions by kind, custom calls by target (cuBLAS GEMMs, cuDNN attention)."""
    patterns = {
        "fusion_kinds": r"\bfusion\(.*?kind=(k\w+)",
        "custom_call_targets": r'custom_call_target="([^"]+)"',
        "gemm_epilogues": r'"epilogue":"(\w+)"',
    }
    return {key: dict(sorted(Counter(re.findall(p, hlo_text)).items())) for key, p in patterns.items()}


def profile_engines(args: argparse.Namespace, shape: tuple[int, int], workdir: Path) -> dict[str, dict]:
    """Each engine profiled in its own process; their traces (and ours' program dump) land in workdir."""
    model = args.model or gpu_check.make_checkpoint(workdir / "checkpoint", args.tiny)
    config = json.loads((model / "config.json").read_text())
    base = {"model": str(model), "device": args.device, "shape": shape, "calls": args.calls,
            "warmup": args.warmup, "vocab_size": config["vocab_size"],
            "deadline": time.time() + args.budget_s}  # fmt: skip
    ours = {**base, "engine": "ours", "backend": "jax", "precision": args.precision}
    return {
        "ours": gpu_check.run_engine(ours, workdir, script=Path(__file__)),
        "transformers": gpu_check.run_engine(
            {**base, "engine": "transformers"}, workdir, script=Path(__file__)
        ),
    }


def summarize_engines(
    args: argparse.Namespace, results: dict[str, dict], workdir: Path, program: str
) -> tuple[dict[str, dict], str]:
    """Both traces summarized (ours' XLA kernels named by the program's fusions), and the baseline's name."""
    baseline = BASELINE if args.device == "cuda" else f"transformers {results['transformers']['dtype']}"
    ours = trace_summary.read_trace(workdir / "ours_trace.json.gz")
    theirs = trace_summary.read_trace(workdir / "transformers_trace.json.gz")
    fusions = trace_summary.fusion_bodies(program)
    summaries = {
        f"ours jax {args.precision}": trace_summary.summarize(
            ours, args.calls, results["ours"]["wall_s"], fusions, STACK_MODULE
        ),
        baseline: trace_summary.summarize(theirs, args.calls, results["transformers"]["wall_s"]),
    }
    return summaries, baseline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    gpu_check.add_machine_arguments(parser, tiny="tiny checkpoint (a test run)")
    parser.add_argument("--precision", default="bfloat16", choices=list(gpu_check.PRECISIONS), help="ours")
    parser.add_argument("--shape", default="32x512", help="BATCHxLENGTH of the profiled calls")
    parser.add_argument("--calls", type=int, default=5, help="profiled calls per engine")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=400.0)
    parser.add_argument(
        "--out", type=Path, help="where the table, figures and traces go (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker_main(args.worker)
        return 0
    try:
        (shape,) = gpu_check.parse_shapes(args.shape)
    except (argparse.ArgumentTypeError, ValueError):
        parser.error(f"--shape is one BATCHxLENGTH, got {args.shape!r}")
    if args.calls < 1:
        parser.error(f"--calls must be at least 1, got {args.calls}")
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-profile-work-") as tmp:
        workdir = Path(tmp)
        results = profile_engines(args, shape, workdir)
        failed = {k: v["error"] for k, v in results.items() if "error" in v}
        if failed:
            print("\n".join(f"{k}: {v}" for k, v in failed.items()), file=sys.stderr)
            return 1
        program = stack_program(workdir)
        (workdir / "ours_stack_hlo.txt.gz").write_bytes(gzip.compress(program.encode()))
        summaries, baseline = summarize_engines(args, results, workdir, program)
        # one file for the three: a GPU machine hands back at most 8 files per call
        with tarfile.open(out / TRACES, "w") as bundle:
            for name in ("ours_trace.json.gz", "transformers_trace.json.gz", "ours_stack_hlo.txt.gz"):
                bundle.add(workdir / name, arcname=name)
    digest = program_digest(program)
    header = (
        f"gpu_profile: {results['transformers']['device_name']}; {'tiny' if args.tiny else 'full-size'} "
        f"random checkpoint; {shape[0]}x{shape[1]} tokens, {args.calls} profiled calls each; jax "
        f"{results['ours']['jax']}, keras {results['ours']['keras']}, "
        f"torch {results['transformers']['torch']}"
    )
    table = "\n\n".join([
        header,
        trace_summary.side_by_side(summaries, baseline),
        *(trace_summary.top_table(s, name) for name, s in summaries.items()),
        "ours' 24-layer program: " + json.dumps(digest),
    ])  # fmt: skip
    print(table)
    (out / "gpu_profile.txt").write_text(table + "\n")
    report = {"header": header, "summaries": summaries, "engines": results, "program": digest}
    (out / "gpu_profile.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
