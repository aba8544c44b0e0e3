"""The PyTorch runner: keras.ops eagerly under torch.inference_mode(), on the device Keras was told.

On an x86-64 CPU at float32 or bfloat16 the six projections of every layer run as oneDNN's fused linear
(+ GELU) rather than `torch.matmul` (MKL at float32: `kernels_torch.py`, 1.80x the whole model on an AMD
Zen 5), where `onednn_linear_problem` finds nothing against it.

Any batch shape runs as it is (nothing is compiled). On the CPU a batch of mixed lengths runs as a few
length-sorted calls where its padding would cost more than the calls (`sub_batches`); on a GPU a small
batch does not fill the device, so padding costs little there and every launch adds latency: one call.
"""

from __future__ import annotations

import logging
from typing import Any

import keras
import numpy as np
import torch

import bgem3_embeddings.runners.chunking as chunking
from bgem3_embeddings.devices import DeviceChoice
from bgem3_embeddings.kernels_torch import dense as onednn_dense
from bgem3_embeddings.kernels_torch import onednn_linear_problem
from bgem3_embeddings.runners.sub_batches import exact_shape_splitter

logger = logging.getLogger(__name__)


class TorchRunner:
    def __init__(self, model: Any, device: DeviceChoice, *, padding_side: str = "right") -> None:
        self.model = model
        self.device = device
        self.splitter = exact_shape_splitter(model, device.kind, padding_side)
        # The projections' GEMMs: oneDNN's fused linear where it runs here (x86-64 CPU, float32 or bf16), else
        # keras.ops (kernels_torch.py says why). Chosen here and nowhere else.
        self.linear_problem = onednn_linear_problem(device.kind, model.compute_dtype_of_matmuls)
        model.use_linear(onednn_dense if self.linear_problem is None else None)
        logger.debug("PyTorch projections: %s", self.linear_problem or "oneDNN's fused linear")

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray, outputs: tuple[str, ...]) -> dict:
        """The batch's outputs, as one call or as the cheapest split (`sub_batches`)."""
        return self.splitter.run(
            lambda ids, mask: self._run_one(ids, mask, outputs), input_ids, attention_mask
        )

    def _run_one(self, input_ids: np.ndarray, attention_mask: np.ndarray, outputs: tuple[str, ...]) -> dict:
        long_input = input_ids.shape[1] > chunking.LONG_INPUT_CHUNK
        # inference_mode: no autograd graph over 568M parameters (Keras' torch variables are Parameters
        # that require grad). keras.device is per thread (Keras' global state): entered at every call,
        # since a server encodes on a worker thread of its own.
        with torch.inference_mode(), keras.device(self.device.keras_device):
            self.model.set_query_chunk_size(chunking.LONG_INPUT_CHUNK if long_input else None)
            try:
                inputs = {
                    "input_ids": np.asarray(input_ids, np.int32),
                    "attention_mask": np.asarray(attention_mask, np.int32),
                }
                result = self.model(inputs, outputs=outputs)
            finally:
                self.model.set_query_chunk_size(None)
            return {k: keras.ops.convert_to_numpy(v) for k, v in result.items()}

    def trace_count(self) -> int:
        return 0  # nothing is traced: every op runs as it comes

    def is_out_of_memory(self, error: BaseException) -> bool:
        return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error)
