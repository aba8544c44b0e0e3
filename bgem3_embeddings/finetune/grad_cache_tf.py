"""GradCache's train step on TensorFlow (grad_cache.py says what it does): `train_step(model, data)`.

`fit()` traces the step with every dimension unknown (batch_source.fit_input), so the sub-batches are a
`tf.while_loop` (one iteration at a time: `parallel_iterations=1` keeps a single sub-batch's activations
alive) with TensorArrays for the representations and seed states. Every sub-batch has `sub_batch_size` rows
(the last is filled up with copies of the side's first rows, whose cached gradient is zero, so they add
nothing): fixed shapes, which XLA needs (Keras compiles the step with XLA on a GPU). Pass 1 runs outside
any tape; pass 3 records one sub-batch per tape.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from bgem3_embeddings.finetune.grad_cache import (
    RANKS,
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


def train_step(model: Any, data: Any) -> dict:
    """Keras' TensorFlow `train_step(self, data)` with GradCache's gradients, then one optimizer step."""
    x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
    terms, grads, _ = gradients(model, x, model.sub_batch_size)
    model.optimizer.apply_gradients(zip(grads, model.trainable_weights, strict=True))
    return model.compute_metrics(x, None, terms, sample_weight=None)


def gradients(model: Any, x: dict, size: int) -> tuple[dict, list, Any]:
    """(loss terms, d loss / d v for v in model.trainable_weights, the largest difference between a
    sub-batch's re-encoded and cached representations: 0.0 when the forward replayed bit for bit)."""
    names = field_names(model.settings)
    seeds = seed_variables(model)
    sides = [(_chunked(x[ids], size), _chunked(x[mask], size), tf.shape(x[ids])[0]) for ids, mask in SIDES]
    cached, starts = [], []
    for id_chunks, mask_chunks, _ in sides:  # pass 1: no tape, only the representations stay
        values, side_starts = _encode(model, id_chunks, mask_chunks, size, seeds, names)
        cached.append(values)
        starts.append(side_starts)
    ends = [tf.identity(v.value) for v in seeds]
    with tf.GradientTape() as tape:  # pass 2: the loss's gradient with respect to the representations
        real = [
            {n: v[:rows] for n, v in side.items()} for side, (_, _, rows) in zip(cached, sides, strict=True)
        ]
        flat = flatten(real, names)
        tape.watch(flat)
        q, p = (assemble(side, x[ids], x[mask]) for side, (ids, mask) in zip(real, SIDES, strict=True))
        terms = model.loss_terms(q, p, x)
        loss = scaled(model, terms["loss"])
    flat_grads = tape.gradient(loss, flat)
    flat_grads = [tf.zeros_like(v) if g is None else g for v, g in zip(flat, flat_grads, strict=True)]
    grads = [tf.zeros(v.shape, v.dtype) for v in model.trainable_weights]
    error = tf.constant(0.0)
    for side, rep_grads in enumerate(unflatten(flat_grads, names)):  # pass 3: each sub-batch again, taped
        id_chunks, mask_chunks, rows = sides[side]
        grad_chunks = {
            n: _chunked(_zero_filled(g, tf.shape(id_chunks)[0] * size), size) for n, g in rep_grads.items()
        }
        cached_chunks = {n: _chunked(v, size) for n, v in cached[side].items()}
        grads, error = _replay(
            model, id_chunks, mask_chunks, seeds, starts[side], cached_chunks, grad_chunks, grads, error
        )
    for variable, end in zip(seeds, ends, strict=True):
        variable.assign(end)  # where pass 1 left it, as if the batch had been encoded once
    return terms, grads, error


def _chunked(t: Any, size: int) -> Any:
    """t's rows as (count, size, ...) sub-batches, the last filled up with copies of the first rows."""
    rows = tf.shape(t)[0]
    count = (rows + size - 1) // size
    chunks = tf.gather(t, tf.range(count * size) % rows)
    chunks = tf.reshape(chunks, tf.concat([[count, size], tf.shape(t)[1:]], 0))
    chunks.set_shape([None, size] + [None] * (t.shape.rank - 1))
    return chunks


def _zero_filled(t: Any, rows: Any) -> Any:
    """t with zero rows added up to `rows`: the filler rows' gradient."""
    padding = [[0, rows - tf.shape(t)[0]]] + [[0, 0]] * (t.shape.rank - 1)
    return tf.pad(t, padding)


def _encode(
    model: Any, id_chunks: Any, mask_chunks: Any, size: int, seeds: list, names: tuple[str, ...]
) -> tuple[dict, list]:
    """Pass 1 for one side: ({name: every sub-batch's values, filler rows last}, [seed state before each
    sub-batch, per seed])."""
    count = tf.shape(id_chunks)[0]
    values = {
        n: tf.TensorArray(tf.float32, size=count, element_shape=[size] + [None] * (RANKS[n] - 1))
        for n in names
    }
    states = [tf.TensorArray(v.dtype, size=count, element_shape=v.shape) for v in seeds]

    def body(i: Any, values: dict, states: list) -> tuple:
        states = [ta.write(i, tf.identity(v.value)) for ta, v in zip(states, seeds, strict=True)]
        rep = model.represent(id_chunks[i], mask_chunks[i], training=True)
        values = {n: values[n].write(i, tf.cast(v, tf.float32)) for n, v in values_of(rep, names).items()}
        return i + 1, values, states

    _, values, states = tf.while_loop(
        lambda i, *_: i < count, body, (tf.constant(0), values, states), parallel_iterations=1
    )
    joined = {}
    for n, ta in values.items():
        stacked = ta.stack()  # (count, size, ...)
        joined[n] = tf.reshape(stacked, tf.concat([[-1], tf.shape(stacked)[2:]], 0))
        joined[n].set_shape([None] * RANKS[n])
    return joined, states


def _replay(
    model: Any,
    id_chunks: Any,
    mask_chunks: Any,
    seeds: list,
    states: list,
    cached: dict,
    rep_grads: dict,
    grads: list,
    error: Any,
) -> tuple[list, Any]:
    """Pass 3 for one side: its gradients added to `grads`, the replay's error maxed into `error`."""
    count = tf.shape(id_chunks)[0]
    trainable = model.trainable_weights

    def body(i: Any, grads: list, error: Any) -> tuple:
        for variable, ta in zip(seeds, states, strict=True):
            variable.assign(ta.read(i))  # the masks pass 1 drew for this sub-batch
        with tf.GradientTape() as tape:
            rep = model.represent(id_chunks[i], mask_chunks[i], training=True)
            values = {n: tf.cast(v, tf.float32) for n, v in values_of(rep, tuple(cached)).items()}
            share = surrogate(values, {n: g[i] for n, g in rep_grads.items()})
        step = tape.gradient(share, trainable)
        # an embedding table's gradient comes as IndexedSlices: the sum over sub-batches is dense
        grads = [a if g is None else a + tf.convert_to_tensor(g) for a, g in zip(grads, step, strict=True)]
        chunk_cached = {n: c[i] for n, c in cached.items()}
        return i + 1, grads, tf.maximum(error, replay_error(values, chunk_cached))

    _, grads, error = tf.while_loop(
        lambda i, *_: i < count, body, (tf.constant(0), grads, error), parallel_iterations=1
    )
    return grads, error


def loss_and_gradients(model: Any, inputs: dict) -> tuple[dict, list, Any]:
    """`gradients` in a tf.function whose every dimension is unknown, as `fit()` traces its step."""
    x = {k: tf.convert_to_tensor(v) for k, v in inputs.items()}
    signature = {k: tf.TensorSpec((None,) * v.shape.rank, v.dtype) for k, v in x.items()}
    step = tf.function(lambda x: gradients(model, x, model.sub_batch_size), input_signature=[signature])
    return step(x)
