"""The TensorFlow runner: one tf.function per output set, traced once for any batch shape.

On the CPU a batch of mixed lengths runs as a few length-sorted calls of the same function where its
padding would cost more than the calls (`sub_batches`); on the Apple GPU, one call (as
`backends/torch/runner.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

import bgem3_embeddings.backends.portable.chunking as chunking
from bgem3_embeddings.backends.portable.sub_batches import exact_shape_splitter
from bgem3_embeddings.backends.tensorflow.metal import remapper_off

if TYPE_CHECKING:
    # Type only: devices reads TensorFlow's Metal facts, which no other room may reach at run time.
    from bgem3_embeddings.devices import DeviceChoice

INPUT_SIGNATURE = [
    tf.TensorSpec([None, None], tf.int32, name="input_ids"),
    tf.TensorSpec([None, None], tf.int32, name="attention_mask"),
]


class TensorFlowRunner:
    """Runs a model traced, except its first `eager_batches` batches of at most `eager_max_tokens` padded
    tokens, which run eagerly: a process that encodes one query never builds the graph (start-up,
    docs/performance.md)."""

    def __init__(
        self,
        model: Any,
        device: DeviceChoice,
        *,
        eager_max_tokens: int,
        eager_batches: int,
        padding_side: str = "right",
    ) -> None:
        self.model = model
        self.device = device
        self.splitter = exact_shape_splitter(model, device.kind, padding_side)
        self.eager_max_tokens = eager_max_tokens
        self.eager_batches_left = eager_batches
        self.functions: dict[tuple[tuple[str, ...], bool], Any] = {}
        # On the Apple GPU no MatMul + BiasAdd + activation is fused (metal.remapper_off); the CPU keeps
        # oneDNN's fused MatMul + BiasAdd + GELU.
        self.graph_options: Callable[[], contextlib.AbstractContextManager[Any]] = (
            remapper_off if device.kind == "metal" else contextlib.nullcontext
        )

    def inference_function(self, outputs: tuple[str, ...], long_input: bool = False) -> Callable[..., dict]:
        """A tf.function for these outputs with a [None, None] signature: traced once, any batch shape.

        `run` calls it inside `self.graph_options()`; a caller of its own should do the same on Metal."""
        key = (outputs, long_input)
        if key not in self.functions:
            model = self.model
            chunk = chunking.LONG_INPUT_CHUNK if long_input else None

            # autograph=False: the model has no Python control flow on tensors, and converting every
            # layer's code costs start-up time in each new process.
            @tf.function(input_signature=INPUT_SIGNATURE, autograph=False)
            def run(input_ids: tf.Tensor, attention_mask: tf.Tensor) -> dict:
                # Runs in Python only while tracing: the chunk size becomes part of this graph alone.
                model.set_query_chunk_size(chunk)
                model.share_block_trace = True
                try:
                    return model({"input_ids": input_ids, "attention_mask": attention_mask}, outputs=outputs)
                finally:
                    model.set_query_chunk_size(None)
                    model.share_block_trace = False

            self.functions[key] = run
        return self.functions[key]

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray, outputs: tuple[str, ...]) -> dict:
        """The batch's outputs: one eager call for the first few short batches (eager dispatch costs per op,
        so they never split), else the traced function, as one call or as the cheapest split
        (`sub_batches`)."""
        if self.eager_batches_left > 0 and input_ids.size <= self.eager_max_tokens:
            self.eager_batches_left -= 1
            return self._run_one(input_ids, attention_mask, outputs, eager=True)
        return self.splitter.run(
            lambda ids, mask: self._run_one(ids, mask, outputs, eager=False), input_ids, attention_mask
        )

    def _run_one(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, outputs: tuple[str, ...], *, eager: bool
    ) -> dict:
        with tf.device(self.device.tf_device), self.graph_options():
            ids, mask = tf.constant(input_ids, tf.int32), tf.constant(attention_mask, tf.int32)
            if eager:
                result = self.model({"input_ids": ids, "attention_mask": mask}, outputs=outputs)
            else:
                long_input = input_ids.shape[1] > chunking.LONG_INPUT_CHUNK
                result = self.inference_function(outputs, long_input)(ids, mask)
        return {k: v.numpy() for k, v in result.items()}

    def trace_count(self) -> int:
        return sum(int(f.experimental_get_tracing_count()) for f in self.functions.values())

    def is_out_of_memory(self, error: BaseException) -> bool:
        return isinstance(error, tf.errors.ResourceExhaustedError)
