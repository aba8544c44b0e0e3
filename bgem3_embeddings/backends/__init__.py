"""The Keras backends' rooms, and the one place that chooses between them.

Keras picks its backend once (`KERAS_BACKEND` or ~/.keras/keras.json, read when keras is first imported:
`keras_backend.py` reads it the same way without importing Keras). Everything backend-specific lives in
that backend's room, and this module is the only one that chooses a room:

- `tensorflow/`: `kernels` (raw TensorFlow ops in the patterns oneDNN fuses, one trace for all layers),
  `runner` (one `tf.function` per output set), `long_attention` (chunked attention in a graph), `onednn`,
  `quiet` (TensorFlow started without its start-up lines), `int8` (TFLite + XNNPACK), `metal`, `metal_ops`;
- `jax/`: `kernels` (cuDNN's flash attention told each row's length), `runner` (`jax.jit`, bucketed shapes),
  `training_flags` (XLA's memory-optimised CPU scheduler, without which remat saves nothing);
- `torch/`: `kernels` (the layer in torch ops, oneDNN's fused linear), `runner` (eager, inference_mode);
- `portable/`: `kernels` (the math in keras.ops, JAX's and PyTorch's layers), and what every runner shares:
  `sub_batches` (a mixed-length batch as the cheapest calls), `buckets` (padded shapes), `chunking`.

A parameter walks one way: `BGEM3Encoder` -> `make_runner` / `backend_kernels` here -> a room -> `portable`.
No room imports another room or this module; `portable` imports no room (tests/test_import_graph.py).
This module imports neither Keras nor a backend when imported: the package sets TensorFlow's oneDNN default
(`tensorflow/onednn.py`) before anything imports TensorFlow.

    >>> backend_kernels().__name__  # doctest: +SKIP
    'bgem3_embeddings.backends.tensorflow.kernels'
    >>> runner = make_runner(model, device, padding_side="right")  # doctest: +SKIP
    >>> runner.run(ids, mask, ("dense_vecs",))["dense_vecs"].shape  # doctest: +SKIP
    (2, 1024)
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from bgem3_embeddings.backends.keras_backend import BACKENDS, backend_name

if TYPE_CHECKING:
    from bgem3_embeddings.devices import DeviceChoice

__all__ = ["Runner", "backend_kernels", "make_runner", "prepare_training"]

# The module of the layers' math per backend: TensorFlow its own fast path, JAX and PyTorch keras.ops
# (their runners add their own fast paths around it: jax/kernels.py, torch/kernels.py).
KERNELS = {
    "tensorflow": "bgem3_embeddings.backends.tensorflow.kernels",
    "jax": "bgem3_embeddings.backends.portable.kernels",
    "torch": "bgem3_embeddings.backends.portable.kernels",
}


@functools.cache
def _kernels_for(backend: str) -> ModuleType:
    if backend not in BACKENDS:
        raise RuntimeError(
            f"Keras backend {backend!r} is not supported: set KERAS_BACKEND to one of {', '.join(BACKENDS)}"
        )
    return importlib.import_module(KERNELS[backend])


def backend_kernels() -> ModuleType:
    """`tensorflow.kernels` on TensorFlow, `portable.kernels` on JAX and PyTorch."""
    return _kernels_for(backend_name())


class Runner(Protocol):
    """How a padded batch goes through a model on one backend.

    Every runner takes numpy int32 (b, s) `input_ids` / `attention_mask` padded on `padding_side` and returns
    numpy float32 outputs of exactly those shapes (layouts in the model's `OUTPUT_LAYOUT`). On the CPU each
    runs a batch of mixed lengths as a few length-sorted calls where its padding would cost more than the
    calls (`portable/sub_batches.py`, priced per runner); JAX also on a GPU, into shapes it has compiled.
    """

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray, outputs: tuple[str, ...]) -> dict:
        """The model's outputs as numpy arrays for one padded batch."""

    def trace_count(self) -> int:
        """How many graphs were traced or compiled so far (flat after warm-up)."""

    def is_out_of_memory(self, error: BaseException) -> bool:
        """Whether `error` is the backend's out-of-memory error (the encoder then halves the batch)."""


def make_runner(
    model: Any,
    device: DeviceChoice,
    *,
    padding_side: str = "right",
    eager_max_tokens: int = 64,
    eager_batches: int = 3,
) -> Any:
    """The runner of `model` on `device` for the Keras backend this process runs.

    - TensorFlow (`tensorflow/runner.py`): one `tf.function` per output set with a [None, None] signature
      (traced once, any batch shape), every layer through one shared trace; the first few short batches
      eagerly.
    - JAX (`jax/runner.py`): `jax.jit` of the embeddings, of the 24 encoder layers as one program and of the
      heads; batch and length padded up to a few buckets so a new batch shape rarely compiles. On a CUDA
      GPU in half precision, attention runs as cuDNN's flash attention for right-padded batches.
    - PyTorch (`torch/runner.py`): the layers in torch ops, eagerly, under `torch.inference_mode()`.
    """
    backend = backend_name()
    if backend == "tensorflow":
        from bgem3_embeddings.backends.tensorflow.runner import TensorFlowRunner

        return TensorFlowRunner(
            model,
            device,
            eager_max_tokens=eager_max_tokens,
            eager_batches=eager_batches,
            padding_side=padding_side,
        )
    if backend == "jax":
        from bgem3_embeddings.backends.jax.runner import JaxRunner

        return JaxRunner(model, device, padding_side=padding_side)
    from bgem3_embeddings.backends.torch.runner import TorchRunner

    return TorchRunner(model, device, padding_side=padding_side)


def prepare_training() -> None:
    """What a backend needs set before a training process computes anything: on JAX, XLA's memory-optimised
    CPU scheduler (`jax/training_flags.py`); nothing on TensorFlow and PyTorch."""
    if backend_name() == "jax":
        from bgem3_embeddings.backends.jax.training_flags import use_memory_optimized_scheduler

        use_memory_optimized_scheduler()
