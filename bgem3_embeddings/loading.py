"""Build a BGEM3Model from checkpoint files: config -> Keras model -> weights ported by name."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import keras

from bgem3_embeddings.backends.keras_backend import backend_name
from bgem3_embeddings.checkpoint import converted
from bgem3_embeddings.checkpoint.files import CheckpointFiles
from bgem3_embeddings.checkpoint.open_weights import open_tensor_source
from bgem3_embeddings.checkpoint.porting import load_encoder_weights, load_head_weights
from bgem3_embeddings.config import BGEM3Config
from bgem3_embeddings.devices import CPU, DeviceChoice
from bgem3_embeddings.model import BGEM3Model

logger = logging.getLogger(__name__)


class MissingHeadError(FileNotFoundError):
    """A head file (colbert_linear.pt / sparse_linear.pt) is missing and was not explicitly opted out."""


def _colbert_dim(files: CheckpointFiles, hidden_size: int) -> int:
    """The ColBERT head's output size, read from its file (1024 for BGE-M3)."""
    if files.colbert_head is None:
        return hidden_size
    with open_tensor_source(files.colbert_head) as source:
        infos = source.infos()
    if "weight" not in infos or len(infos["weight"].shape) != 2:
        return hidden_size  # port_weights reports the precise problem
    return int(infos["weight"].shape[0])


def check_heads(files: CheckpointFiles, allow_missing_heads: bool) -> tuple[str, ...]:
    """Which outputs the checkpoint can produce; a missing head is an error unless opted out."""
    outputs = ["dense_vecs"]
    for output, path, file_name in (
        ("sparse_weights", files.sparse_head, "sparse_linear.pt"),
        ("colbert_vecs", files.colbert_head, "colbert_linear.pt"),
    ):
        if path is not None:
            outputs.append(output)
        elif not allow_missing_heads:
            raise MissingHeadError(
                f"{files.root} has no {file_name}: the {output.split('_')[0]} output would come from a "
                f"random head. Pass allow_missing_heads=True to disable that output instead."
            )
        else:
            logger.warning("%s has no %s: %s output disabled", files.root, file_name, output)
    return tuple(outputs)


def model_config(files: CheckpointFiles) -> BGEM3Config:
    """config.json with the ColBERT head's output size read from its file."""
    base = BGEM3Config.from_json_file(files.config)
    return BGEM3Config.from_dict(base.to_dict(), colbert_dim=_colbert_dim(files, base.hidden_size))


def build_model(
    files: CheckpointFiles,
    *,
    precision: str = "float32",
    compute_dtype: str | None = None,
    device: DeviceChoice = CPU,
    special_token_ids: Sequence[int] | None = None,
    allow_missing_heads: bool = False,
    weights_cache: bool | str | Path | None = True,
) -> tuple[BGEM3Model, tuple[str, ...]]:
    """Create the Keras model on `device` in `precision` and load the checkpoint's weights.

    `compute_dtype` None computes in `precision`; "float32" with bfloat16/float16 weights computes the
    matmuls in float32 from the half-precision weights. `weights_cache` (True: the default folder, see
    checkpoint/converted.py; a path; False/None: off) keeps the ported variables for the next load.

    Returns the model and the outputs it can produce (dense always; sparse/colbert when their heads exist).
    """
    outputs = check_heads(files, allow_missing_heads)
    config = model_config(files)

    def make_model() -> BGEM3Model:
        # Variables start at zero (no random init to pay for): every one is overwritten by porting.
        return BGEM3Model(
            config,
            special_token_ids=special_token_ids,
            initializer="zeros",
            dtype=keras.DTypePolicy(precision),
            compute_dtype=compute_dtype,
            name="bgem3",
        )

    def port(model: BGEM3Model, row_blocks: bool) -> None:
        load_encoder_weights(model, files.weights, row_blocks=row_blocks)
        if files.sparse_head is not None:
            load_head_weights(model.sparse_linear, files.sparse_head)
        if files.colbert_head is not None:
            load_head_weights(model.colbert_linear, files.colbert_head)

    model = build_with_weights(make_model, port, files, precision, device, weights_cache)
    return model, outputs


def build_with_weights(
    make_model: Callable[[], Any],
    port: Callable[[Any, bool], None],
    files: CheckpointFiles,
    precision: str,
    device: DeviceChoice,
    weights_cache: bool | str | Path | None,
) -> Any:
    """An XLMRobertaEncoderModel subclass on `device` with its weights: mapped from the converted-weights
    cache when it holds this checkpoint in this precision, else ported by `port(model, row_blocks)` from the
    checkpoint's files and written to the cache for the next load. Used by every model on the backbone."""
    cache_dir = converted.resolve_cache_dir(weights_cache)
    cache_path = converted.cache_file(cache_dir, files, precision) if cache_dir is not None else None
    stamp = converted.fingerprint(files, precision) if cache_path is not None else ""
    with keras.device(device.keras_device):
        if cache_path is not None:
            model, mapped = _build_from_converted(make_model, cache_path, stamp)
            if mapped:
                logger.debug("weights mapped from %s", cache_path)
                # Initialised whole, never written in row blocks: read the tables, do not gather from the
                # variables (which would copy the mapped word table once; see
                # backends.tensorflow.kernels.embedding_lookup).
                model.embeddings.gather_from_variables = False
                return model
        else:
            model = make_model()
        # Row blocks only on TensorFlow's CPU and CUDA devices: on the Apple GPU the row-block writes have no
        # Metal kernel, and a table written whole can be read and gathered (GatherV2 has one) instead of
        # ResourceGather (none); JAX arrays are immutable and PyTorch's are written whole.
        row_blocks = backend_name() == "tensorflow" and device.kind != "metal"
        port(model, row_blocks)
        model.embeddings.gather_from_variables = row_blocks
    if cache_path is not None:
        try:
            converted.write_converted(cache_path, {v.path: v for v in model.variables}, stamp)
            logger.info("wrote converted weights to %s: later loads map them", cache_path)
        except OSError as err:  # a full disk or read-only cache must not fail the load
            logger.warning("could not write converted weights to %s: %s", cache_path, err)
    return model


class _Preloaded:
    """A Keras initializer returning one ready tensor (the variable then shares its buffer)."""

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor

    def __call__(self, shape: Any, dtype: Any = None) -> Any:
        return self.tensor


def _build_from_converted(make_model: Callable[[], Any], path: Path, stamp: str) -> tuple[Any, bool]:
    """Build the model with its variables initialised from the converted cache; (model, whether it was used).

    Inside a StatelessScope Keras creates variables without values and initialises them from their
    initializer when the scope exits. Pointing each initializer at its mapped tensor means no variable is
    ever filled with zeros and then overwritten (1.7-2.5 s of page faults for 2.27 GB on a 2-core EPYC).
    When the cache is missing or stale the initializers stay "zeros" and the caller ports as before.
    """
    with keras.StatelessScope():
        model = make_model()
        variables = {v.path: v for v in model.variables}
        expected = {name: (tuple(v.shape), str(v.dtype)) for name, v in variables.items()}
        tensors = None
        # `_initializer` is where Keras keeps a deferred variable's initializer (keras 3.x); without it,
        # fall back to porting.
        if len(variables) == len(model.variables) and all(
            getattr(v, "_initializer", None) is not None for v in variables.values()
        ):
            tensors = converted.open_converted(path, stamp, expected)
        if tensors is not None:
            for name, variable in variables.items():
                variable._initializer = _Preloaded(tensors[name])
    return model, tensors is not None
