"""GradCache's train step on JAX (grad_cache.py says what it does): `train_step(model, state, data)`.

Stateless, as Keras' JAX trainer is: the variables' values come in `state` and the new ones go out; the
model's layers run under a `keras.StatelessScope` mapping them. The dropout seed state is a non-trainable
value, so "record" and "restore" are passing it along. The full sub-batches are a `jax.lax.scan` (one
compiled sub-batch whatever their number, run one after the other: one sub-batch's activations at a time);
a shorter last one runs after it. Pass 1 is never differentiated; pass 3 takes one `jax.grad` per sub-batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import keras

from bgem3_embeddings.finetune.grad_cache import (
    SIDES,
    assemble,
    field_names,
    flatten,
    replay_error,
    scaled,
    seed_variables,
    surrogate,
    unflatten,
    values_of,
)


def train_step(model: Any, state: tuple, data: Any) -> tuple[dict, tuple]:
    """Keras' JAX `train_step(self, state, data)` with GradCache's gradients, then one optimizer step."""
    trainable, non_trainable, optimizer_variables, metrics_variables = state
    x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
    terms, grads, non_trainable, _ = gradients(
        model, trainable, non_trainable, x, model.sub_batch_size, optimizer_variables
    )
    trainable, optimizer_variables = model.optimizer.stateless_apply(optimizer_variables, grads, trainable)
    mapping = list(zip(model.metrics_variables, metrics_variables, strict=True))
    with keras.StatelessScope(state_mapping=mapping) as scope:
        logs = model.compute_metrics(x, None, terms, sample_weight=None)
    metrics_variables = [_current(scope, ref, value) for ref, value in mapping]
    return logs, (trainable, non_trainable, optimizer_variables, metrics_variables)


def _current(scope: Any, variable: Any, default: Any) -> Any:
    value = scope.get_current_value(variable)
    return default if value is None else value


def gradients(
    model: Any,
    trainable: list,
    non_trainable: list,
    x: dict,
    size: int,
    optimizer_variables: list | None = None,
) -> tuple[dict, list, list, Any]:
    """(loss terms, d loss / d trainable, the non-trainable values after the step, the largest difference
    between a sub-batch's re-encoded and cached representations: 0.0 when the forward replayed)."""
    names = field_names(model.settings)
    seed_refs = seed_variables(model)
    seed_index = [i for i, v in enumerate(model.non_trainable_variables) if any(v is s for s in seed_refs)]

    def represent(values: list, seeds: list, ids: Any, mask: Any) -> tuple[dict, list]:
        """One sub-batch's representations and the seed state after it, statelessly."""
        current = list(non_trainable)
        for i, seed in zip(seed_index, seeds, strict=True):
            current[i] = seed
        mapping = list(zip(model.trainable_variables, values, strict=True)) + list(
            zip(model.non_trainable_variables, current, strict=True)
        )
        with keras.StatelessScope(state_mapping=mapping) as scope:
            rep = model.represent(ids, mask, training=True)
        after = [
            _current(scope, model.non_trainable_variables[i], s)
            for i, s in zip(seed_index, seeds, strict=True)
        ]
        return values_of(rep, names), after

    seeds = [non_trainable[i] for i in seed_index]
    cached, starts = [], []
    for ids, mask in SIDES:  # pass 1: forward only
        values, side_starts, seeds = _encode(represent, trainable, seeds, x[ids], x[mask], size)
        cached.append(values)
        starts.append(side_starts)

    def loss_of(flat: list) -> tuple[Any, dict]:  # pass 2: the loss as a function of the representations
        q, p = (
            assemble(side, x[ids], x[mask])
            for side, (ids, mask) in zip(unflatten(flat, names), SIDES, strict=True)
        )
        terms = model.loss_terms(q, p, x)
        loss = terms["loss"]
        if optimizer_variables is not None:
            opt_mapping = list(zip(model.optimizer.variables, optimizer_variables, strict=True))
            with keras.StatelessScope(state_mapping=opt_mapping):
                loss = scaled(model, loss)
        return loss, terms

    flat = flatten(cached, names)
    (_, terms), flat_grads = jax.value_and_grad(loss_of, has_aux=True)(flat)
    rep_grads = unflatten(flat_grads, names)
    grads = [jnp.zeros_like(v) for v in trainable]
    error = jnp.zeros((), jnp.float32)
    for side, (ids, mask) in enumerate(SIDES):  # pass 3
        grads, error = _replay(
            represent,
            trainable,
            x[ids],
            x[mask],
            size,
            starts[side],
            cached[side],
            rep_grads[side],
            grads,
            error,
        )
    non_trainable = list(non_trainable)
    for i, seed in zip(seed_index, seeds, strict=True):
        non_trainable[i] = seed  # where pass 1 left it
    return terms, grads, non_trainable, error


Represent = Callable[[list, list, Any, Any], tuple[dict, list]]


def _split(rows: int, size: int) -> tuple[int, int]:
    """(full sub-batches, rows of the shorter last one)."""
    return rows // size, rows % size


def _stack(a: Any, full: int, size: int) -> Any:
    """The first full * size rows as (full, size, ...)."""
    return jnp.reshape(a[: full * size], (full, size) + tuple(a.shape[1:]))


def _unstack(a: Any) -> Any:
    return jnp.reshape(a, (a.shape[0] * a.shape[1],) + tuple(a.shape[2:]))


def _encode(
    represent: Represent, trainable: list, seeds: list, ids: Any, mask: Any, size: int
) -> tuple[dict, tuple, list]:
    """Pass 1 for one side: (concatenated values, (seed states before each full sub-batch, before the
    last), seeds after)."""
    full, rest = _split(int(ids.shape[0]), size)
    parts: list[dict] = []
    full_starts: list = []
    if full:

        def body(seeds: list, chunk: tuple) -> tuple:
            values, after = represent(trainable, seeds, *chunk)
            return after, (values, seeds)

        stacked: dict
        seeds, (stacked, full_starts) = jax.lax.scan(
            body, seeds, (_stack(ids, full, size), _stack(mask, full, size))
        )
        parts.append({n: _unstack(v) for n, v in stacked.items()})
    rest_start = seeds
    if rest:
        last, seeds = represent(trainable, seeds, ids[full * size :], mask[full * size :])
        parts.append(last)
    joined = {n: jnp.concatenate([part[n] for part in parts]) for n in parts[0]}
    return joined, (full_starts, rest_start), seeds


def _replay(
    represent: Represent,
    trainable: list,
    ids: Any,
    mask: Any,
    size: int,
    starts: tuple,
    cached: dict,
    rep_grads: dict,
    grads: list,
    error: Any,
) -> tuple[list, Any]:
    """Pass 3 for one side: its gradients added to `grads`, the replay's error maxed into `error`."""
    full, rest = _split(int(ids.shape[0]), size)
    full_starts, rest_start = starts

    def chunk(seeds: list, ids: Any, mask: Any, cached: dict, rep_grads: dict) -> tuple[list, Any]:
        def share(values: list) -> tuple[Any, dict]:
            reps, _ = represent(values, seeds, ids, mask)
            return surrogate(reps, rep_grads), reps

        step, reps = jax.grad(share, has_aux=True)(trainable)
        return step, replay_error(reps, cached)

    def add(grads: list, step: list) -> list:
        return [a + g for a, g in zip(grads, step, strict=True)]

    if full:

        def body(carry: tuple, xs: tuple) -> tuple:
            grads, error = carry
            step, chunk_error = chunk(*xs)
            return (add(grads, step), jnp.maximum(error, chunk_error)), None

        xs = (
            full_starts,
            _stack(ids, full, size),
            _stack(mask, full, size),
            {n: _stack(v, full, size) for n, v in cached.items()},
            {n: _stack(v, full, size) for n, v in rep_grads.items()},
        )
        (grads, error), _ = jax.lax.scan(body, (grads, error), xs)
    if rest:
        tail = slice(full * size, None)
        step, chunk_error = chunk(
            rest_start,
            ids[tail],
            mask[tail],
            {n: v[tail] for n, v in cached.items()},
            {n: v[tail] for n, v in rep_grads.items()},
        )
        grads, error = add(grads, step), jnp.maximum(error, chunk_error)
    return grads, error


def loss_and_gradients(model: Any, inputs: dict) -> tuple[dict, list, Any]:
    """`gradients` under jax.jit, as `fit()` compiles its step; the new seed state is assigned."""
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    step = jax.jit(lambda t, n, x: gradients(model, t, n, x, model.sub_batch_size))
    terms, grads, non_trainable, error = step(trainable, non_trainable, inputs)
    for variable, value in zip(model.non_trainable_variables, non_trainable, strict=True):
        variable.assign(value)
    return terms, grads, error
