"""PyTorch's GEMM on this CPU, two ways: torch.addmm (MKL for float32 on x86-64) and oneDNN's fused linear
(`bgem3_embeddings.backends.torch.kernels.dense`, what the PyTorch runner takes on an x86-64 CPU), side by
side; `--dtype bfloat16` for bf16 (where both are oneDNN GEMMs and the difference is the fused GELU).

BGE-M3's projection shapes, (tokens, 1024) @ (1024, 1024 or 4096) + bias, and the FFN's with its exact GELU
(addmm then torch's GELU; oneDNN: one fused call). Per row: GFLOP/s, best of --repeats after a warm-up,
oneDNN / addmm, and the largest difference from float64 numpy (on the same inputs) over the largest output.

    python benchmarks/findings/torch_onednn_linear.py                  # 2048 tokens
    python benchmarks/findings/torch_onednn_linear.py --tokens 16 64   # a query, a short batch
    python benchmarks/findings/torch_onednn_linear.py --dtype bfloat16
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SHAPES = (("q/k/v/out 1024 -> 1024", 1024, 1024, False), ("FFN in 1024 -> 4096 + GELU", 1024, 4096, True),
          ("FFN out 4096 -> 1024", 4096, 1024, False))  # fmt: skip


def best_s(call: Callable[[], Any], repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args(argv)
    import torch

    from bgem3_embeddings.backends.torch.kernels import dense, onednn_linear_problem

    problem = onednn_linear_problem("cpu", args.dtype)
    dtype = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs; "
          f"oneDNN linear: {problem or 'taken by the PyTorch runner here'}")  # fmt: skip
    print(f"{'shape':<28} {'tokens':>6} {'addmm GFLOP/s':>14} {'oneDNN GFLOP/s':>15} {'x':>6} "
          f"{'err addmm':>9} {'err oneDNN':>10}")  # fmt: skip
    rng = np.random.default_rng(0)
    for tokens in args.tokens:
        for label, n_in, n_out, gelu in SHAPES:
            arrays = (rng.normal(size=(tokens, n_in)), rng.normal(size=(n_in, n_out)) / math.sqrt(n_in),
                      rng.normal(size=n_out))  # fmt: skip
            xt, kt, bt = (torch.from_numpy(a.astype(np.float32)).to(dtype) for a in arrays)
            x, kernel, bias = (t.double().numpy() for t in (xt, kt, bt))  # the inputs as the GEMMs get them
            want = x @ kernel + bias
            if gelu:
                want = 0.5 * want * (1.0 + np.vectorize(math.erf)(want / math.sqrt(2.0)))

            def addmm(xt: Any = xt, kt: Any = kt, bt: Any = bt, gelu: bool = gelu) -> Any:
                y = torch.addmm(bt, xt, kt)
                return torch.nn.functional.gelu(y) if gelu else y

            def onednn(xt: Any = xt, kt: Any = kt, bt: Any = bt, gelu: bool = gelu) -> Any:
                return dense(xt, kt, bt, gelu=gelu)

            flop = 2.0 * tokens * n_in * n_out
            with torch.inference_mode():
                rates = [flop / best_s(f, args.repeats) / 1e9 for f in (addmm, onednn)]
                errors = [
                    float(np.abs(f().double().numpy() - want).max() / np.abs(want).max())
                    for f in (addmm, onednn)
                ]
            speedup = rates[1] / rates[0]
            print(f"{label:<28} {tokens:>6} {rates[0]:>14,.0f} {rates[1]:>15,.0f} {speedup:>5.2f}x "
                  f"{errors[0]:>9.1e} {errors[1]:>10.1e}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
