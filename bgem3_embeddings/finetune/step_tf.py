"""The whole-batch training step on TensorFlow: Keras' own, with an embedding table's gradient summed per row.

TensorFlow hands a gathered table's gradient over as IndexedSlices with one row per token, a token seen
twice in the batch giving two rows of the same index. Keras' `global_clipnorm` then measures the norm of
those rows as they are, not of their sums: 3.562 where the true gradient norm is 3.541 on the tests' batch,
and a clipped step 5.1e-4 away from FlagEmbedding's (whose torch autograd sums them). Summing the rows of
each index first gives the true norm and the same update.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from bgem3_embeddings.finetune.grad_cache import scaled


def summed_rows(grad: Any) -> Any:
    """IndexedSlices with one row per index (their sum); any other gradient as it is."""
    if not isinstance(grad, tf.IndexedSlices):
        return grad
    unique, position = tf.unique(grad.indices)
    values = tf.math.unsorted_segment_sum(grad.values, position, tf.shape(unique)[0])
    return tf.IndexedSlices(values, unique, grad.dense_shape)


def train_step(model: Any, data: Any) -> dict:
    """Keras' TensorFlow `train_step(self, data)` (forward, loss, tape, optimizer, metrics), rows summed."""
    x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        loss = model.compute_loss(x=x, y_pred=y_pred, training=True)
    grads = tape.gradient(scaled(model, loss), model.trainable_weights)
    model.optimizer.apply_gradients(
        zip([summed_rows(g) for g in grads], model.trainable_weights, strict=True)
    )
    return model.compute_metrics(x, None, y_pred, sample_weight=None)
