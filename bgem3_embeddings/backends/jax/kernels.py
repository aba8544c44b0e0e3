"""JAX's fast path beside its portable twin: cuDNN's flash attention on a CUDA GPU, told each row's length.

`backends.portable.kernels.attend` masks padded keys with a boolean mask and runs in XLA, which forms the
(b, h, s, s) scores in memory. cuDNN's fused attention never forms them, and told how many real tokens each
row holds (right padding: the real tokens first) needs no mask at all. On an NVIDIA H200, ours on JAX at
bfloat16, 32 x 512 tokens: 545k tokens/s with it against 397k with XLA's attention, outputs as close to
the float32 reference (benchmarks/jax_attention_variants.py; docs/performance.md).

Where it runs is decided once, in the JAX runner (`backends/jax/runner.py`): a CUDA device, half precision
(cuDNN's flash attention takes bfloat16 and float16), a batch whose rows are right-padded, and a length
below the long-input chunking threshold. Anything else takes the portable attention.

    >>> right_padded_lengths(np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]]))
    array([2, 1, 1], dtype=int32)
    >>> right_padded_lengths(np.array([[0, 1, 1]])) is None
    True
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

FLASH_DTYPES = ("bfloat16", "float16")


def flash_attend(q: Any, k: Any, v: Any, key_lengths: Any) -> Any:
    """softmax(q k^T) v over each row's first `key_lengths[b]` keys, on (b, s, h, d), q already scaled."""
    return jax.nn.dot_product_attention(
        q, k, v, scale=1.0, key_value_seq_lengths=key_lengths, implementation="cudnn"
    )


def right_padded_lengths(attention_mask: np.ndarray) -> np.ndarray | None:
    """Each row's count of real tokens when every row holds its real tokens first, else None.

    An all-padding row (the runner rounds the batch up to a power of two) counts as 1: cuDNN is never asked
    to attend over no key at all, and that row's outputs are cut away before anyone sees them.
    """
    mask = np.asarray(attention_mask) != 0
    if mask.ndim != 2 or np.any(mask[:, 1:] & ~mask[:, :-1]):
        return None
    return np.maximum(mask.sum(axis=1), 1).astype(np.int32)


def flash_attention_problem(device_kind: str, compute_dtype: str) -> str | None:
    """None where `flash_attend` compiles for this device and dtype; else why it does not, in a few words.

    Compiles one small call on the device: a GPU older than cuDNN's flash kernels, or a JAX built without
    cuDNN, says so here, once, rather than at the first batch.
    """
    if device_kind != "cuda":
        return f"the device is {device_kind}, not a CUDA GPU"
    if compute_dtype not in FLASH_DTYPES:
        return f"compute dtype {compute_dtype} (cuDNN's flash attention takes {' or '.join(FLASH_DTYPES)})"
    q = jnp.zeros((2, 64, 2, 64), compute_dtype)
    try:
        jax.jit(flash_attend).lower(q, q, q, jnp.array([64, 3], jnp.int32)).compile()
    except Exception as error:  # cuDNN missing or too old, a GPU before Ampere: JAX raises several types
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return f"cuDNN's flash attention does not compile here ({first_line[:200]})"
    return None
