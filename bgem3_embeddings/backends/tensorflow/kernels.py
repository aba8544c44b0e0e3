"""The TensorFlow fast path of the network's math: raw TensorFlow ops where they measurably pay.

The portable twin is `backends/portable/kernels.py` (keras.ops, every backend); `backends.backend_kernels()`
picks one of the two in one place. Every function here has the same name, arguments and result as its twin
there, and the same parity tests run on both (tests/test_backends.py).

What pays on TensorFlow, measured on a 2-vCPU AMD EPYC with oneDNN (docs/performance.md):
- Dense layers as a 2-D MatMul + BiasAdd (+ GELU): the pattern the oneDNN remapper fuses into one kernel
  (the FFN of one layer, 8 x 992 tokens: 270 ms fused against 369 ms).
- One `block_forward` traced once for all 24 layers (start-up), on a flattened (b * s, H) stream.
- `tf.gather(..., batch_dims=1)`: one TFLite builtin (GATHER), so the int8 / TFLite exports run builtins only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import tensorflow as tf


def gelu_exact(y: Any) -> Any:
    """The exact (erf) GELU, 0.5 y (1 + erf(y / sqrt 2)), as torch computes it.

    Written out rather than tf.nn.gelu(approximate=False), which TensorFlow 2.21 builds from Erfc: the Apple
    GPU backend (tensorflow-metal-plugin) has a Metal Erf kernel and no Erfc, so the FFN's largest
    elementwise op would run on the CPU. TensorFlow's oneDNN remapper fuses this form with the preceding
    MatMul + BiasAdd exactly as it fuses tf.nn.gelu (the same fused kernel: bit-identical outputs).
    """
    return 0.5 * y * (1.0 + tf.math.erf(y * 0.7071067811865476))


def dense(x: Any, kernel: Any, bias: Any, gelu: bool = False) -> Any:
    """(tokens, in) @ kernel + bias (+ exact erf GELU): the MatMul + BiasAdd (+ Gelu) pattern oneDNN fuses."""
    if x.dtype != kernel.dtype:
        x = tf.cast(x, kernel.dtype)
    y = tf.nn.bias_add(tf.matmul(x, kernel), bias)
    return gelu_exact(y) if gelu else y


def dense_nd(x: Any, kernel: Any, bias: Any, gelu: bool = False) -> Any:
    """`dense` on (..., in): flattened to 2-D (the fused pattern), then the leading axes restored."""
    x = tf.convert_to_tensor(x)
    if x.shape.rank == 2:
        return dense(x, kernel, bias, gelu)
    lead = tf.shape(x)[:-1]
    y = dense(tf.reshape(x, (-1, x.shape[-1])), kernel, bias, gelu)
    return tf.reshape(y, tf.concat([lead, [kernel.shape[-1]]], axis=0))


def as_float32(x: Any) -> Any:
    return x if x.dtype == tf.float32 else tf.cast(x, tf.float32)


def to_dtype(value: Any, dtype: str) -> Any:
    """A variable's value (or a tensor) as a tensor of `dtype`: no copy when it already is one."""
    tensor = tf.convert_to_tensor(value)
    wanted = tf.as_dtype(dtype)
    return tensor if tensor.dtype == wanted else tf.cast(tensor, wanted)


def layer_norm(x: Any, gamma: Any, beta: Any, epsilon: float) -> Any:
    """LayerNorm over the last axis in float32, as keras.ops.layer_normalization computes it."""
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    inv = tf.math.rsqrt(variance + epsilon) * gamma
    return x * inv + (beta - mean * inv)


def attend(q: Any, k: Any, v: Any, mask_bias: Any) -> Any:
    """softmax(q k^T + mask) v, q already scaled by 1/sqrt(d); softmax in float32 whatever the compute dtype.

    Scaling q (b, h, s, d) instead of the scores (b, h, s, s) saves one pass over the largest tensor of the
    layer: 541 -> 502 ms for the attention of one layer at (8 x 992) tokens on a 2-vCPU EPYC with oneDNN.
    With BGE-M3's head_dim 64 the scale is 1/8, a power of two, so both orders give the same bits.
    """
    scores = tf.matmul(q, k, transpose_b=True)  # (b, h, sq, s); no separate transpose of k
    if scores.dtype != tf.float32:
        scores = tf.cast(scores, tf.float32)
    if mask_bias.dtype != tf.float32:
        mask_bias = tf.cast(mask_bias, tf.float32)
    probs = tf.nn.softmax(scores + mask_bias, axis=-1)
    if probs.dtype != v.dtype:
        probs = tf.cast(probs, v.dtype)
    return tf.matmul(probs, v)  # (b, h, sq, d)


def _split_heads(x: Any, b: Any, s: Any, num_heads: int) -> Any:
    """(b * s, H) -> (b, h, s, d)."""
    return tf.transpose(tf.reshape(x, (b, s, num_heads, x.shape[-1] // num_heads)), (0, 2, 1, 3))


def block_forward(
    x: Any, mask_bias: Any, weights: Sequence[Any], *, num_heads: int, epsilon: float, chunk: int | None
) -> Any:
    """One post-LN encoder layer on tensors: self-attention + residual + LN, erf-GELU FFN + residual + LN.

    A function of its weights (TransformerBlock.weight_tensors order) rather than of a layer, so a traced
    encoder can call one tf.function of it for all 24 layers: traced once per process instead of 24 times
    (start-up). Written in raw TensorFlow ops on a flattened (b * s, H) stream: fewer graph nodes.
    """
    (wq, bq, wk, bk, wv, bv, wo, bo, wi, bi, wf, bf, g1, b1, g2, b2) = weights
    x = tf.convert_to_tensor(x)
    shape = tf.shape(x)
    b, s, H = shape[0], shape[1], x.shape[-1]
    x = tf.reshape(x, (-1, H))
    # Scaled before the scores are formed (see attend): (b * s, H) is 1/s the size of (b, h, s, s).
    q = _split_heads(dense(x, wq, bq) * (1.0 / math.sqrt(H // num_heads)), b, s, num_heads)
    k = _split_heads(dense(x, wk, bk), b, s, num_heads)
    v = _split_heads(dense(x, wv, bv), b, s, num_heads)
    if chunk:
        from bgem3_embeddings.backends.tensorflow.long_attention import chunked_attention

        context = chunked_attention(attend, q, k, v, mask_bias, chunk)
    else:
        context = attend(q, k, v, mask_bias)
    context = tf.reshape(tf.transpose(context, (0, 2, 1, 3)), (-1, H))
    # Residual adds and LayerNorm in float32 (x is float32; the Dense outputs are in the compute dtype).
    x = layer_norm(x + as_float32(dense(context, wo, bo)), g1, b1, epsilon)
    ffn = dense(dense(x, wi, bi, gelu=True), wf, bf)
    x = layer_norm(x + as_float32(ffn), g2, b2, epsilon)
    return tf.reshape(x, shape)


def gather_rows(x: Any, positions: Any) -> Any:
    """x[b, positions[b, j]] for every row b: (b, s, ...) and (b, k) -> (b, k, ...); (b,) -> (b, ...).

    tf.gather with batch_dims, a single TFLite builtin (GATHER); keras.ops.take_along_axis adds index
    wrapping with BitwiseAnd, which TFLite can only run as a Flex op.
    """
    return tf.gather(x, tf.cast(positions, tf.int32), axis=1, batch_dims=1)


def embedding_lookup(table_variable: Any, ids: Any, compute_dtype: str, from_variable: bool = True) -> Any:
    """Rows `ids` of an Embedding table, in `compute_dtype`.

    Which read is free depends on how the variable was filled (TensorFlow's copy-on-read rule for
    variables that see sparse access):
    - from_variable=True: a ResourceGather straight from the variable. Right after porting, which writes
      the big tables in row blocks and so leaves them in copy-on-read mode: there a whole-variable read
      (Keras' Embedding.call) copied the 1 GB word table on every call, ~1 s per batch on a 2-core EPYC,
      against 0.6 ms for the gather.
    - from_variable=False: read the variable, then gather. Right for a table initialised whole from the
      memory-mapped weights cache: the read shares the mapped buffer, while a ResourceGather would first
      copy the whole table into TensorFlow's memory (0.4 s and +1 GB on the first call, measured).
    """
    table = table_variable.value
    rows = tf.gather(table if from_variable else tf.convert_to_tensor(table), ids)
    return to_dtype(rows, compute_dtype)


def embedding_row(table_variable: Any, index: int, compute_dtype: str) -> Any:
    """Row `index` of an Embedding table as a (1, H) tensor in `compute_dtype`: a slice of the table read (no
    index tensor: nothing to compute on the host)."""
    return to_dtype(tf.convert_to_tensor(table_variable.value)[index : index + 1], compute_dtype)
