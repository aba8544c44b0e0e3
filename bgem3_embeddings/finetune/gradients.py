"""The loss and its gradient with respect to every trainable variable, on the Keras backend in use.

`fit()` differentiates the loss itself; this is the same derivative taken outside it, for what `fit()` does
not show: the exactness tests against torch's autograd and `bgem3 bench --finetune`'s step timing. Each
backend's autodiff is called the way Keras' own train step calls it: `tf.GradientTape` on TensorFlow,
`jax.value_and_grad` over `stateless_call` on JAX, `backward()` on PyTorch.

    >>> terms, grads = loss_and_gradients(finetuner, batch)   # grads[i] belongs to trainable_variables[i]
"""

from __future__ import annotations

from typing import Any

import numpy as np
from keras import ops

from bgem3_embeddings.backends.keras_backend import backend_name


def loss_and_gradients(model: Any, inputs: dict[str, Any]) -> tuple[dict[str, float], list[np.ndarray]]:
    """(the loss terms as floats, d loss / d v as numpy for v in model.trainable_variables), training mode."""
    backend = backend_name()
    if backend == "tensorflow":
        terms, grads = _tensorflow(model, inputs)
    elif backend == "jax":
        terms, grads = _jax(model, inputs)
    else:
        terms, grads = _torch(model, inputs)
    values = {name: float(ops.convert_to_numpy(value)) for name, value in terms.items()}
    return values, [as_numpy(g, v) for g, v in zip(grads, model.trainable_variables, strict=True)]


def as_numpy(grad: Any, variable: Any) -> np.ndarray:
    """A gradient as a full numpy array (zeros where the backend returned none)."""
    if grad is None:
        return np.zeros(tuple(variable.shape), dtype=np.float32)
    if backend_name() == "tensorflow":
        import tensorflow as tf

        grad = tf.convert_to_tensor(grad)  # an embedding table's IndexedSlices
    return np.asarray(ops.convert_to_numpy(grad), dtype=np.float32)


def _tensorflow(model: Any, inputs: dict[str, Any]) -> tuple[dict, list]:
    import tensorflow as tf

    with tf.GradientTape() as tape:
        terms = model(inputs, training=True)
    return terms, tape.gradient(terms["loss"], [v.value for v in model.trainable_variables])


def _jax(model: Any, inputs: dict[str, Any]) -> tuple[dict, list]:
    import jax

    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss(values: list) -> tuple[Any, dict]:
        terms, _ = model.stateless_call(values, non_trainable, inputs, training=True)
        return terms["loss"], terms

    (_, terms), grads = jax.value_and_grad(loss, has_aux=True)(trainable)
    return terms, list(grads)


def _torch(model: Any, inputs: dict[str, Any]) -> tuple[dict, list]:
    variables = [v.value for v in model.trainable_variables]
    for value in variables:
        value.grad = None
    terms = model(inputs, training=True)
    terms["loss"].backward()
    return {k: v.detach() for k, v in terms.items()}, [value.grad for value in variables]
