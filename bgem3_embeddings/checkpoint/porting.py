"""Copy Hugging Face tensors into a Keras model on the XLM-R backbone, one named tensor at a time.

Every Keras variable gets exactly one checkpoint tensor, through a transform hook (PyTorch Linear weights
are [out, in]; a Keras Dense kernel is the transpose) and a shape check. A missing tensor, a shape
mismatch or an unexpected key raises WeightPortingError naming the tensor and both shapes.

Memory: tensors are read one at a time from a TensorSource (no whole-file mmap), and the large
embedding tables are copied in row blocks, so loading peaks near the model's own size.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bgem3_embeddings.backends.keras_backend import backend_name
from bgem3_embeddings.checkpoint.open_weights import open_tensor_source
from bgem3_embeddings.checkpoint.tensor_source import TensorSource
from bgem3_embeddings.model import XLMRobertaEncoderModel

logger = logging.getLogger(__name__)

# Transforms run on the backend's tensors on TensorFlow (tf.transpose is multi-threaded, a numpy .T copy
# is not), on numpy arrays elsewhere.
Transform = Callable[[Any], Any]
# Rows per block when copying big tables: 4096 x 1024 fp32 = 16 MB in flight. TensorFlow's CPU allocator
# keeps freed transients pooled, so their size stays resident after loading: with 16384-row blocks the
# bf16 model kept +133 MB over its variables after porting, with 4096-row blocks +49 MB (same load time).
ROW_BLOCK = 4096
# Tensors in the checkpoint that BGE-M3 does not use; a sequence classifier (the reranker) keeps its encoder
# under "roberta.", and older transformers saved the position_ids buffer there too.
IGNORED_PREFIXES = ("pooler.", "roberta.pooler.")
IGNORED_NAMES = ("embeddings.position_ids", "roberta.embeddings.position_ids")


class WeightPortingError(ValueError):
    """The checkpoint does not match the model: names the tensor and both shapes."""


def identity(x: Any) -> Any:
    return x


def transpose(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x.T)
    import tensorflow as tf

    return tf.transpose(x)


@dataclass(frozen=True)
class WeightSpec:
    """One checkpoint tensor and the Keras variable it fills."""

    name: str
    variable: Any
    transform: Transform = identity

    @property
    def source_shape(self) -> tuple[int, ...]:
        """The shape the checkpoint must store (before the transform)."""
        shape = tuple(self.variable.shape)
        return shape[::-1] if self.transform is transpose else shape


def _dense_specs(prefix: str, layer: Any) -> list[WeightSpec]:
    return [WeightSpec(f"{prefix}.weight", layer.kernel, transpose), WeightSpec(f"{prefix}.bias", layer.bias)]


def _norm_specs(prefix: str, layer: Any) -> list[WeightSpec]:
    return [WeightSpec(f"{prefix}.weight", layer.gamma), WeightSpec(f"{prefix}.bias", layer.beta)]


def encoder_weight_specs(model: XLMRobertaEncoderModel) -> list[WeightSpec]:
    """Hugging Face XLMRobertaModel names (no 'roberta.' prefix) -> Keras variables."""
    emb = model.embeddings
    specs = [
        WeightSpec("embeddings.word_embeddings.weight", emb.word_embeddings.embeddings),
        WeightSpec("embeddings.position_embeddings.weight", emb.position_embeddings.embeddings),
        WeightSpec("embeddings.token_type_embeddings.weight", emb.token_type_embeddings.embeddings),
        *_norm_specs("embeddings.LayerNorm", emb.layer_norm),
    ]
    for i, block in enumerate(model.encoder_layers):
        p = f"encoder.layer.{i}"
        specs += [
            *_dense_specs(f"{p}.attention.self.query", block.query),
            *_dense_specs(f"{p}.attention.self.key", block.key),
            *_dense_specs(f"{p}.attention.self.value", block.value),
            *_dense_specs(f"{p}.attention.output.dense", block.attention_output),
            *_norm_specs(f"{p}.attention.output.LayerNorm", block.attention_layer_norm),
            *_dense_specs(f"{p}.intermediate.dense", block.intermediate),
            *_dense_specs(f"{p}.output.dense", block.output_dense),
            *_norm_specs(f"{p}.output.LayerNorm", block.output_layer_norm),
        ]
    return specs


def head_weight_specs(layer: Any) -> list[WeightSpec]:
    """A head file holds a torch Linear state dict: {weight [out, in], bias [out]}."""
    return _dense_specs("", layer)


def _blocks(rows: int, block: int) -> Iterator[slice]:
    for start in range(0, rows, block):
        yield slice(start, min(start + block, rows))


def _assign(
    variable: Any, value: np.ndarray, transform: Transform = identity, rows: slice | None = None
) -> None:
    """Write transform(value) into a Keras variable in place, or into `rows` of its axis 0."""
    if backend_name() != "tensorflow":
        _assign_portable(variable, value, transform, rows)
        return
    import tensorflow as tf

    tensor = transform(tf.convert_to_tensor(value))
    target = variable.value  # the backing tf.Variable
    if tensor.dtype != target.dtype:
        tensor = tf.cast(tensor, target.dtype)
    if rows is None:
        target.assign(tensor)
        return
    # The raw op writes the rows in place; `target[rows].assign` would first read (copy) the whole table.
    tf.raw_ops.ResourceStridedSliceAssign(
        ref=target.handle,
        begin=[rows.start] + [0] * (tensor.shape.rank - 1),
        end=[rows.stop, *tensor.shape[1:]],
        strides=[1] * tensor.shape.rank,
        value=tensor,
    )


def _assign_portable(variable: Any, value: np.ndarray, transform: Transform, rows: slice | None) -> None:
    """`_assign` on JAX and PyTorch: Keras' `assign` of the whole value (row blocks are TensorFlow's)."""
    if rows is not None:
        raise ValueError("row-block writes are TensorFlow's; port with row_blocks=False on other backends")
    variable.assign(transform(np.asarray(value)))  # Keras casts to the variable's dtype


def _strip_prefix(names: set[str], prefix: str = "roberta.") -> dict[str, str]:
    """Map checkpoint names to canonical ones, dropping a 'roberta.' prefix if every tensor has it."""
    if names and all(n.startswith(prefix) for n in names):
        return {n[len(prefix) :]: n for n in names}
    return {n: n for n in names}


def port_weights(
    source: TensorSource, specs: list[WeightSpec], *, where: str, row_blocks: bool = True
) -> None:
    """Copy every spec's tensor from `source` with shape checks; unexpected tensors are an error.

    row_blocks=False writes the big tables whole: more memory while loading, but no
    ResourceStridedSliceAssign (no kernel on the Apple GPU backend) and no copy-on-read mode left on the
    tables (a plain read of them stays free; see model.embedding_lookup).
    """
    infos = source.infos()
    stored = _strip_prefix(set(infos))
    wanted = {s.name.lstrip("."): s for s in specs}
    missing = sorted(set(wanted) - set(stored))
    unexpected = sorted(
        n for n in set(stored) - set(wanted) if not n.startswith(IGNORED_PREFIXES) and n not in IGNORED_NAMES
    )
    if missing:
        raise WeightPortingError(
            f"{where}: missing tensor(s) {', '.join(missing[:8])}"
            + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            + f"; expected shape of {missing[0]}: {wanted[missing[0]].source_shape}"
        )
    if unexpected:
        shapes = ", ".join(f"{n} {infos[stored[n]].shape}" for n in unexpected[:8])
        raise WeightPortingError(f"{where}: unexpected tensor(s) not used by BGE-M3: {shapes}")
    for name, spec in wanted.items():
        info = infos[stored[name]]
        if tuple(info.shape) != spec.source_shape:
            raise WeightPortingError(
                f"{where}: tensor {name} has shape {tuple(info.shape)} in the checkpoint, "
                f"the model expects {spec.source_shape}"
            )
    for name, spec in wanted.items():
        stored_name = stored[name]
        shape = infos[stored_name].shape
        if row_blocks and spec.transform is identity and len(shape) == 2 and shape[0] > ROW_BLOCK:
            for rows in _blocks(shape[0], ROW_BLOCK):
                _assign(spec.variable, source.read(stored_name, rows), rows=rows)
        else:
            _assign(spec.variable, source.read(stored_name), spec.transform)
    logger.debug("%s: ported %d tensors", where, len(wanted))


def load_encoder_weights(
    model: XLMRobertaEncoderModel, weights_path: Path, *, row_blocks: bool = True
) -> None:
    with open_tensor_source(weights_path) as source:
        port_weights(source, encoder_weight_specs(model), where=str(weights_path), row_blocks=row_blocks)


def load_head_weights(layer: Any, head_path: Path) -> None:
    with open_tensor_source(head_path) as source:
        port_weights(source, head_weight_specs(layer), where=str(head_path))
