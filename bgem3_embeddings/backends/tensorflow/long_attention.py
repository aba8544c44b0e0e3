"""Attention over long inputs with bounded memory: queries are processed `chunk` rows at a time.

Full attention on an 8192-token passage materialises a (heads, 8192, 8192) float32 score tensor per text
(4.3 GB for BGE-M3). Each query row's softmax only needs its own scores, so computing queries in chunks
gives exactly the same result while holding only (heads, chunk, 8192) at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

AttendFn = Callable[[Any, Any, Any, Any], Any]


def chunked_attention(attend: AttendFn, q: Any, k: Any, v: Any, mask_bias: Any, chunk: int) -> Any:
    """Apply `attend(q_chunk, k, v, mask_bias)` to query chunks of length `chunk`; concatenate the results.

    q, k, v: (b, h, s, d). Works with a dynamic sequence length inside a tf.function: queries are padded to
    a multiple of `chunk` (the padded rows are computed and dropped; keys are never padded).
    """
    if chunk <= 0:
        raise ValueError(f"query chunk size must be positive, got {chunk}")
    b, h, s, d = tf.unstack(tf.shape(q))
    n_chunks = (s + chunk - 1) // chunk
    q_padded = tf.pad(q, [[0, 0], [0, 0], [0, n_chunks * chunk - s], [0, 0]])
    # (n, b, h, chunk, d): map over the leading axis, one chunk at a time.
    q_chunks = tf.transpose(tf.reshape(q_padded, (b, h, n_chunks, chunk, d)), (2, 0, 1, 3, 4))
    out = tf.map_fn(
        lambda qc: attend(qc, k, v, mask_bias),
        q_chunks,
        fn_output_signature=tf.TensorSpec(shape=(None, None, chunk, None), dtype=v.dtype),
        # Sequential on purpose: parallel iterations would hold several score chunks at once.
        parallel_iterations=1,
    )  # (n, b, h, chunk, d)
    out = tf.reshape(tf.transpose(out, (1, 2, 0, 3, 4)), (b, h, n_chunks * chunk, d))
    return out[:, :, :s]
