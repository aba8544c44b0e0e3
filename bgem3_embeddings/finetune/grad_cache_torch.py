"""GradCache's train step on PyTorch (grad_cache.py says what it does): `train_step(model, data)`.

Eager, as Keras' torch trainer is: pass 1 runs under `torch.no_grad()` (no graph, so each sub-batch's
activations are freed as it ends), pass 3 calls `backward()` once per sub-batch, which adds into each
parameter's `.grad`; the seed state is copied before each sub-batch and assigned back before its replay.
"""

from __future__ import annotations

from typing import Any

import keras
import torch
from keras import ops

from bgem3_embeddings.finetune.grad_cache import (
    SIDES,
    assemble,
    chunk_bounds,
    field_names,
    flatten,
    replay_error,
    scaled,
    seed_variables,
    surrogate,
    unflatten,
    values_of,
)


def train_step(model: Any, data: Any) -> dict:
    """Keras' torch `train_step(self, data)` with GradCache's gradients, then one optimizer step."""
    x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
    terms, grads, _ = gradients(model, x, model.sub_batch_size)
    with torch.no_grad():
        model.optimizer.apply(grads, model.trainable_weights[:])
    return model.compute_metrics(x, None, terms, sample_weight=None)


def gradients(model: Any, x: dict, size: int) -> tuple[dict, list, Any]:
    """(loss terms, d loss / d v for v in model.trainable_weights (None where none reaches v), the largest
    difference between a sub-batch's re-encoded and cached representations: 0.0 when it replayed)."""
    names = field_names(model.settings)
    seeds = seed_variables(model)
    x = {k: ops.convert_to_tensor(v) for k, v in x.items()}
    cached, starts = [], []
    with torch.no_grad():  # pass 1
        for ids, mask in SIDES:
            parts, side_starts = [], []
            for start, stop in chunk_bounds(int(x[ids].shape[0]), size):
                side_starts.append([v.value.clone() for v in seeds])
                rep = model.represent(x[ids][start:stop], x[mask][start:stop], training=True)
                parts.append(values_of(rep, names))
            cached.append({n: torch.cat([part[n] for part in parts]) for n in names})
            starts.append(side_starts)
    ends = [v.value.clone() for v in seeds]
    # pass 2: the loss on leaf copies of the representations, differentiated with respect to them only
    leaves = [{n: value.detach().requires_grad_() for n, value in side.items()} for side in cached]
    q, p = (assemble(side, x[ids], x[mask]) for side, (ids, mask) in zip(leaves, SIDES, strict=True))
    terms = model.loss_terms(q, p, x)
    flat = flatten(leaves, names)
    flat_grads = torch.autograd.grad(scaled(model, terms["loss"]), flat, allow_unused=True)
    flat_grads = tuple(torch.zeros_like(v) if g is None else g for v, g in zip(flat, flat_grads, strict=True))
    rep_grads = unflatten(flat_grads, names)
    model.zero_grad()
    error = None
    for side, (ids, mask) in enumerate(SIDES):  # pass 3
        bounds = chunk_bounds(int(x[ids].shape[0]), size)
        for (start, stop), state in zip(bounds, starts[side], strict=True):
            for variable, value in zip(seeds, state, strict=True):
                variable.assign(value)  # the masks pass 1 drew for this sub-batch
            rep = model.represent(x[ids][start:stop], x[mask][start:stop], training=True)
            values = values_of(rep, names)
            surrogate(values, {n: g[start:stop] for n, g in rep_grads[side].items()}).backward()
            with torch.no_grad():  # kept on the device: no sync per sub-batch
                chunk_error = replay_error(values, {n: c[start:stop] for n, c in cached[side].items()})
                error = chunk_error if error is None else torch.maximum(error, chunk_error)
    for variable, end in zip(seeds, ends, strict=True):
        variable.assign(end)  # where pass 1 left it
    grads = [v.value.grad for v in model.trainable_weights]
    return {k: v.detach() for k, v in terms.items()}, grads, error


def loss_and_gradients(model: Any, inputs: dict) -> tuple[dict, list, Any]:
    """`gradients`, eager as `fit()` runs its step on PyTorch."""
    return gradients(model, inputs, model.sub_batch_size)
