"""finetune/optimizer.py's AdamW on TensorFlow: updates in order, a large weight by blocks of rows.

A weight's rows are read with `sparse_read` and written with `scatter_update` (ResourceGather and
ResourceScatterUpdate), not sliced and slice-assigned: a strided-slice assign puts the variable in
TensorFlow's copy-on-read mode, after which every read of the moments copied the whole 1 GiB table
(measured on a 250,002 x 1,024 table with a 2,000-row gradient, whole process: slices 10.6 GiB and 8.5 s an
update; rows read and scattered 4.5 GiB and 1.0 s; Keras' AdamW 9.1 GiB and 0.95 s).
"""

from __future__ import annotations

import math
from typing import Any

import keras
import numpy as np


def size_in_bytes(variable: Any) -> int:
    return math.prod(variable.shape) * np.dtype(keras.backend.standardize_dtype(variable.dtype)).itemsize


def to_dense(grad: Any) -> Any:
    """An IndexedSlices gradient as the dense tensor Keras' ops make of it (tf.convert_to_tensor)."""
    import tensorflow as tf

    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


def one_at_a_time(update: Any, items: list) -> None:
    """Call update(item) for each item; inside a traced function every op an update adds waits for all
    the ops the previous update added (outside one, eager ops run in order anyway)."""
    import tensorflow as tf

    if not tf.inside_function():
        for item in items:
            update(item)
        return
    graph = tf.compat.v1.get_default_graph()
    previous: list = []
    for item in items:
        start = len(graph.get_operations())
        with tf.control_dependencies(previous):
            update(item)
        previous = graph.get_operations()[start:]


def update_in_row_blocks(
    optimizer: Any, gradient: Any, variable: Any, learning_rate: Any, block_bytes: int
) -> None:
    """Keras' `Adam.update_step` (keras/src/optimizers/adam.py, amsgrad off): the same ops in the same order,
    on blocks of at most `block_bytes` of rows, one block after the other. Elementwise, so each element gets
    the very operations Keras gives it: `m.assign_add((g - m) * (1 - beta_1))` becomes `m[rows] + (g[rows] -
    m[rows]) * (1 - beta_1)` written to m's rows (one float addition either way), likewise `v` and the weight.
    An IndexedSlices gradient is summed per block as tf.convert_to_tensor sums it whole (unsorted_segment_sum,
    each row's slices in their order), so the dense table-sized gradient never exists."""
    import tensorflow as tf
    from keras import ops

    dtype = variable.dtype
    lr = ops.cast(learning_rate, dtype)
    local_step = ops.cast(optimizer.iterations + 1, dtype)
    beta_1_power = ops.power(ops.cast(optimizer.beta_1, dtype), local_step)
    beta_2_power = ops.power(ops.cast(optimizer.beta_2, dtype), local_step)
    index = optimizer._get_variable_index(variable)
    m, v = optimizer._momentums[index].value, optimizer._velocities[index].value
    alpha = lr * ops.sqrt(1 - beta_2_power) / (1 - beta_1_power)
    weight = variable.value if isinstance(variable, keras.Variable) else variable

    def update_rows(bounds: tuple[int, int]) -> None:
        rows = tf.range(*bounds)
        g = ops.cast(_gradient_rows(gradient, *bounds), dtype)
        new_m = m.sparse_read(rows) + ops.multiply(ops.subtract(g, m.sparse_read(rows)), 1 - optimizer.beta_1)
        m.scatter_update(tf.IndexedSlices(new_m, rows))
        square = ops.subtract(ops.square(g), v.sparse_read(rows))
        new_v = v.sparse_read(rows) + ops.multiply(square, 1 - optimizer.beta_2)
        v.scatter_update(tf.IndexedSlices(new_v, rows))
        step = ops.divide(ops.multiply(new_m, alpha), ops.add(ops.sqrt(new_v), optimizer.epsilon))
        weight.scatter_update(tf.IndexedSlices(weight.sparse_read(rows) - step, rows))

    count = variable.shape[0]
    per_block = max(1, block_bytes * count // size_in_bytes(variable))
    blocks = [(start, min(start + per_block, count)) for start in range(0, count, per_block)]
    one_at_a_time(update_rows, blocks)


def _gradient_rows(gradient: Any, start: int, stop: int) -> Any:
    """Rows [start, stop) of the gradient, dense."""
    import tensorflow as tf

    if not isinstance(gradient, tf.IndexedSlices):
        return gradient[start:stop]
    inside = (gradient.indices >= start) & (gradient.indices < stop)
    indices = tf.boolean_mask(gradient.indices, inside) - tf.cast(start, gradient.indices.dtype)
    return tf.math.unsorted_segment_sum(tf.boolean_mask(gradient.values, inside), indices, stop - start)
