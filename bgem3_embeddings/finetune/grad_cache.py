"""GradCache (Gao et al. 2021) in `fit()`: the in-batch negatives pool without the whole batch's activations.

The M3 loss scores every query against every passage of the batch, so its gradient with respect to the
encoder needs the whole batch at once, and a plain train step keeps the activations of all B + B * G texts
until the backward pass. GradCache splits that step in three (`sub_batch_size` rows at a time):

1. encode queries and passages in sub-batches with no gradient recording, keeping only their
   representations (dense, token weights, ColBERT vectors) and the dropout seed state before each;
2. form the loss on the concatenated representations and take its gradient with respect to them alone;
3. for each sub-batch again: restore its seed state (the dropout masks are replayed, so this forward is
   pass 1's bit for bit), encode it with gradients, and backpropagate sum(representation * its cached
   gradient) into the parameters, accumulating.

The chain rule makes the sum of pass 3's gradients the whole batch's gradient; the optimizer then steps once
(its clipping included), as Keras' own train step does. Peak activations are one sub-batch's, whatever the
batch. FlagEmbedding's `sub_batch_size` differs: it only splits the forward and keeps every sub-batch's graph.

This module is the portable part and the one place the backend is chosen; each backend's step is in
grad_cache_tf.py, grad_cache_jax.py and grad_cache_torch.py, written the way Keras documents a custom
`train_step` on it.

    >>> finetuner = M3Finetuner(model, settings, group_size=8, sub_batch_size=4)
    >>> finetuner.fit(batches)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import keras
from keras import ops

from bgem3_embeddings.finetune.loss import LossSettings, Representations

# (input ids, attention mask) of each side, in the order `M3Finetuner.call` encodes them: a sub-batch's seed
# state then follows the same sequence of draws in every pass.
SIDES = (("query_input_ids", "query_attention_mask"), ("passage_input_ids", "passage_attention_mask"))


def field_names(settings: LossSettings) -> tuple[str, ...]:
    """The representations the loss is differentiated through: the dense vectors, and with unified
    fine-tuning the token weights and ColBERT vectors (the ids and masks are inputs)."""
    return ("dense", "token_weights", "colbert") if settings.unified else ("dense",)


# Each representation's rank: (n, H), (n, L), (n, L - 1, C) (TensorFlow's loop must be told).
RANKS = {"dense": 2, "token_weights": 2, "colbert": 3}


def values_of(rep: Representations, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(rep, name) for name in names}


def flatten(sides: list[dict[str, Any]], names: tuple[str, ...]) -> list[Any]:
    """Both sides' values as one list (queries' first), for the autodiff calls that take lists."""
    return [side[n] for side in sides for n in names]


def unflatten(flat: Sequence[Any], names: tuple[str, ...]) -> list[dict[str, Any]]:
    """flatten's inverse: [{name: value} per side]."""
    k = len(names)
    return [dict(zip(names, flat[i * k : (i + 1) * k], strict=True)) for i in range(len(flat) // k)]


def assemble(values: dict[str, Any], input_ids: Any, attention_mask: Any) -> Representations:
    """A whole side's Representations from its concatenated values and its (whole-batch) inputs."""
    rep = Representations(
        dense=None, input_ids=ops.cast(input_ids, "int32"), mask=ops.cast(attention_mask, "int32")
    )
    return dataclasses.replace(rep, **values)


def surrogate(values: dict[str, Any], cached_grads: dict[str, Any]) -> Any:
    """sum(representation * d loss / d representation): its gradient with respect to the parameters is the
    loss's share through this sub-batch (the cached gradient is a constant here)."""
    total = 0.0
    for name, value in values.items():
        total = total + ops.sum(value * ops.stop_gradient(cached_grads[name]))
    return total


def replay_error(values: dict[str, Any], cached: dict[str, Any]) -> Any:
    """The largest |re-encoded - cached| over every value of a sub-batch: 0 when the forward replayed."""
    return ops.max(ops.stack([ops.max(ops.abs(values[n] - cached[n])) for n in values]))


def chunk_bounds(rows: int, size: int) -> list[tuple[int, int]]:
    """[(start, stop)] of `rows` rows in sub-batches of `size` (the last may be shorter)."""
    return [(start, min(start + size, rows)) for start in range(0, rows, size)]


def seed_variables(model: Any) -> list[Any]:
    """The variables whose values decide the dropout masks: the encoder dropout's seed state."""
    dropout = model.dropout
    return [dropout.seed_generator.state] if dropout is not None and dropout.active else []


def scaled(model: Any, loss: Any) -> Any:
    """The loss as Keras' train step differentiates it (the optimizer's loss scale, when it has one)."""
    optimizer = getattr(model, "optimizer", None)  # none before compile()
    return optimizer.scale_loss(loss) if optimizer is not None else loss


def splits(model: Any, data: Any) -> bool:
    """Whether GradCache's step runs for this batch: `sub_batch_size` is set and below a side's rows (where
    the row count is unknown until run time, as on TensorFlow, it runs)."""
    size = model.sub_batch_size
    if size is None:
        return False
    x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
    rows = [x[ids].shape[0] for ids, _ in SIDES]
    return not all(isinstance(r, int) and r <= size for r in rows)
