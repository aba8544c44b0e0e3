"""One full-size encoder layer on Keras' PyTorch backend: eager (what `backends/torch/runner.py` runs) beside
`torch.compile` of the same `backends.portable.kernels.block_forward`, same weights, same input, timed in
turn.

    KERAS_BACKEND=torch python benchmarks/findings/torch_compile_layer.py --batch 4 --length 768 --rounds 6

Why: issue 42 asks for `torch.compile` where it pays. This times it on one layer before any runner takes
it: the compile's own cost (first call), then eager and compiled calls alternately (A B A B ..., so a noisy
neighbour slows both alike), the median of each, the ratio (> 1.0: compiled faster) and the largest
|difference| of the outputs over the unpadded tokens. `--dynamic` compiles once for every shape (else each
new shape recompiles, as a JAX shape does). No checkpoint needed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

from jax_layer_vs_kerashub import HEADS, H, random_weights  # noqa: E402  (a sibling script)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=768)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--mode", default="default", help="torch.compile mode (default, max-autotune, ...)")
    parser.add_argument("--dynamic", action="store_true", help="one compiled graph for every shape")
    args = parser.parse_args()

    import keras
    import numpy as np
    import torch

    from bgem3_embeddings.backends.portable.kernels import attention_mask_bias, block_forward

    if keras.backend.backend() != "torch":
        raise SystemExit(f"error: run with KERAS_BACKEND=torch (this process runs {keras.backend.backend()})")
    rng = np.random.default_rng(0)
    weights = [torch.from_numpy(w) for w in random_weights(rng)]
    x = torch.from_numpy(rng.standard_normal((args.batch, args.length, H)).astype(np.float32))
    mask = np.ones((args.batch, args.length), dtype=np.int32)
    mask[-1, args.length // 2 :] = 0  # one padded row, as in a real batch
    mask_bias = attention_mask_bias(torch.from_numpy(mask))

    def layer(x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        return block_forward(x, mask_bias, weights, num_heads=HEADS, epsilon=1e-5, chunk=None)

    compiled = torch.compile(layer, mode=args.mode, dynamic=args.dynamic)
    calls = {"eager": layer, "torch.compile": compiled}
    with torch.inference_mode(), keras.device("cpu"):
        start = time.perf_counter()
        first = {"torch.compile": np.asarray(compiled(x, mask_bias))}
        compile_s = time.perf_counter() - start
        first["eager"] = np.asarray(layer(x, mask_bias))
        times: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                start = time.perf_counter()
                call(x, mask_bias)
                times[name].append(time.perf_counter() - start)
    kept = mask.astype(bool)
    diff = float(np.max(np.abs(first["eager"][kept] - first["torch.compile"][kept])))
    median = {name: statistics.median(t) * 1000 for name, t in times.items()}
    print(
        f"torch {torch.__version__}, keras {keras.__version__}, one layer, {args.batch} x {args.length}, "
        f"{args.rounds} rounds, mode {args.mode}, dynamic {args.dynamic}, {torch.get_num_threads()} threads"
    )
    print(f"torch.compile's first call (compiling): {compile_s:.1f} s")
    for name, ms in median.items():
        print(f"{name:>14}: median {ms:8.1f} ms   best {min(times[name]) * 1000:8.1f} ms")
    ratio = median["eager"] / median["torch.compile"]
    print(f"torch.compile vs eager (time ratio, > 1.0: compiled faster): {ratio:.2f}x")
    print(f"max |difference| over unpadded tokens: {diff:.2e}")


if __name__ == "__main__":
    main()
