"""BGE-M3 in Keras 3: an XLM-RoBERTa encoder (post-LayerNorm) and the three BGE-M3 heads.

The whole network is in this file, built from Dense, LayerNormalization and Embedding layers plus
keras.ops; the math inside the layers is the backend's kernels (kernels.py: raw TensorFlow ops that oneDNN
fuses on TensorFlow, keras.ops on JAX and PyTorch). Layer names are stable: `porting.py` maps Hugging Face
tensor names onto them.

Shapes: b = batch, s = sequence length, h = heads, d = head dim, H = hidden size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
from keras import ops

from bgem3_embeddings.backends import backend_kernels
from bgem3_embeddings.backends.portable.kernels import attention_mask_bias
from bgem3_embeddings.config import BGEM3Config

OUTPUT_NAMES = ("dense_vecs", "sparse_weights", "colbert_vecs")


def _l2_normalize(x: Any, eps: float = 1e-12) -> Any:
    """x / max(||x||, eps) over the last axis, like torch.nn.functional.normalize.

    A zero vector (a padding row) stays exactly zero even where eps rounds to 0 (TFLite's float16
    conversion stores the constant as float16, where 1e-12 underflows and 0 / 0 would give NaN).
    """
    # sqrt(max(|x|^2, eps^2)) is max(|x|, eps) with a finite gradient at a zero vector (padding's ColBERT
    # rows): sqrt's derivative at 0 is infinite, and 0 * inf made every gradient NaN in training.
    denominator = ops.sqrt(ops.maximum(ops.sum(ops.square(x), axis=-1, keepdims=True), eps * eps))
    return x / ops.where(denominator > 0, denominator, ops.ones_like(denominator))


def position_ids_from_input_ids(input_ids: Any, pad_token_id: int) -> Any:
    """Padding-aware positions (int32): the first real token gets pad_id + 1, pads keep pad_id.

    Works for left and right padding, as transformers' create_position_ids_from_input_ids. Counted in
    float32 (exact: positions stay below 2^24) because the Apple GPU backend has Metal kernels for
    Cumsum/Mul/AddV2 on floats only; int32 would send them to the CPU (docs/precision-and-devices.md).
    """
    not_pad = ops.cast(ops.not_equal(input_ids, pad_token_id), "float32")
    return ops.cast(ops.cumsum(not_pad, axis=1) * not_pad + float(pad_token_id), "int32")


def first_real_token(mask: Any) -> Any:
    """(b,) float32 index of each row's first real token (mask (b, s) float): 0 for right padding, the pad
    count for left; 0 for a row without one, as argmax gave.

    A min over positions rather than an argmax of the mask: exact whatever a kernel does with ties (the
    Metal ArgMax's tie order is undocumented), and float32 throughout, which every GPU backend computes on
    the GPU.
    """
    length = ops.cast(ops.shape(mask)[1], "float32")
    positions = ops.cast(ops.arange(ops.shape(mask)[1]), "float32")
    first = ops.min(ops.expand_dims(positions, 0) + (1.0 - mask) * length, axis=1)
    return ops.where(first < length, first, ops.zeros_like(first))


def _tokens_after_first(hidden: Any, mask: Any, first: Any) -> tuple[Any, Any]:
    """Hidden states of the tokens after each row's first real token, moved to the front of the row.

    hidden (b, s, H), mask (b, s) float, first (b,) float -> ((b, s - 1, H), (b, s - 1) mask of real
    tokens). With right padding (first == 0) this is hidden[:, 1:] and mask[:, 1:]; with left padding the
    row is shifted left by its pad count, so position j always holds the (j + 1)-th real token as in the
    reference. Built from ops TFLite runs as builtins (min, gather, comparisons): the TFLite export uses it
    as it is. Index arithmetic in float32 (exact below 2^24): the Metal backend has no int32 AddV2/Minimum.
    """
    length = ops.cast(ops.shape(hidden)[1], "float32")
    steps = ops.expand_dims(ops.cast(ops.arange(1, ops.shape(hidden)[1]), "float32"), 0)  # (1, s - 1)
    positions = ops.expand_dims(first, 1) + steps  # (b, s - 1), may run past the end
    inside = ops.cast(ops.less(positions, length), "float32")
    positions = ops.minimum(positions, length - 1.0)
    tokens = _gather_rows(hidden, positions)  # (b, s - 1, H)
    token_mask = _gather_rows(mask, positions) * inside
    return tokens, token_mask


def _gather_rows(x: Any, positions: Any) -> Any:
    """x[b, positions[b, j]] for every row b (the backend's `gather_rows`, see kernels.py)."""
    return backend_kernels().gather_rows(x, positions)


class FusedDense(keras.layers.Dense):
    """A Dense layer (same variables and names) computed by the backend's `dense` kernel (+ exact GELU).

    On TensorFlow that is a 2-D MatMul + BiasAdd (+ GELU), the op pattern TensorFlow's oneDNN remapper fuses
    into one kernel; Keras' Dense (a 3-D matmul and an AddV2) followed by a separate GELU is not fused.
    Measured on the FFN of one BGE-M3 layer, (8 x 992) tokens: 270 ms fused against 369 ms, the unfused GELU
    alone costing ~90 ms. On JAX and PyTorch it is keras.ops (backends/portable/kernels.py).
    """

    def __init__(self, units: int, *, gelu: bool = False, **kwargs: Any) -> None:
        super().__init__(units, **kwargs)
        self.gelu = gelu

    def call(self, inputs: Any) -> Any:
        kernels = backend_kernels()
        kernel = kernels.to_dtype(current_value(self.kernel), self.compute_dtype)
        bias = kernels.to_dtype(self.bias.value, self.compute_dtype)
        return kernels.dense_nd(kernels.to_dtype(inputs, self.compute_dtype), kernel, bias, self.gelu)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "gelu": self.gelu}


class XLMRobertaEmbeddings(keras.layers.Layer):
    """word + position + token_type embeddings, then LayerNorm."""

    def __init__(self, config: BGEM3Config, initializer: str = "zeros", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config = config
        H = config.hidden_size
        self.word_embeddings = keras.layers.Embedding(
            config.vocab_size,
            H,
            embeddings_initializer=initializer,
            name="word_embeddings",
            dtype=self.dtype_policy,
        )
        self.position_embeddings = keras.layers.Embedding(
            config.max_position_embeddings,
            H,
            embeddings_initializer=initializer,
            name="position_embeddings",
            dtype=self.dtype_policy,
        )
        self.token_type_embeddings = keras.layers.Embedding(
            config.type_vocab_size,
            H,
            embeddings_initializer=initializer,
            name="token_type_embeddings",
            dtype=self.dtype_policy,
        )
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=config.layer_norm_eps, name="layer_norm", dtype=_norm_policy(self.dtype_policy)
        )
        # How the tables are read (see embedding_lookup): loading sets False when the variables were
        # initialised whole from the memory-mapped weights cache.
        self.gather_from_variables = True

    def build(self, input_shape: Any) -> None:
        for layer in (self.word_embeddings, self.position_embeddings, self.token_type_embeddings):
            layer.build(input_shape)
        self.layer_norm.build((*input_shape, self.config.hidden_size))
        self.built = True

    def call(self, input_ids: Any) -> Any:
        positions = position_ids_from_input_ids(input_ids, self.config.pad_token_id)  # (b, s)
        # Token type ids are all zero for BGE-M3: add row 0 of the table to every token.
        kernels = backend_kernels()
        from_variables = self.gather_from_variables
        # Summed in float32 (tables may be held in bf16/fp16): the LayerNorm and residual stream are float32.
        word = self.word_embeddings.embeddings
        position = self.position_embeddings.embeddings
        x = (
            kernels.embedding_lookup(word, input_ids, "float32", from_variables)
            + kernels.embedding_lookup(position, positions, "float32", from_variables)
            + kernels.embedding_row(self.token_type_embeddings.embeddings, 0, "float32")  # (1, H)
        )  # (b, s, H)
        return self.layer_norm(x)


class TransformerBlock(keras.layers.Layer):
    """One post-LN encoder layer: self-attention + residual + LN, erf-GELU FFN + residual + LN."""

    def __init__(
        self, config: BGEM3Config, initializer: str = "zeros", dense_dtype: Any = None, **kwargs: Any
    ) -> None:
        # No autocast of the block's inputs: the residual stream x and mask_bias stay float32 whatever the
        # policy (as under torch autocast); each Dense casts its own input to the compute dtype.
        super().__init__(autocast=False, **kwargs)
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        # Chunk size for queries in attention; None = all at once. Bounds the (b, h, chunk, s) score
        # tensor for long inputs; results are identical since each query row is independent.
        self.query_chunk_size: int | None = None
        H, F = config.hidden_size, config.intermediate_size
        policy = self.dtype_policy
        # The Dense layers may compute in float32 from half-precision weights (see HalfWeightsPolicy).
        dense_policy = dense_dtype if dense_dtype is not None else policy

        def dense(units: int, name: str, gelu: bool = False) -> keras.layers.Dense:
            return FusedDense(units, gelu=gelu, kernel_initializer=initializer, name=name, dtype=dense_policy)

        self.query = dense(H, "query")
        self.key = dense(H, "key")
        self.value = dense(H, "value")
        self.attention_output = dense(H, "attention_output")
        self.attention_layer_norm = keras.layers.LayerNormalization(
            epsilon=config.layer_norm_eps, name="attention_layer_norm", dtype=_norm_policy(policy)
        )
        self.intermediate = dense(F, "intermediate", gelu=True)  # exact erf GELU, fused
        self.output_dense = dense(H, "output_dense")
        self.output_layer_norm = keras.layers.LayerNormalization(
            epsilon=config.layer_norm_eps, name="output_layer_norm", dtype=_norm_policy(policy)
        )

    def build(self, input_shape: Any) -> None:
        H, F = self.config.hidden_size, self.config.intermediate_size
        for layer in (self.query, self.key, self.value, self.attention_output, self.intermediate):
            layer.build(input_shape)
        self.output_dense.build((*input_shape[:-1], F))
        self.attention_layer_norm.build(input_shape)
        self.output_layer_norm.build((*input_shape[:-1], H))
        self.built = True

    def weight_variables(self) -> tuple[Any, ...]:
        """The block's 16 variables in `block_forward`'s order: q, k, v, attention output, intermediate and
        output kernels and biases, then the two LayerNorms' gamma and beta."""
        variables: list[Any] = []
        for dense in (self.query, self.key, self.value, self.attention_output, self.intermediate,
                      self.output_dense):
            variables += [dense.kernel, dense.bias]
        for norm in (self.attention_layer_norm, self.output_layer_norm):
            variables += [norm.gamma, norm.beta]
        return tuple(variables)

    def weight_dtypes(self) -> tuple[str, ...]:
        """The dtype `block_forward` takes each weight in: Dense compute dtype, LayerNorm float32."""
        dense_dtype = self.query.compute_dtype
        return (dense_dtype,) * 12 + (self.attention_layer_norm.compute_dtype,) * 4

    def weight_tensors(self) -> tuple[Any, ...]:
        """The block's weights in `block_forward`'s order, kernels and biases in the matmul dtype.

        With half-precision weights and float32 matmuls (HalfWeightsPolicy) this is where each kernel is
        widened, one layer at a time, as Keras' autocast would when the Dense layer reads it.
        """
        return cast_weights([current_value(v) for v in self.weight_variables()], self.weight_dtypes())

    def call(self, x: Any, mask_bias: Any) -> Any:
        # x: (b, s, H); mask_bias: (b, 1, 1, s) float32, 0 for real tokens and a large negative for pads.
        return backend_kernels().block_forward(
            x,
            mask_bias,
            self.weight_tensors(),
            num_heads=self.num_heads,
            epsilon=self.config.layer_norm_eps,
            chunk=self.query_chunk_size,
        )


def current_value(weight: Any) -> Any:
    """A variable's value; a tensor as it is. With LoRA on (fine-tuning: `Dense.enable_lora`) a Dense
    layer's `kernel` is a tensor, the frozen kernel plus the adapters' product, not a variable."""
    return weight.value if isinstance(weight, keras.Variable) else weight


def cast_weights(values: Sequence[Any], dtypes: Sequence[str]) -> tuple[Any, ...]:
    """Each weight value as a tensor of its dtype (no copy where it already is)."""
    kernels = backend_kernels()
    return tuple(kernels.to_dtype(value, dtype) for value, dtype in zip(values, dtypes, strict=True))


class XLMRobertaEncoderModel(keras.Model):
    """The XLM-RoBERTa encoder: embeddings and post-LN layers up to the last hidden state.

    The backbone BGE-M3 (`BGEM3Model`) and BAAI's cross-encoder reranker add their heads to. Variable paths
    (`<name>/embeddings/...`, `<name>/layer_N/...`) are what checkpoint/porting.py and the converted-weights
    cache address.
    """

    def __init__(
        self,
        config: BGEM3Config,
        *,
        initializer: str = "zeros",
        dtype: Any = None,
        compute_dtype: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(dtype=dtype, **kwargs)
        self.config = config
        policy = self.dtype_policy
        # The Dense layers' policy (heads included); may compute in float32 from half-precision weights.
        self.dense_policy = dense_layer_policy(policy, compute_dtype)
        # The matmul compute dtype; embedding gathers and LayerNorm are not matmuls (see _norm_policy).
        self.compute_dtype_of_matmuls = self.dense_policy.compute_dtype
        self.embeddings = XLMRobertaEmbeddings(config, initializer, name="embeddings", dtype=policy)
        self.encoder_layers = [
            TransformerBlock(config, initializer, self.dense_policy, name=f"layer_{i}", dtype=policy)
            for i in range(config.num_hidden_layers)
        ]
        # When True (set by the TensorFlow runner while it traces its inference function), encode_hidden runs
        # every layer through one shared tf.function: a new process traces one layer instead of 24 (start-up).
        self.share_block_trace = False
        self._shared_block: Any = None

    def build_encoder(self) -> None:
        """Create the encoder's variables now (so weights can be ported before the first call)."""
        self.embeddings.build((None, None))
        for layer in self.encoder_layers:
            layer.build((None, None, self.config.hidden_size))

    def set_query_chunk_size(self, chunk: int | None) -> None:
        """Compute attention `chunk` queries at a time (bounded memory for long inputs)."""
        for layer in self.encoder_layers:
            layer.query_chunk_size = chunk

    def encode_hidden(self, input_ids: Any, attention_mask: Any) -> Any:
        """Last hidden state (b, s, H), as transformers' XLMRobertaModel(...).last_hidden_state."""
        mask_bias = attention_mask_bias(attention_mask)
        x = self.embeddings(input_ids)
        for layer in self.encoder_layers:
            if self.share_block_trace:
                # One tf.function for every layer, the weights passed in: traced once, called 24 times.
                x = self._block_function()(x, mask_bias, layer.weight_tensors(), chunk=layer.query_chunk_size)
            else:
                x = layer(x, mask_bias)
        return x

    def _block_function(self) -> Any:
        """block_forward as this model's own tf.function, created on first use (not shared across models)."""
        if self._shared_block is None:
            import functools

            import tensorflow as tf

            forward = functools.partial(
                backend_kernels().block_forward,
                num_heads=self.config.num_attention_heads,
                epsilon=self.config.layer_norm_eps,
            )
            self._shared_block = tf.function(forward, autograph=False)
        return self._shared_block


class BGEM3Model(XLMRobertaEncoderModel):
    # How each output is laid out (bgem3_embeddings/backends/portable/buckets.py cuts padded batches back by
    # it).
    OUTPUT_LAYOUT = {"dense_vecs": "row", "sparse_weights": "tokens", "colbert_vecs": "after_first"}

    """XLM-RoBERTa encoder + BGE-M3 heads.

    Inputs: input_ids, attention_mask, int32 (b, s), right- or left-padded with pad_token_id.
    Outputs (float32):
      dense_vecs      (b, H)          state of the first real token <s> (CLS), L2-normalised
      sparse_weights  (b, s)          relu(sparse head); special tokens and padding zeroed
      colbert_vecs    (b, s - 1, C)   colbert head on the real tokens after <s>, first; masked, L2-normalised

    Example:
        >>> model = BGEM3Model(BGEM3Config(vocab_size=100, hidden_size=8, num_hidden_layers=1,
        ...                                num_attention_heads=2, intermediate_size=16, colbert_dim=8))
        >>> out = model({"input_ids": ids, "attention_mask": mask})
    """

    def __init__(
        self,
        config: BGEM3Config,
        *,
        special_token_ids: Sequence[int] | None = None,
        initializer: str = "zeros",
        dtype: Any = None,
        compute_dtype: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(config, initializer=initializer, dtype=dtype, compute_dtype=compute_dtype, **kwargs)
        # Tokens the reference drops from the lexical weights: cls, eos, pad, unk.
        self.special_token_ids = tuple(
            special_token_ids
            if special_token_ids is not None
            else (config.bos_token_id, config.eos_token_id, config.pad_token_id, 3)
        )
        self.sparse_linear = keras.layers.Dense(
            1, kernel_initializer=initializer, name="sparse_linear", dtype=self.dense_policy
        )
        self.colbert_linear = keras.layers.Dense(
            config.colbert_dim, kernel_initializer=initializer, name="colbert_linear", dtype=self.dense_policy
        )
        self.build_all()

    def build_all(self) -> None:
        """Create every variable now (so weights can be ported before the first call)."""
        self.build_encoder()
        hidden_shape = (None, None, self.config.hidden_size)
        self.sparse_linear.build(hidden_shape)
        self.colbert_linear.build(hidden_shape)
        self.built = True

    def heads(
        self, hidden: Any, input_ids: Any, attention_mask: Any, outputs: Sequence[str] = OUTPUT_NAMES
    ) -> dict:
        """Apply the BGE-M3 heads to the last hidden state; returns only the requested outputs.

        Right or left padding give the same per-text results: dense is the state of each row's first real
        token (<s>), and colbert_vecs holds the vectors of the real tokens after it first, padding
        after, whatever side the row was padded on; sparse_weights stays aligned with input_ids.
        """
        result: dict[str, Any] = {}
        mask = ops.cast(attention_mask, "float32")
        first = first_real_token(mask)  # (b,) index of <s>: 0 for right padding, the pad count for left
        if "dense_vecs" in outputs:
            cls = _gather_rows(hidden, first)  # (b, H)
            result["dense_vecs"] = _l2_normalize(ops.cast(cls, "float32"))
        if "sparse_weights" in outputs:
            weights = ops.relu(ops.cast(self.sparse_linear(hidden), "float32"))[..., 0]  # (b, s)
            keep = mask
            for token_id in self.special_token_ids:
                keep = keep * ops.cast(ops.not_equal(input_ids, token_id), "float32")
            result["sparse_weights"] = weights * keep
        if "colbert_vecs" in outputs:
            tokens, token_mask = _tokens_after_first(hidden, mask, first)  # (b, s - 1, H), (b, s - 1)
            colbert = ops.cast(self.colbert_linear(tokens), "float32") * ops.expand_dims(token_mask, -1)
            result["colbert_vecs"] = _l2_normalize(colbert)  # (b, s - 1, C)
        return result

    def call(self, inputs: dict, outputs: Sequence[str] = OUTPUT_NAMES) -> dict:
        input_ids = ops.cast(inputs["input_ids"], "int32")
        attention_mask = ops.cast(inputs["attention_mask"], "int32")
        hidden = self.encode_hidden(input_ids, attention_mask)
        return self.heads(hidden, input_ids, attention_mask, outputs)


def _norm_policy(policy: Any) -> Any:
    """LayerNorm runs fully in float32 (variables, math and output) when the rest runs in bf16/fp16.

    Its float32 output is the residual stream, as under torch autocast: only matmul inputs are rounded.
    """
    name = getattr(policy, "name", str(policy))
    if name in ("bfloat16", "float16", "mixed_bfloat16", "mixed_float16"):
        return keras.DTypePolicy("float32")
    return policy


HALF_DTYPES = ("bfloat16", "float16")


class HalfWeightsPolicy(keras.DTypePolicy):
    """Variables held in bfloat16/float16, computation in float32: named "<half>_weights".

    For CPUs without native bf16/fp16 matmul (no AMX, avx512_bf16, avx512_fp16), where a half-precision
    GEMM is emulated and about 4x slower than float32: the weights keep their half-precision memory
    footprint, and Keras casts each kernel to float32 when a Dense layer reads it (a transient of one
    kernel, at most H x F floats).

        >>> policy = HalfWeightsPolicy("bfloat16_weights")
        >>> policy.variable_dtype, policy.compute_dtype
        ('bfloat16', 'float32')
    """

    SUFFIX = "_weights"

    def _parse_name(self, name: str) -> tuple[str, str]:
        storage = name[: -len(self.SUFFIX)] if name.endswith(self.SUFFIX) else ""
        if storage not in HALF_DTYPES:
            names = [d + self.SUFFIX for d in HALF_DTYPES]
            raise ValueError(f"HalfWeightsPolicy name must be one of {names}, got {name!r}")
        return "float32", storage


def dense_layer_policy(policy: Any, compute_dtype: str | None) -> Any:
    """The policy of the Dense layers: `policy`, or half weights with float32 compute when asked.

    compute_dtype None or equal to the policy's compute dtype keeps `policy`; "float32" with a bfloat16 /
    float16 policy gives HalfWeightsPolicy. Anything else is a ValueError.
    """
    if compute_dtype is None or compute_dtype == policy.compute_dtype:
        return policy
    if compute_dtype == "float32" and policy.variable_dtype in HALF_DTYPES:
        return HalfWeightsPolicy(policy.variable_dtype + HalfWeightsPolicy.SUFFIX)
    raise ValueError(
        f"compute_dtype {compute_dtype!r} is not possible with {policy.name} weights: "
        f"use {policy.compute_dtype!r}" + (" or 'float32'" if policy.variable_dtype in HALF_DTYPES else "")
    )
