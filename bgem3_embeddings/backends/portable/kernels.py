"""The network's math in keras.ops: one implementation for TensorFlow, JAX and PyTorch.

`backends.backend_kernels()` picks this module on JAX and PyTorch, and its TensorFlow twin
(`backends/tensorflow/kernels.py`, raw TensorFlow ops oneDNN fuses) on TensorFlow. Both hold the same
functions with the same arguments; the parity tests run each backend against the reference
(tests/test_backends.py).

Shapes: b = batch, s = sequence length, h = heads, d = head dim, H = hidden size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from keras import ops
from keras.src.backend import standardize_dtype

from bgem3_embeddings.backends.keras_backend import backend_name

SQRT_HALF = 0.7071067811865476  # 1 / sqrt(2)
# Additive mask value for padded keys. Large but finite so that fp16/bf16 stay finite after scaling;
# exp() of it underflows to exactly 0, so masked keys get exactly zero weight as in the reference.
MASK_NEGATIVE = -1e9


def dtype_of(x: Any) -> str:
    return standardize_dtype(x.dtype)


def to_dtype(value: Any, dtype: str) -> Any:
    """A variable's value (or a tensor) as a tensor of `dtype`: no copy when it already is one."""
    tensor = ops.convert_to_tensor(value)
    return tensor if dtype_of(tensor) == dtype else ops.cast(tensor, dtype)


def as_float32(x: Any) -> Any:
    return to_dtype(x, "float32")


def attention_mask_bias(attention_mask: Any) -> Any:
    """(b, s) 0/1 mask -> (b, 1, 1, s) float32 additive bias: 0 for real tokens, MASK_NEGATIVE for pads.

    The same on every backend (the model and the JAX runner call it; TensorFlow's attention adds it)."""
    mask = ops.cast(attention_mask, "float32")
    return ops.reshape((1.0 - mask) * MASK_NEGATIVE, (ops.shape(mask)[0], 1, 1, ops.shape(mask)[1]))


def gelu_exact(y: Any) -> Any:
    """The exact GELU, 0.5 y (1 + erf(y / sqrt 2)) computed in float32 and rounded once to y's dtype: torch's
    nn.GELU() formula and its half-precision semantics (keras.ops.gelu defaults to the tanh form).

    On PyTorch, `ops.gelu(approximate=False)` is exactly that, one native kernel. On JAX it is
    `jax.nn.gelu`, which goes through erfc, and XLA expands erfc into two polynomials, an exponential and two
    divisions per element, both branches computed; erf is one rational approximation (XLA's optimized HLO,
    shown by tests/test_gelu_form.py). This form is what `backends.tensorflow.kernels.gelu_exact` writes on
    TensorFlow too.
    """
    if backend_name() == "torch":
        return ops.gelu(y, approximate=False)
    dtype = dtype_of(y)
    y32 = as_float32(y)
    return to_dtype(0.5 * y32 * (1.0 + ops.erf(y32 * SQRT_HALF)), dtype)


def dense(x: Any, kernel: Any, bias: Any, gelu: bool = False) -> Any:
    """x @ kernel + bias (+ exact erf GELU), in the kernel's dtype."""
    x = to_dtype(x, dtype_of(kernel))
    y = ops.add(ops.matmul(x, kernel), bias)
    return gelu_exact(y) if gelu else y


def dense_nd(x: Any, kernel: Any, bias: Any, gelu: bool = False) -> Any:
    """`dense` on (..., in): matmul broadcasts over the leading axes."""
    return dense(x, kernel, bias, gelu)


def layer_norm(x: Any, gamma: Any, beta: Any, epsilon: float) -> Any:
    """LayerNorm over the last axis in float32: keras.ops.layer_normalization, PyTorch's fused layer_norm on
    that backend (9x the five-op form on a 1024 x 1024 block, 2-vCPU EPYC)."""
    return ops.layer_normalization(x, gamma, beta, axis=-1, epsilon=epsilon)


def attend(q: Any, k: Any, v: Any, mask_bias: Any) -> Any:
    """softmax(q k^T + mask) v on (batch, tokens, heads, head dim) tensors, q already scaled by 1/sqrt(d).

    keras.ops.dot_product_attention: PyTorch's scaled_dot_product_attention (a fused kernel on the CPU and
    flash attention on a CUDA GPU; 10x the explicit softmax(q k^T) v on a 2-vCPU EPYC at 32 x 512 tokens),
    JAX's dot_product_attention. The same parity tests hold it to the reference.

    The padding goes in as a boolean mask of the keys (`mask_bias` is 0 where a key is kept), not as the
    additive bias: each backend then masks with the most negative number its dtype holds (half precision
    included). On JAX's CPU backend one full-size layer at 4 x 768 tokens then touches 40k fewer fresh
    pages per call (130k where the bias took 170k: about one 4 x 16 x 768 x 768 float32 score tensor) for
    bit-identical outputs (benchmarks/findings/jax_layer_vs_kerashub.py; docs/performance.md).

    `flash_attention=False`: on JAX, Keras' own flash route hands this (b, 1, 1, s) mask to cuDNN, which wants
    a bias as long as the queries, logs an ERROR traceback at every trace and falls back to XLA (seen on an
    NVIDIA H200, jax 0.11.2, keras 3.15.1); on PyTorch, False is what Keras picks anyway once a mask is given.
    JAX's cuDNN flash attention runs through `backends.jax.kernels.flash_attend` instead, chosen by the JAX
    runner.
    """
    keep = ops.equal(mask_bias, 0.0)
    return ops.dot_product_attention(q, k, v, mask=keep, scale=1.0, flash_attention=False)


def chunked_attention(q: Any, k: Any, v: Any, mask_bias: Any, chunk: int) -> Any:
    """`attend` `chunk` query rows at a time: the same result, holding (b, h, chunk, s) scores at once.

    Shapes are concrete on JAX (under jit) and PyTorch (eager), so this is a plain loop over the chunks.
    """
    if chunk <= 0:
        raise ValueError(f"query chunk size must be positive, got {chunk}")
    length = int(q.shape[1])
    if length <= chunk:
        return attend(q, k, v, mask_bias)
    parts = [attend(q[:, start : start + chunk], k, v, mask_bias) for start in range(0, length, chunk)]
    return ops.concatenate(parts, axis=1)


def block_forward(
    x: Any,
    mask_bias: Any,
    weights: Sequence[Any],
    *,
    num_heads: int,
    epsilon: float,
    chunk: int | None,
    attention: Callable[[Any, Any, Any], Any] | None = None,
) -> Any:
    """One post-LN encoder layer: self-attention + residual + LN, erf-GELU FFN + residual + LN.

    x (b, s, H) float32, mask_bias (b, 1, 1, s) float32; weights in TransformerBlock.weight_tensors order.
    Heads stay in the (b, s, h, d) layout dot_product_attention takes: reshapes only, no transposes.
    `attention(q, k, v)`, where given, replaces `attend` with the padding already bound to it (JAX's cuDNN
    flash attention told each row's length: backends/jax/kernels.py); `mask_bias` then only serves the
    default. The PyTorch runner runs this math as `backends.torch.kernels.block_forward`, in torch ops.
    """
    (wq, bq, wk, bk, wv, bv, wo, bo, wi, bi, wf, bf, g1, b1, g2, b2) = weights
    b, s, H = (int(n) for n in x.shape)
    d = H // num_heads

    def split_heads(t: Any) -> Any:  # (b * s, H) -> (b, s, h, d)
        return ops.reshape(t, (b, s, num_heads, d))

    x = ops.reshape(x, (b * s, H))
    # Scaled before the scores are formed: (b * s, H) is 1/s the size of (b, h, s, s). 1/8 for BGE-M3.
    q = split_heads(dense(x, wq, bq) * (1.0 / math.sqrt(d)))
    k = split_heads(dense(x, wk, bk))
    v = split_heads(dense(x, wv, bv))
    if attention is not None:
        context = attention(q, k, v)
    elif chunk:
        context = chunked_attention(q, k, v, mask_bias, chunk)
    else:
        context = attend(q, k, v, mask_bias)
    context = ops.reshape(context, (b * s, H))
    x = layer_norm(x + as_float32(dense(context, wo, bo)), g1, b1, epsilon)
    ffn = dense(dense(x, wi, bi, gelu=True), wf, bf)
    x = layer_norm(x + as_float32(ffn), g2, b2, epsilon)
    return ops.reshape(x, (b, s, H))


def gather_rows(x: Any, positions: Any) -> Any:
    """x[b, positions[b, j]] for every row b: (b, s, ...) and (b, k) -> (b, k, ...); (b,) -> (b, ...).

    One take over the flattened (b * s, ...) rows: the same op on every backend.
    """
    shape = tuple(int(n) for n in x.shape)
    b, s, rest = shape[0], shape[1], shape[2:]
    index = ops.cast(positions, "int32")
    offsets = ops.arange(b, dtype="int32") * s
    flat = index + (offsets if len(index.shape) == 1 else ops.expand_dims(offsets, 1))
    rows = ops.take(ops.reshape(x, (b * s, *rest)), ops.reshape(flat, (-1,)), axis=0)
    return ops.reshape(rows, (*tuple(int(n) for n in index.shape), *rest))


def embedding_lookup(table_variable: Any, ids: Any, compute_dtype: str, from_variable: bool = True) -> Any:
    """Rows `ids` of an Embedding table, in `compute_dtype` (`from_variable` matters on TensorFlow only)."""
    return to_dtype(ops.take(table_variable.value, ids, axis=0), compute_dtype)


def embedding_row(table_variable: Any, index: int, compute_dtype: str) -> Any:
    """Row `index` of an Embedding table as a (1, H) tensor in `compute_dtype`."""
    return to_dtype(ops.convert_to_tensor(table_variable.value)[index : index + 1], compute_dtype)
