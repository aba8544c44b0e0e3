"""The JAX runner: jax.jit of the embeddings, of the whole encoder stack, and of the heads.

Weights are passed to the compiled functions as arguments, never captured: a captured 2.3 GB of weights
would be baked into the program as constants. The 24 layers are one program, not one layer program called
24 times: XLA:CPU allocates a program's temporary buffers afresh at each call, and at 4 x 768 tokens the
per-layer calls touched 3.0M fresh pages per forward pass where the one program touches 1.0M (9.1-9.5 s of
system CPU time where it takes 2.8 s; 2-vCPU EPYC, benchmarks/findings/jax_page_faults.py,
docs/design/cpu-backends.md).
The price is compiling 24 layers per new shape: 3.0-3.6 s on that CPU (benchmarks/findings/jax_compile.py).
`trace_count` reports the compiles.

Batch shapes: rows rounded up to a power of two and the length to a bucket (`buckets`), so a new batch
shape rarely compiles; a batch of mixed lengths runs as a few length-sorted calls where its padding would
cost more than the calls (`sub_batches`, priced by `SPLIT_COSTS`).

Attention: cuDNN's flash attention told each row's length (`backends.jax.kernels.flash_attend`) where
`backends.jax.kernels.flash_attention_problem` finds none (a CUDA GPU, half precision), the batch is
right-padded and no chunking is needed; else the portable, masked attention. The choice is made here and
nowhere else.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import TYPE_CHECKING, Any

import jax
import keras
import numpy as np

import bgem3_embeddings.backends.portable.chunking as chunking
from bgem3_embeddings.backends.jax.kernels import (
    FLASH_DTYPES,
    flash_attend,
    flash_attention_problem,
    right_padded_lengths,
)
from bgem3_embeddings.backends.portable.buckets import bucket_shape, cut_back, pad_to
from bgem3_embeddings.backends.portable.kernels import attention_mask_bias, block_forward, to_dtype
from bgem3_embeddings.backends.portable.sub_batches import CPU_CALL_OVERHEAD, BatchSplitter, attention_span

if TYPE_CHECKING:
    # Type only: devices reads TensorFlow's Metal facts, which no other room may reach at run time.
    from bgem3_embeddings.devices import DeviceChoice

logger = logging.getLogger(__name__)

# What one more call and one more compiled shape are worth, in padded tokens (`sub_batches`). On the CPU a
# full-size token costs about 17 ms (58 tok/s, 2-vCPU EPYC) and a new shape 3.0-3.6 s to compile
# (docs/performance.md), about 200 tokens. On a GPU a token costs about 2 us (538k tok/s on an H200) and a
# compile seconds: a batch splits only into shapes compiled already.
SPLIT_COSTS = {"cpu": (CPU_CALL_OVERHEAD, 256.0)}
ACCELERATOR_SPLIT_COSTS = (512.0, 1e6)


def _mapped(variables: list[Any], values: Any) -> keras.StatelessScope:
    """A scope where each Keras variable reads as the traced value passed in for it."""
    return keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True)))


class JaxRunner:
    def __init__(self, model: Any, device: DeviceChoice, *, padding_side: str = "right") -> None:
        self.model = model
        self.device = device
        self.padding_side = padding_side
        self.layout: dict[str, str] = model.OUTPUT_LAYOUT
        config = model.config
        self.pad_id = int(config.pad_token_id)
        encoder_ids = {id(v) for v in model.embeddings.variables}
        for layer in model.encoder_layers:
            encoder_ids |= {id(v) for v in layer.variables}
        self.embedding_variables = list(model.embeddings.variables)
        self.head_variables = [v for v in model.variables if id(v) not in encoder_ids]
        self.layer_dtypes = model.encoder_layers[0].weight_dtypes()
        self.compiled_shapes: set[tuple[int, int]] = set()
        call_overhead, new_shape_cost = SPLIT_COSTS.get(device.kind, ACCELERATOR_SPLIT_COSTS)
        self.splitter = BatchSplitter(
            attention_span=attention_span(config.hidden_size),
            call_overhead=call_overhead,
            new_shape_cost=new_shape_cost,
            known_shapes=self.compiled_shapes,
            layout=self.layout,
            padding_side=padding_side,
        )
        block = functools.partial(
            block_forward, num_heads=config.num_attention_heads, epsilon=config.layer_norm_eps
        )

        def embed(values: Any, input_ids: Any) -> Any:
            with _mapped(self.embedding_variables, values):
                return model.embeddings(input_ids)

        def encoder_stack(
            raws: list[Any], x: Any, mask_bias: Any, key_lengths: Any, chunk: int | None
        ) -> Any:
            # key_lengths None (a separate trace): the portable masked attention.
            attention = (
                None if key_lengths is None else functools.partial(flash_attend, key_lengths=key_lengths)
            )
            for raw in raws:  # unrolled at trace time: one program for all layers
                weights = [to_dtype(w, dtype) for w, dtype in zip(raw, self.layer_dtypes, strict=True)]
                x = block(x, mask_bias, weights, chunk=chunk, attention=attention)
            return x

        def heads(values: Any, hidden: Any, input_ids: Any, attention_mask: Any, outputs: tuple) -> dict:
            with _mapped(self.head_variables, values):
                return model.heads(hidden, input_ids, attention_mask, outputs)

        self._embed = jax.jit(embed)
        self._stack = jax.jit(encoder_stack, static_argnames=("chunk",))
        self._heads = jax.jit(heads, static_argnames=("outputs",))
        self._mask_bias = jax.jit(attention_mask_bias)
        with keras.device(device.keras_device):
            self.flash_problem = flash_attention_problem(device.kind, model.compute_dtype_of_matmuls)
        if (
            self.flash_problem is not None
            and device.kind == "cuda"
            and model.compute_dtype_of_matmuls in FLASH_DTYPES
        ):
            logger.warning(
                "JAX runs attention in XLA, slower than cuDNN's flash attention: %s", self.flash_problem
            )

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray, outputs: tuple[str, ...]) -> dict:
        """The batch's outputs; a batch of mixed lengths runs as a few shorter calls where that costs less
        than padding every row to the longest (`sub_batches`)."""
        return self.splitter.run(
            lambda ids, mask: self._run_padded(ids, mask, outputs), input_ids, attention_mask
        )

    def _run_padded(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, outputs: tuple[str, ...]
    ) -> dict:
        batch, length = input_ids.shape
        self.compiled_shapes.add(bucket_shape(batch, length))
        with self._context():
            ids_j, mask_j, stack_args, chunk = self._stack_arguments(input_ids, attention_mask)
            x = self._stack(*stack_args, chunk=chunk)
            result = self._heads([v.value for v in self.head_variables], x, ids_j, mask_j, outputs=outputs)
            result = {k: np.asarray(v) for k, v in result.items()}
        return cut_back(result, self.layout, batch, length, self.padding_side)

    def stack_program(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> str:
        """XLA's optimized program of the 24 layers for this batch's padded shape, as HLO text: what runs.

        For reading, not for running: benchmarks count its GEMMs and fusions (jax_attention_variants.py).
        """
        with self._context():
            _, _, stack_args, chunk = self._stack_arguments(input_ids, attention_mask)
            return str(self._stack.lower(*stack_args, chunk=chunk).compile().as_text())

    def _context(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(keras.device(self.device.keras_device))
        stack.enter_context(jax.default_matmul_precision(self._matmul_precision()))
        return stack

    def _stack_arguments(
        self, input_ids: np.ndarray, attention_mask: np.ndarray
    ) -> tuple[Any, Any, tuple[Any, ...], int | None]:
        """The batch padded to its bucket, on the device: (ids, mask, the stack's arguments, chunk)."""
        shape = bucket_shape(*input_ids.shape)
        ids, mask = pad_to(input_ids, attention_mask, shape, self.pad_id, self.padding_side)
        chunk = chunking.LONG_INPUT_CHUNK if shape[1] > chunking.LONG_INPUT_CHUNK else None
        key_lengths = right_padded_lengths(mask) if self.flash_problem is None and chunk is None else None
        ids_j, mask_j = jax.numpy.asarray(ids), jax.numpy.asarray(mask)
        x = self._embed([v.value for v in self.embedding_variables], ids_j)
        mask_bias = self._mask_bias(mask_j)
        raws = [[v.value for v in layer.weight_variables()] for layer in self.model.encoder_layers]
        lengths_j = None if key_lengths is None else jax.numpy.asarray(key_lengths)
        return ids_j, mask_j, (raws, x, mask_bias, lengths_j), chunk

    def _matmul_precision(self) -> str:
        # float32 means float32: no TF32 on a CUDA GPU (JAX's default there); the setting is moot on a CPU.
        return "highest" if self.model.compute_dtype_of_matmuls == "float32" else "default"

    def trace_count(self) -> int:
        functions: tuple[Any, ...] = (self._embed, self._stack, self._heads, self._mask_bias)
        return sum(int(f._cache_size()) for f in functions)

    def is_out_of_memory(self, error: BaseException) -> bool:
        return "RESOURCE_EXHAUSTED" in str(error)
