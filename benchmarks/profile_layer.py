"""Time of each piece of one full-size BGE-M3 encoder layer (random weights), with the model's own functions.

    python benchmarks/profile_layer.py --batch 8 --length 992
    TF_ENABLE_ONEDNN_OPTS=0 python benchmarks/profile_layer.py --batch 8 --length 992   # Eigen kernels

Each piece (the q/k/v projections, attention scores, softmax, FFN, ...) runs as its own tf.function on
fixed inputs; the best of `--repeats` runs is printed in ms, then the whole layer (`block_forward`, as the
encoder runs it). Needs no checkpoint. Import order matters: bgem3_embeddings is imported first so that its
oneDNN default applies (bgem3_embeddings/backends/tensorflow/onednn.py).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import bgem3_embeddings  # noqa: F401  - before TensorFlow: sets the oneDNN default
from bgem3_embeddings.backends.tensorflow.onednn import onednn_enabled

H, F, HEADS = 1024, 4096, 16


def best_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Best wall time of `fn` as a tf.function, after two warm-up calls, in milliseconds."""
    import tensorflow as tf

    traced = tf.function(fn, autograph=False)
    traced()
    traced()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        tf.nest.map_structure(lambda t: t.numpy(), traced())
        best = min(best, time.perf_counter() - start)
    return best * 1000


def pieces(batch: int, length: int) -> dict[str, Callable[[], Any]]:
    """name -> a function of one layer's piece on random full-size weights and inputs."""
    import numpy as np
    import tensorflow as tf

    from bgem3_embeddings.backends.tensorflow.kernels import _split_heads, block_forward
    from bgem3_embeddings.backends.tensorflow.kernels import attend as _attend
    from bgem3_embeddings.backends.tensorflow.kernels import dense as _dense
    from bgem3_embeddings.backends.tensorflow.kernels import layer_norm as _layer_norm

    rng = np.random.default_rng(0)

    def rand(*shape: int, scale: float = 0.02) -> Any:
        return tf.constant(rng.standard_normal(shape, dtype=np.float32) * scale)

    shapes = [(H, H), (H,), (H, H), (H,), (H, H), (H,), (H, H), (H,), (H, F), (F,), (F, H), (H,)]
    weights = [rand(*shape) for shape in shapes] + [rand(H, scale=1.0), rand(H), rand(H, scale=1.0), rand(H)]
    wq, bq, wk, bk, wv, bv, wo, bo, wi, bi, wf, bf, g1, b1, _, _ = weights
    x = rand(batch * length, H, scale=1.0)  # (tokens, H)
    mask_bias = tf.zeros((batch, 1, 1, length))
    q, k, v = (_split_heads(_dense(x, w, b), batch, length, HEADS) for w, b in ((wq, bq), (wk, bk), (wv, bv)))
    scores = tf.matmul(q, k, transpose_b=True)  # (b, h, s, s)
    probs = tf.nn.softmax(scores, axis=-1)
    context = tf.matmul(probs, v)  # (b, h, s, d)
    hidden = _dense(x, wi, bi, gelu=True)  # (tokens, F)
    stream = tf.reshape(x, (batch, length, H))
    return {
        "q, k, v Dense": lambda: [_dense(x, w, b) for w, b in ((wq, bq), (wk, bk), (wv, bv))],
        "split heads (x3)": lambda: [_split_heads(x, batch, length, HEADS) for _ in range(3)],
        "scores q k^T": lambda: tf.matmul(q, k, transpose_b=True),
        "scale + mask + softmax": lambda: tf.nn.softmax(scores * 0.125 + mask_bias, axis=-1),
        "probs @ v": lambda: tf.matmul(probs, v),
        "attention (all of the above after q, k, v)": lambda: _attend(q, k, v, mask_bias),
        "merge heads": lambda: tf.reshape(tf.transpose(context, (0, 2, 1, 3)), (-1, H)),
        "attention output Dense": lambda: _dense(x, wo, bo),
        "residual + LayerNorm": lambda: _layer_norm(x + x, g1, b1, 1e-5),
        "FFN in + exact GELU": lambda: _dense(x, wi, bi, gelu=True),
        "FFN out": lambda: _dense(hidden, wf, bf),
        "WHOLE LAYER (block_forward)": lambda: block_forward(
            stream, mask_bias, weights, num_heads=HEADS, epsilon=1e-5, chunk=None
        ),
    }


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=992)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(
        f"one layer at ({args.batch} x {args.length}) tokens, oneDNN {onednn_enabled()}, "
        f"best of {args.repeats}"
    )
    times = {}
    for name, fn in pieces(args.batch, args.length).items():
        times[name] = best_ms(fn, args.repeats)
        print(f"  {name:44s} {times[name]:8.1f} ms", flush=True)
    return times


if __name__ == "__main__":
    main()
