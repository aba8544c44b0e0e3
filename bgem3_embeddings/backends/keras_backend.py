"""Which Keras backend this process will run, read the way Keras reads it, without importing Keras.

Keras picks its backend once, when first imported: `KERAS_BACKEND`, else `backend` in
`$KERAS_HOME/keras.json` (default ~/.keras/keras.json), else TensorFlow. Importing Keras on the TensorFlow
backend imports TensorFlow, whose C++ start-up lines tensorflow/quiet.py keeps off the terminal: this module
lets the package know the backend before that happens. Once Keras is imported, Keras' own answer wins
(`backend_name`). A leaf: it imports nothing of the package, so every room may read it.

    >>> configured_backend({"KERAS_BACKEND": "jax"})
    'jax'
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

DEFAULT_BACKEND = "tensorflow"
BACKENDS = ("tensorflow", "jax", "torch")


def backend_name() -> str:
    """The Keras backend this process runs: 'tensorflow', 'jax' or 'torch' (imports Keras)."""
    import keras

    return str(keras.backend.backend())


def configured_backend(environ: Mapping[str, str] | None = None) -> str:
    """'tensorflow', 'jax' or 'torch' (or whatever else the configuration names: Keras will refuse it)."""
    if environ is None and "keras" in sys.modules:
        keras = sys.modules["keras"]
        return str(keras.backend.backend())
    env = os.environ if environ is None else environ
    if env.get("KERAS_BACKEND"):
        return env["KERAS_BACKEND"]
    home = Path(env.get("KERAS_HOME") or Path.home() / ".keras")
    try:
        backend = json.loads((home / "keras.json").read_text(encoding="utf-8")).get("backend")
    except (OSError, ValueError, AttributeError):
        return DEFAULT_BACKEND
    return backend if isinstance(backend, str) and backend else DEFAULT_BACKEND


class BackendFeatureError(RuntimeError):
    """A feature that needs Keras' TensorFlow backend was asked for on another backend."""


def require_tensorflow(feature: str, backend: str | None = None) -> None:
    """Raise BackendFeatureError naming `feature` unless Keras runs (`backend`: this process's) on
    TensorFlow, as int8 and export need.

        >>> require_tensorflow("bgem3 export", backend="tensorflow")
    """
    backend = backend or configured_backend()
    if backend != "tensorflow":
        raise BackendFeatureError(
            f"{feature} needs Keras' TensorFlow backend; this process runs Keras on {backend} "
            f"(set KERAS_BACKEND=tensorflow)"
        )
