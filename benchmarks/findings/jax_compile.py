"""What jax.jit's compiles cost the JAX backend, per bucketed batch shape (docs/backends.md).

For each (batch, length) it times the first call of a new encoder's runner on that shape (compile + run)
and the median of the next `--repeat` calls (run only), and prints the difference as the compile cost,
with the number of compiled functions after each shape. Runs with KERAS_BACKEND=jax in this process.

    KERAS_BACKEND=jax python benchmarks/findings/jax_compile.py --model /tmp/full-bge-m3 \
        --shapes 1x16 8x128 32x512
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

OUTPUTS = ("dense_vecs", "sparse_weights", "colbert_vecs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a local checkpoint folder")
    parser.add_argument("--shapes", nargs="+", default=["1x16", "8x128", "32x512"], help="BATCHxLENGTH")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--precision", default="float32")
    args = parser.parse_args()
    os.environ.setdefault("KERAS_BACKEND", "jax")
    from bgem3_embeddings import BGEM3Encoder

    encoder = BGEM3Encoder(args.model, precision=args.precision, device="cpu")
    backend = encoder.runner.__class__.__name__
    print(f"runner {backend}, precision {args.precision}")
    print(f"{'shape':>8} {'first call s':>13} {'steady s':>9} {'compile s':>10} {'compiled fns':>13}")
    rng = np.random.default_rng(0)
    for shape in args.shapes:
        batch, length = (int(n) for n in shape.split("x"))
        ids = rng.integers(5, encoder.config.vocab_size, size=(batch, length)).astype(np.int32)
        ids[:, 0], ids[:, -1] = 0, 2
        mask = np.ones_like(ids)
        start = time.perf_counter()
        encoder.run_batch(ids, mask, OUTPUTS)
        first = time.perf_counter() - start
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            encoder.run_batch(ids, mask, OUTPUTS)
            times.append(time.perf_counter() - start)
        steady = statistics.median(times)
        print(f"{shape:>8} {first:13.2f} {steady:9.2f} {first - steady:10.2f} {encoder.trace_count():13d}")


if __name__ == "__main__":
    main()
