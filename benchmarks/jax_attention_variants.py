"""Where ours on JAX spends its time on a GPU: the package's attention, XLA's, none, a half-precision stream.

A measurement for issue 42's GPU target (ours on JAX bf16 at least 1.0x transformers fp16 SDPA): one model,
one precision, rows that change one thing each:

- `package`: what the package runs (on a CUDA GPU in half precision: cuDNN's flash attention told each row's
  length, `backends.jax.kernels.flash_attend`);
- `xla`: the portable attention instead (`backends.portable.kernels.attend`: a boolean key mask, XLA forms
  the scores);
- `half-stream`: the package, with each LayerNorm's output rounded to the compute dtype, so the hidden
  state between layers is bfloat16 / float16 as in transformers' half-precision model (the LayerNorm still
  computes in float32);
- `unmasked`: cuDNN's flash attention told nothing of padding, right only where no row is padded (the
  timing batches; no parity);
- `no-attention`: the context is q + k + v, with no scores formed: the model without the attention kernel's
  cost, a ceiling for speed, not a model (no parity). The sum keeps the query and key projections in the
  program: a context of v alone left q and k unused, and XLA dropped their two GEMMs per layer as dead code
  (the `GEMMs` column counts them);
- `erfc-gelu`: the FFN's GELU as `keras.ops.gelu(approximate=False)` (jax.nn.gelu, through erfc, rounded
  between its ops in half precision), what the package ran before `backends.portable.kernels.gelu_exact`'s erf
  form.

Each row: max |ours - reference| on the gpu_check parity batch (the float32 reference is transformers'
XLMRobertaModel + heads with TF32 off, run first in a process of its own), the tolerance gpu_check uses, the
matrix multiplications in XLA's optimized 24-layer program for that batch (`trace_summary.matmul_count`: a
row that drops work shows it here), and dense-output tokens/s per shape (every call returns its vectors to
the host). One process holds the model;
`jax.clear_caches()` between rows makes each one trace again.

    python benchmarks/jax_attention_variants.py --model CHECKPOINT --out DIR          # a CUDA GPU
    python benchmarks/jax_attention_variants.py --tiny --device cpu                   # the same steps, CPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import gpu_check  # noqa: E402  (benchmarks/gpu_check.py: the batches, the timing loop, the tolerances)
import trace_summary  # noqa: E402  (benchmarks/trace_summary.py: reads XLA's optimized program)

VARIANTS = ("package", "xla", "half-stream", "unmasked", "no-attention", "erfc-gelu")
NO_PARITY = ("unmasked", "no-attention")


@contextlib.contextmanager
def variant_applied(variant: str, runner: Any, compute_dtype: str) -> Iterator[None]:
    """The runner and kernels as `variant` has them, restored afterwards; the JAX caches cleared both ways."""
    import jax
    from keras import ops

    from bgem3_embeddings.backends.jax import runner as jax_runner
    from bgem3_embeddings.backends.portable import kernels as portable_kernels

    saved = (
        runner.flash_problem,
        portable_kernels.layer_norm,
        jax_runner.flash_attend,
        portable_kernels.gelu_exact,
    )
    layer_norm = portable_kernels.layer_norm
    if variant == "xla":
        runner.flash_problem = "switched off for this row"
    elif variant == "half-stream":
        portable_kernels.layer_norm = lambda *a, **k: ops.cast(layer_norm(*a, **k), compute_dtype)
    elif variant == "no-attention":
        runner.flash_problem = None
        jax_runner.flash_attend = lambda q, k, v, key_lengths: v + q + k  # q, k kept: their GEMMs stay
    elif variant == "erfc-gelu":
        portable_kernels.gelu_exact = lambda y: ops.gelu(y, approximate=False)
    elif variant == "unmasked":
        runner.flash_problem = None
        jax_runner.flash_attend = lambda q, k, v, key_lengths: jax.nn.dot_product_attention(
            q, k, v, scale=1.0, implementation="cudnn"
        )
    jax.clear_caches()  # each row traces afresh
    try:
        yield
    finally:
        (runner.flash_problem, portable_kernels.layer_norm, jax_runner.flash_attend,
         portable_kernels.gelu_exact) = saved
        jax.clear_caches()


def reference(model: Path, device: str, precision: str, workdir: Path, budget_s: float) -> dict[str, Any]:
    """transformers at float32 and at `precision` on the parity batch, in its own process (gpu_check's)."""
    config = json.loads((model / "config.json").read_text())
    ids, mask = gpu_check.parity_batch(config["vocab_size"], 512 if device == "cuda" else 32)
    np.savez(workdir / "inputs.npz", ids=ids, mask=mask)
    inputs = str(workdir / "inputs.npz")
    spec = {"engine": "transformers", "model": str(model), "device": device, "inputs": inputs,
            "precisions": ["float32", precision], "shapes": [], "vocab_size": config["vocab_size"],
            "min_seconds": 0.0, "deadline": time.time() + budget_s}  # fmt: skip
    result = gpu_check.run_engine(spec, workdir)
    if "error" in result:
        raise SystemExit(f"the reference did not run: {result['error']}")
    refs = {p: dict(np.load(workdir / f"transformers-{p}.npz")) for p in ("float32", precision)}
    own_error = gpu_check.output_errors(refs[precision], refs["float32"], mask)
    allowed = gpu_check.tolerance(precision, gpu_check.worst_error(own_error))
    return {"ids": ids, "mask": mask, "reference": refs["float32"], "vocab_size": config["vocab_size"],
            "tolerance": allowed, "transformers_error": own_error}  # fmt: skip


def run_variants(args: argparse.Namespace, ref: dict[str, Any]) -> list[dict[str, Any]]:
    """Every variant in this process: parity on the reference's batch, then the timings."""

    from bgem3_embeddings.encoder import BGEM3Encoder

    encoder = BGEM3Encoder(str(args.model), precision=args.precision, device=args.device, weights_cache=False)
    rows = []
    for variant in args.variants:
        row: dict[str, Any] = {"variant": variant}
        with variant_applied(variant, encoder.runner, encoder.compute_dtype):
            try:
                got = encoder.run_batch(ref["ids"], ref["mask"], gpu_check.OUTPUTS)
                if variant not in NO_PARITY:
                    errors = gpu_check.output_errors(got, ref["reference"], ref["mask"])
                    row.update(errors=errors, ok=gpu_check.within(errors, ref["tolerance"]))
                program = encoder.runner.stack_program(ref["ids"], ref["mask"])
                row["matmuls"] = trace_summary.matmul_count(program)

                def dense_only(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
                    return np.asarray(encoder.run_batch(ids, mask, ("dense_vecs",))["dense_vecs"])

                row["timings"] = {
                    f"{b}x{n}": gpu_check.time_calls(
                        dense_only, *gpu_check.timing_batch(ref["vocab_size"], b, n), args.min_seconds
                    )
                    for b, n in args.shapes
                }
            except Exception as error:  # a kernel this device lacks: reported in its row, the others go on
                row["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:160]}"
        rows.append(row)
    return rows


def format_rows(rows: list[dict[str, Any]], shapes: list[str], tolerance: float | None) -> str:
    head = f"{'attention':<14} {'dense':>8} {'sparse':>8} {'colbert':>8} {'ok':>4} {'GEMMs':>6}" + "".join(
        f" {'tok/s ' + s:>16} {'1st s':>6}" for s in shapes
    )
    lines = [head]
    for row in rows:
        if "error" in row:
            lines.append(f"{row['variant']:<14} error: {row['error']}")
            continue
        errors = row.get("errors", {})
        cells = [gpu_check._e(errors.get(k)) for k in gpu_check.OUTPUTS]
        ok = {True: "ok", False: "OUT"}.get(row.get("ok"), "-")  # type: ignore[call-overload]
        line = f"{row['variant']:<14} {cells[0]:>8} {cells[1]:>8} {cells[2]:>8} {ok:>4} {row['matmuls']:>6}"
        for s in shapes:
            t = row["timings"][s]
            line += f" {t['tokens_per_s']:>16,.0f} {t['first_call_s']:>6.1f}"
        lines.append(line)
    lines.append(f"tolerance: {gpu_check._e(tolerance)}")
    return "\n".join(lines)


def measure(args: argparse.Namespace, ref: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The variants on Keras' JAX backend, in this process, with `import tensorflow` failing."""
    from tests.no_tensorflow import hide_tensorflow

    hide_tensorflow()  # as on the GPU image
    os.environ["KERAS_BACKEND"] = "jax"
    import jax
    import keras

    if keras.backend.backend() != "jax":
        raise SystemExit(f"Keras runs on {keras.backend.backend()}, not jax")
    rows = run_variants(args, ref)
    header = (f"jax_attention_variants: {jax.devices()[0].device_kind}, jax {jax.__version__}, keras "
              f"{keras.__version__}, ours at {args.precision}")  # fmt: skip
    return rows, header


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    gpu_check.add_machine_arguments(parser, worker=False)
    parser.add_argument("--precision", default="bfloat16", choices=list(gpu_check.PRECISIONS))
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), type=lambda s: [v for v in s.split(",") if v]
    )
    parser.add_argument(
        "--shapes", type=gpu_check.parse_shapes, help="BATCHxLENGTH,... (default 32x512,128x64)"
    )
    parser.add_argument("--min-seconds", type=float, default=None)
    parser.add_argument("--out", type=Path, help="where the table and the JSON go")
    args = parser.parse_args(argv)
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    args.shapes = args.shapes or list(gpu_check.TINY_SHAPES if args.tiny else gpu_check.FULL_SHAPES)
    if args.min_seconds is None:
        args.min_seconds = 0.1 if args.tiny else 1.5
    if args.device == "cpu":
        os.environ.update({"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""})
    with tempfile.TemporaryDirectory(prefix="jax-attention-") as tmp:
        workdir = Path(tmp)
        args.model = args.model or gpu_check.make_checkpoint(workdir / "checkpoint", args.tiny)
        ref = reference(args.model, args.device, args.precision, workdir, budget_s=300)
        rows, header = measure(args, ref)
    table = header + "\n" + format_rows(rows, [f"{b}x{n}" for b, n in args.shapes], ref["tolerance"])
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "jax_attention_variants.txt").write_text(table + "\n")
        report = {"header": header, "rows": rows, "transformers_error": ref["transformers_error"]}
        (args.out / "jax_attention_variants.json").write_text(json.dumps(report, indent=1))
    failed = [r for r in rows if r["variant"] == "package" and ("error" in r or r.get("ok") is False)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
