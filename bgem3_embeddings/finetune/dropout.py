"""The encoder's forward pass in training: dropout where transformers' XLM-RoBERTa has it, optional remat.

Inference never drops anything, so the model's layers (model.py) have no dropout; training with the rates
config.json gives (`hidden_dropout_prob`, `attention_probs_dropout_prob`: 0.1 for BGE-M3) runs this pass
instead, on the same variables. Dropout sits where `XLMRobertaEmbeddings`, `XLMRobertaSelfAttention`,
`XLMRobertaSelfOutput` and `XLMRobertaOutput` apply it: after the embeddings' LayerNorm, on the attention
probabilities, and on each sublayer's output before its residual add. The math is the backend's kernels
(kernels.py) with the attention written out, as the probabilities must be reachable.

`remat=True` recomputes each layer in the backward pass instead of keeping its activations
(`keras.remat`: jax.checkpoint, tf.recompute_grad, torch.utils.checkpoint): a layer's memory instead of 24.

    >>> dropout = EncoderDropout(hidden=0.1, attention=0.1, seed=42)
    >>> hidden = dropout.encode_hidden(model, input_ids, attention_mask)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import keras
from keras import ops

from bgem3_embeddings.backends import backend_kernels
from bgem3_embeddings.backends.keras_backend import backend_name
from bgem3_embeddings.backends.portable.kernels import attention_mask_bias
from bgem3_embeddings.model import BGEM3Model


def dropout_rates(config_json: Path) -> tuple[float, float]:
    """(hidden_dropout_prob, attention_probs_dropout_prob) from a checkpoint's config.json (0.1, 0.1 when
    absent, transformers' defaults)."""
    data = json.loads(Path(config_json).read_text(encoding="utf-8"))
    return float(data.get("hidden_dropout_prob", 0.1)), float(data.get("attention_probs_dropout_prob", 0.1))


class EncoderDropout(keras.layers.Layer):
    """The training forward pass of a `BGEM3Model`'s encoder, with dropout and optional remat.

    A layer so that its seed generator's state is one of the trained model's variables: JAX's stateless
    train step advances it, and a checkpoint saves it.
    """

    def __init__(
        self, hidden: float, attention: float, *, seed: int | None = None, remat: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        for name, rate in (("hidden", hidden), ("attention", attention)):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"{name} dropout must be in [0, 1), got {rate}")
        self.hidden_rate = hidden
        self.attention_rate = attention
        self.remat = remat
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.built = True  # no weights of its own beyond the seed state, created above

    @property
    def active(self) -> bool:
        """Whether this pass differs from the model's own: some dropout, or remat."""
        return self.hidden_rate > 0 or self.attention_rate > 0 or self.remat

    def drop(self, x: Any, rate: float, seed: Any = None, point: int = 0) -> Any:
        """Dropout of `x` at `rate`: from the layer's seed generator, or from `seed` (a seed tensor drawn
        from it earlier) and the dropout `point` within a layer, a pure function of the two."""
        if rate <= 0:
            return x
        if seed is None:
            return keras.random.dropout(x, rate, seed=self.seed_generator)
        return seeded_dropout(x, rate, seed, point)

    def encode_hidden(self, model: BGEM3Model, input_ids: Any, attention_mask: Any) -> Any:
        """Last hidden state (b, s, H) in training mode."""
        mask_bias = attention_mask_bias(attention_mask)
        x = self.drop(model.embeddings(input_ids), self.hidden_rate)
        for layer in model.encoder_layers:
            # One seed per layer, drawn here: under remat the layer runs twice (forward, then again in the
            # backward pass) and must drop the same units both times, and JAX cannot advance the seed
            # generator's state inside jax.checkpoint.
            seed = self.seed_generator.next()

            def run(x: Any, mask_bias: Any, seed: Any, layer: Any = layer) -> Any:
                weights = layer.weight_tensors()
                return self.block(x, mask_bias, weights, layer.num_heads, layer.config.layer_norm_eps, seed)

            x = keras.remat(run)(x, mask_bias, seed) if self.remat else run(x, mask_bias, seed)
        return x

    def block(
        self, x: Any, mask_bias: Any, weights: Sequence[Any], num_heads: int, epsilon: float, seed: Any = None
    ) -> Any:
        """One post-LN layer (TransformerBlock's math) with dropout at transformers' three places."""
        kernels = backend_kernels()
        (wq, bq, wk, bk, wv, bv, wo, bo, wi, bi, wf, bf, g1, b1, g2, b2) = weights
        shape = ops.shape(x)
        b, s, H = shape[0], shape[1], int(x.shape[-1])
        d = H // num_heads

        def split_heads(t: Any) -> Any:  # (b, s, H) -> (b, h, s, d)
            return ops.transpose(ops.reshape(t, (b, s, num_heads, d)), (0, 2, 1, 3))

        q = split_heads(kernels.dense_nd(x, wq, bq) * (1.0 / math.sqrt(d)))
        k = split_heads(kernels.dense_nd(x, wk, bk))
        v = split_heads(kernels.dense_nd(x, wv, bv))
        scores = ops.cast(ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))), "float32") + mask_bias
        probs = self.drop(ops.softmax(scores, axis=-1), self.attention_rate, seed, 0)
        context = ops.matmul(ops.cast(probs, v.dtype), v)  # (b, h, s, d)
        context = ops.reshape(ops.transpose(context, (0, 2, 1, 3)), (b, s, H))
        attended = self.drop(
            ops.cast(kernels.dense_nd(context, wo, bo), "float32"), self.hidden_rate, seed, 1
        )
        x = kernels.layer_norm(x + attended, g1, b1, epsilon)
        ffn = kernels.dense_nd(kernels.dense_nd(x, wi, bi, True), wf, bf)
        dropped = self.drop(ops.cast(ffn, "float32"), self.hidden_rate, seed, 2)
        return kernels.layer_norm(x + dropped, g2, b2, epsilon)


def seeded_dropout(x: Any, rate: float, seed: Any, point: int) -> Any:
    """Inverted dropout whose mask is a function of (`seed`, `point`) alone: the same units each time.

    `seed` is a `SeedGenerator.next()` value (the backend's seed tensor, shape (2,)). Keras' own dropout takes
    a seed tensor on JAX only, so each backend's stateless draw is called here, in one place.
    """
    backend = backend_name()
    if backend == "jax":
        import jax.numpy as jnp

        key = seed + jnp.asarray([0, point], dtype=seed.dtype)
        return keras.random.dropout(x, rate, seed=key)
    if backend == "tensorflow":
        import tensorflow as tf

        key = tf.cast(seed, tf.int64) + tf.constant([0, point], tf.int64)
        return tf.nn.experimental.stateless_dropout(x, rate=rate, seed=key)
    import torch

    generator = torch.Generator(device=x.device)
    generator.manual_seed(int(seed[0]) * 1_000_003 + int(seed[1]) * 31 + point)
    keep = torch.rand(x.shape, generator=generator, device=x.device) >= rate
    return torch.where(keep, x / (1.0 - rate), torch.zeros_like(x))
