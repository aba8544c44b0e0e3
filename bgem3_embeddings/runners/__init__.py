"""How a padded batch goes through a model on the Keras backend in use: chosen once, here.

- TensorFlow (`tf_runner`): one `tf.function` per output set with a [None, None] signature (traced once,
  any batch shape), every layer through one shared trace; the first few short batches eagerly.
- JAX (`jax_runner`): `jax.jit` of the embeddings, of the 24 encoder layers as one program and of the
  heads; batch and length padded up to a few buckets so a new batch shape rarely compiles, a batch of
  mixed lengths split into shorter calls where that costs less than its padding. On a CUDA GPU in
  half precision, attention runs as cuDNN's flash attention for right-padded batches (`kernels_jax`).
- PyTorch (`torch_runner`): keras.ops eagerly under `torch.inference_mode()` (no autograd graph).

On the CPU every runner runs a batch of mixed lengths as a few length-sorted calls where its padding would
cost more than the calls (`sub_batches.BatchSplitter`, priced per runner); JAX also on a GPU, into shapes
it has compiled already.

Every runner takes numpy int32 (b, s) `input_ids` / `attention_mask` padded on `padding_side` and returns
numpy float32 outputs of exactly those shapes (layouts in the model's `OUTPUT_LAYOUT`).

    >>> runner = make_runner(model, device, padding_side="right")  # doctest: +SKIP
    >>> runner.run(ids, mask, ("dense_vecs",))["dense_vecs"].shape  # doctest: +SKIP
    (2, 1024)
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from bgem3_embeddings.devices import DeviceChoice
from bgem3_embeddings.kernels import backend_name
from bgem3_embeddings.runners.chunking import LONG_INPUT_CHUNK

__all__ = ["LONG_INPUT_CHUNK", "Runner", "make_runner"]


class Runner(Protocol):
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
    """The runner of `model` on `device` for the Keras backend this process runs."""
    backend = backend_name()
    if backend == "tensorflow":
        from bgem3_embeddings.runners.tf_runner import TensorFlowRunner

        return TensorFlowRunner(
            model,
            device,
            eager_max_tokens=eager_max_tokens,
            eager_batches=eager_batches,
            padding_side=padding_side,
        )
    if backend == "jax":
        from bgem3_embeddings.runners.jax_runner import JaxRunner

        return JaxRunner(model, device, padding_side=padding_side)
    from bgem3_embeddings.runners.torch_runner import TorchRunner

    return TorchRunner(model, device, padding_side=padding_side)
