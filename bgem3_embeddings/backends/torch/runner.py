"""The PyTorch runner: the model's layers in torch ops, eagerly, under torch.inference_mode().

Eager PyTorch pays its dispatch on every op, and Keras adds its own (dtype checks, tree walks, a Layer's
__call__): about 1 ms per layer on a 2-vCPU EPYC, where the math of a short query takes a few. So the runner
drives the model as the JAX runner does: the embeddings and the heads through Keras, the 24 layers through
`backends.torch.kernels.block_forward`, the same math written in torch ops (scaled_dot_product_attention,
addmm, layer_norm), the Keras layers' outputs within float32 rounding
(benchmarks/findings/torch_dispatch.py times the two side by side: a 16-token query 1.20x with the same
GEMMs on an AMD Zen 5; tests/test_backends.py holds the runner to FlagEmbedding). A direct call of the Keras
model still runs the portable layers.

On an x86-64 CPU at float32 or bfloat16 the six projections of every layer run as oneDNN's fused linear
(+ GELU) rather than `torch.matmul` (MKL at float32: `backends.torch.kernels.dense`, 1.80x the whole model on
an AMD Zen 5), where `onednn_linear_problem` finds nothing against it.

Any batch shape runs as it is (nothing is compiled). On the CPU a batch of mixed lengths runs as a few
length-sorted calls where its padding would cost more than the calls (`sub_batches`); on a GPU a small
batch does not fill the device, so padding costs little there and every launch adds latency: one call.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
import torch

import bgem3_embeddings.backends.portable.chunking as chunking
from bgem3_embeddings.backends.portable.sub_batches import exact_shape_splitter
from bgem3_embeddings.backends.torch.kernels import block_forward, onednn_linear_problem
from bgem3_embeddings.backends.torch.kernels import dense as onednn_dense

if TYPE_CHECKING:
    # Type only: devices reads TensorFlow's Metal facts, which no other room may reach at run time.
    from bgem3_embeddings.devices import DeviceChoice

logger = logging.getLogger(__name__)


class TorchRunner:
    def __init__(self, model: Any, device: DeviceChoice, *, padding_side: str = "right") -> None:
        self.model = model
        self.device = device
        self.splitter = exact_shape_splitter(model, device.kind, padding_side)
        # The projections' GEMMs: oneDNN's fused linear where it runs here (x86-64 CPU, float32 or bf16), else
        # addmm (backends/torch/kernels.py says why). Chosen here and nowhere else.
        self.linear_problem = onednn_linear_problem(device.kind, model.compute_dtype_of_matmuls)
        self.linear = onednn_dense if self.linear_problem is None else None
        logger.debug("PyTorch projections: %s", self.linear_problem or "oneDNN's fused linear")
        self.block = functools.partial(
            block_forward,
            num_heads=model.config.num_attention_heads,
            epsilon=model.config.layer_norm_eps,
            linear=self.linear,
        )
        # Each layer's weights as block_forward takes them, held where they are the variables' own tensors
        # (Keras assigns a torch variable in place, so they stay current): 2 ms a call on a 2-vCPU EPYC to
        # gather again. Where a cast is needed (half-precision weights, float32 matmuls) it is made at each
        # call, one layer at a time, as the Keras layer makes it: no second copy of the weights is kept.
        self.held_weights = [_own_tensors(layer) for layer in model.encoder_layers]

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray, outputs: tuple[str, ...]) -> dict:
        """The batch's outputs, as one call or as the cheapest split (`sub_batches`)."""
        return self.splitter.run(
            lambda ids, mask: self._run_one(ids, mask, outputs), input_ids, attention_mask
        )

    def _run_one(self, input_ids: np.ndarray, attention_mask: np.ndarray, outputs: tuple[str, ...]) -> dict:
        batch, length = input_ids.shape
        chunk = chunking.LONG_INPUT_CHUNK if length > chunking.LONG_INPUT_CHUNK else None
        # inference_mode: no autograd graph over 568M parameters (Keras' torch variables are Parameters
        # that require grad). keras.device is per thread (Keras' global state): entered at every call,
        # since a server encodes on a worker thread of its own.
        with torch.inference_mode(), keras.device(self.device.keras_device):
            ids = keras.ops.convert_to_tensor(np.asarray(input_ids, np.int32))
            mask = keras.ops.convert_to_tensor(np.asarray(attention_mask, np.int32))
            # Padded keys masked; none to mask (read on the host: no device sync) lets SDPA take any kernel.
            keep = None if np.all(attention_mask != 0) else (mask != 0).view(batch, 1, 1, length)
            x = self.model.embeddings(ids)
            for layer, held in zip(self.model.encoder_layers, self.held_weights, strict=True):
                x = self.block(x, keep, held or layer.weight_tensors(), chunk=chunk)
            result = self.model.heads(x, ids, mask, outputs)
            return {k: keras.ops.convert_to_numpy(v) for k, v in result.items()}

    def trace_count(self) -> int:
        return 0  # nothing is traced: every op runs as it comes

    def is_out_of_memory(self, error: BaseException) -> bool:
        return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error)


def _own_tensors(layer: Any) -> tuple[Any, ...] | None:
    """The layer's weights for block_forward where each is its variable's own tensor (no cast), else None."""
    tensors = layer.weight_tensors()
    own = all(t is v.value for t, v in zip(tensors, layer.weight_variables(), strict=True))
    return tuple(tensors) if own else None
