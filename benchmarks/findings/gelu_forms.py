"""The FFN's exact GELU on Keras' JAX backend: keras.ops.gelu (jax.nn.gelu, through erfc) beside the erf form
the package runs (`backends.portable.kernels.gelu_exact`), timed side by side on one device.

Per dtype: milliseconds per call on a (tokens, 4096) array (BGE-M3's FFN width), best of --repeats after a
warm-up, the ratio, and the ops XLA's optimized program holds for each form (exponentials, divisions, erf,
selects): what each element costs. The values against torch.nn.functional.gelu are tests/test_gelu_form.py's.

    KERAS_BACKEND=jax python benchmarks/findings/gelu_forms.py           # this machine's default device
    KERAS_BACKEND=jax python benchmarks/findings/gelu_forms.py --tokens 16384 --out DIR   # 32 x 512, a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for path in (
    ROOT,
    ROOT / "benchmarks",
):  # the checkout's package, as on a GPU machine where nothing is installed
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import trace_summary  # noqa: E402  (benchmarks/trace_summary.py: HLO's opcodes)

OPS = ("exponential", "divide", "erf", "select")
WIDTH = 4096  # BGE-M3's intermediate size


def op_counts(compiled_text: str) -> dict[str, int]:
    """How many of OPS an optimized HLO module holds (its instructions' opcodes, trace_summary.opcodes)."""
    found = trace_summary.opcodes(compiled_text)
    return {name: found.count(name) for name in OPS}


def best_ms(function: Callable[[Any], Any], x: Any, repeats: int) -> float:
    """Best wall time of one call, in milliseconds, the result waited for."""
    function(x).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048, help="rows of the (tokens, 4096) array")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, help="where gelu_forms.json goes")
    args = parser.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax
    import keras
    from keras import ops

    from bgem3_embeddings.backends.portable.kernels import gelu_exact

    if keras.backend.backend() != "jax":
        raise SystemExit(f"Keras runs on {keras.backend.backend()}: set KERAS_BACKEND=jax")
    forms = {"keras.ops.gelu": lambda y: ops.gelu(y, approximate=False), "package (erf)": gelu_exact}
    device = jax.devices()[0]
    rows = []
    for dtype in ("float32", "bfloat16"):
        x = jax.random.normal(jax.random.PRNGKey(0), (args.tokens, WIDTH), dtype) * 3
        row: dict[str, Any] = {"dtype": dtype}
        for name, form in forms.items():
            jitted = jax.jit(form)
            row[name] = {"ms": best_ms(jitted, x, args.repeats),
                         "ops": op_counts(jitted.lower(x).compile().as_text())}  # fmt: skip
        rows.append(row)
    names = list(forms)
    print(f"gelu_forms: {device.device_kind} ({device.platform}), jax {jax.__version__}, "
          f"({args.tokens}, {WIDTH}) array, best of {args.repeats}")  # fmt: skip
    print(f"{'dtype':<9} {'form':<16} {'ms':>8} {'x':>6}  ops in XLA's program")
    for row in rows:
        base = row[names[0]]["ms"]
        for name in names:
            ops_text = ", ".join(f"{k} {v}" for k, v in row[name]["ops"].items())
            ratio = base / row[name]["ms"]
            print(f"{row['dtype']:<9} {name:<16} {row[name]['ms']:>8.2f} {ratio:>5.2f}x  {ops_text}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        report = {"device": device.device_kind, "jax": jax.__version__, "tokens": args.tokens, "rows": rows}
        (args.out / "gelu_forms.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
