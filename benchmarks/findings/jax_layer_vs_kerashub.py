"""One full-size encoder layer on JAX: ours (`backends.portable.kernels.block_forward`) beside KerasHub's
TransformerEncoder, same weights, same input, each under one `jax.jit`, timed call for call in turn.

    KERAS_BACKEND=jax python benchmarks/findings/jax_layer_vs_kerashub.py --batch 4 --length 768 --rounds 10

Why: `bgem3 bench` compares whole models and mixes per-layer cost with padding, dispatch and the heads. This
isolates the layer. The engines run alternately (A B A B ...) so a noisy neighbour slows all alike; the
median of each is printed with the ratio (> 1.0 means ours is faster), and the largest |difference| of the
outputs shows they compute the same thing. "ours, additive bias" is our layer with the padding added to the
scores as a float bias (what `attend` did before it passed a boolean mask). One more call of each, alone,
counts its user and system CPU seconds and its minor page faults (fresh pages the call touched).
Needs keras-hub (`pip install --no-deps keras-hub==0.32.0`), no checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import time
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "jax")

H, F, HEADS = 1024, 4096, 16


def random_weights(rng: Any) -> list[Any]:
    """One layer's 16 tensors in `block_forward`'s order, scaled like a trained model's."""
    import numpy as np

    def rand(*shape: int, scale: float = 0.02) -> Any:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return [
        rand(H, H), rand(H), rand(H, H), rand(H), rand(H, H), rand(H), rand(H, H), rand(H),
        rand(H, F), rand(F), rand(F, H), rand(H),
        1.0 + rand(H), rand(H), 1.0 + rand(H), rand(H),
    ]  # fmt: skip


def kerashub_layer(weights: list[Any]) -> tuple[Any, list[Any]]:
    """KerasHub's TransformerEncoder as XLMRobertaBackbone builds it, holding `weights`, and its variables."""
    import keras_hub

    (wq, bq, wk, bk, wv, bv, wo, bo, wi, bi, wf, bf, g1, b1, g2, b2) = weights
    d = H // HEADS
    layer = keras_hub.layers.TransformerEncoder(
        num_heads=HEADS, intermediate_dim=F, activation="gelu", layer_norm_epsilon=1e-5
    )
    layer.build((None, None, H))
    by_path = {
        "query/kernel": wq.reshape(H, HEADS, d), "query/bias": bq.reshape(HEADS, d),
        "key/kernel": wk.reshape(H, HEADS, d), "key/bias": bk.reshape(HEADS, d),
        "value/kernel": wv.reshape(H, HEADS, d), "value/bias": bv.reshape(HEADS, d),
        "attention_output/kernel": wo.reshape(HEADS, d, H), "attention_output/bias": bo,
        "self_attention_layer_norm/gamma": g1, "self_attention_layer_norm/beta": b1,
        "feedforward_intermediate_dense/kernel": wi, "feedforward_intermediate_dense/bias": bi,
        "feedforward_output_dense/kernel": wf, "feedforward_output_dense/bias": bf,
        "feedforward_layer_norm/gamma": g2, "feedforward_layer_norm/beta": b2,
    }  # fmt: skip
    for variable in layer.weights:
        key = "/".join(variable.path.split("/")[-2:])
        variable.assign(by_path[key])
    return layer, [v.value for v in layer.trainable_variables]


def cpu_and_faults(call: Any) -> tuple[float, float, int]:
    """(user s, system s, minor page faults) of one call, this process's counters before and after."""
    import jax

    before = resource.getrusage(resource.RUSAGE_SELF)
    jax.block_until_ready(call())
    after = resource.getrusage(resource.RUSAGE_SELF)
    faults = after.ru_minflt - before.ru_minflt
    return after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime, faults


@contextlib.contextmanager
def additive_bias_attention() -> Iterator[None]:
    """`backends.portable.kernels.attend` as it was: the padding added to the scores as a float32 bias."""
    from keras import ops

    import bgem3_embeddings.backends.portable.kernels as kernels

    def attend_with_bias(q: Any, k: Any, v: Any, mask_bias: Any) -> Any:
        return ops.dot_product_attention(q, k, v, bias=mask_bias, scale=1.0)

    original = kernels.attend
    kernels.attend = attend_with_bias
    try:
        yield
    finally:
        kernels.attend = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=768)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    from bgem3_embeddings.backends.portable.kernels import attention_mask_bias, block_forward

    rng = np.random.default_rng(0)
    weights = random_weights(rng)
    x = jnp.asarray(rng.standard_normal((args.batch, args.length, H)).astype(np.float32))
    mask = np.ones((args.batch, args.length), dtype=np.int32)
    mask[-1, args.length // 2 :] = 0  # one padded row, as in a real batch
    mask_bias = attention_mask_bias(jnp.asarray(mask))
    padding_mask = jnp.asarray(mask.astype(bool))

    ours_weights = [jnp.asarray(w) for w in weights]
    ours = jax.jit(lambda w, x, bias: block_forward(x, bias, w, num_heads=HEADS, epsilon=1e-5, chunk=None))
    with additive_bias_attention():  # compiled here, while the old form is in place
        ours_bias = (
            jax.jit(lambda w, x, bias: block_forward(x, bias, w, num_heads=HEADS, epsilon=1e-5, chunk=None))
            .lower(ours_weights, x, mask_bias)
            .compile()
        )
    layer, hub_values = kerashub_layer(weights)

    def hub_call(values: Any, x: Any, padding_mask: Any) -> Any:
        out, _ = layer.stateless_call(values, [], x, padding_mask=padding_mask)
        return out

    hub = jax.jit(hub_call)
    calls = {
        "ours": lambda: ours(ours_weights, x, mask_bias),
        "ours, additive bias": lambda: ours_bias(ours_weights, x, mask_bias),
        "kerashub": lambda: hub(hub_values, x, padding_mask),
    }
    outputs = {name: np.asarray(jax.block_until_ready(call())) for name, call in calls.items()}
    kept = mask.astype(bool)
    diff = max(float(np.max(np.abs(out[kept] - outputs["ours"][kept]))) for out in outputs.values())
    usage = {name: cpu_and_faults(call) for name, call in calls.items()}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            jax.block_until_ready(call())
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t) * 1000 for name, t in times.items()}
    print(f"jax {jax.__version__}, one layer, {args.batch} x {args.length}, {args.rounds} rounds")
    for name, ms in median.items():
        user, system, faults = usage[name]
        print(
            f"{name:>19}: median {ms:8.1f} ms   best {min(times[name]) * 1000:8.1f} ms   "
            f"one call: user {user:5.2f} s, system {system:5.2f} s, {faults:,} minor page faults"
        )
    print(f"ours vs KerasHub (time ratio, > 1.0: ours faster): {median['kerashub'] / median['ours']:.2f}x")
    print(f"max |difference| between the three over unpadded tokens: {diff:.2e}")


if __name__ == "__main__":
    main()
