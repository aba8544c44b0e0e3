"""Which GradCache step runs: the backend's module, chosen here and nowhere else.

grad_cache.py holds the portable parts; grad_cache_tf.py, grad_cache_jax.py and grad_cache_torch.py each
backend's passes. This module is apart from grad_cache.py so that the backend modules, which build on it,
are imported by nothing they import.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from keras import ops

from bgem3_embeddings.finetune.gradients import as_numpy


def backend_module() -> Any:
    """The running backend's GradCache module (the one place it is chosen)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        from bgem3_embeddings.finetune import grad_cache_tf as module
    elif backend == "jax":
        from bgem3_embeddings.finetune import grad_cache_jax as module  # type: ignore[no-redef]
    elif backend == "torch":
        from bgem3_embeddings.finetune import grad_cache_torch as module  # type: ignore[no-redef]
    else:
        raise ValueError(f"sub_batch_size needs TensorFlow, JAX or PyTorch, not Keras' {backend} backend")
    return module


def train_step(model: Any, *args: Any) -> Any:
    """The backend's GradCache train step: (data) on TensorFlow and PyTorch, (state, data) on JAX."""
    return backend_module().train_step(model, *args)


def loss_and_gradients(
    model: Any, inputs: dict[str, Any]
) -> tuple[dict[str, float], list[np.ndarray], float]:
    """gradients.loss_and_gradients by GradCache (model.sub_batch_size rows at a time), outside `fit()`,
    compiled as `fit()` compiles it, plus the largest difference between a sub-batch's re-encoded and cached
    representations (0.0: the replayed forward was pass 1's bit for bit). The dropout seed state advances
    as one training step advances it."""
    terms, grads, error = backend_module().loss_and_gradients(model, inputs)
    values = {name: float(ops.convert_to_numpy(value)) for name, value in terms.items()}
    dense = [as_numpy(g, v) for g, v in zip(grads, model.trainable_variables, strict=True)]
    return values, dense, float(ops.convert_to_numpy(error))
