"""Which implementation of the network's math runs: chosen once, here, from the Keras backend.

TensorFlow runs `kernels_tf` (raw TensorFlow ops in the patterns oneDNN fuses, one trace for all layers);
JAX and PyTorch run `kernels_portable` (keras.ops). The backend is Keras' own choice (`KERAS_BACKEND` or
~/.keras/keras.json, read when keras is first imported): nothing of ours.

    >>> backend_kernels().__name__  # doctest: +SKIP
    'bgem3_embeddings.kernels_tf'
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

import keras

BACKENDS = ("tensorflow", "jax", "torch")


def backend_name() -> str:
    """The Keras backend this process runs: 'tensorflow', 'jax' or 'torch'."""
    return str(keras.backend.backend())


@functools.cache
def _kernels_for(backend: str) -> ModuleType:
    if backend not in BACKENDS:
        raise RuntimeError(
            f"Keras backend {backend!r} is not supported: set KERAS_BACKEND to one of {', '.join(BACKENDS)}"
        )
    name = "kernels_tf" if backend == "tensorflow" else "kernels_portable"
    return importlib.import_module(f"bgem3_embeddings.{name}")


def backend_kernels() -> ModuleType:
    """`kernels_tf` on TensorFlow, `kernels_portable` on JAX and PyTorch."""
    return _kernels_for(backend_name())

