"""Build a BGEM3Model from checkpoint files: config -> Keras model -> weights ported by name."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import keras
import tensorflow as tf

from bgem3_embeddings.checkpoint.files import CheckpointFiles
from bgem3_embeddings.checkpoint.porting import load_encoder_weights, load_head_weights
from bgem3_embeddings.checkpoint.tensor_source import open_tensor_source
from bgem3_embeddings.config import BGEM3Config
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


def build_model(
    files: CheckpointFiles,
    *,
    precision: str = "float32",
    compute_dtype: str | None = None,
    tf_device: str = "/CPU:0",
    special_token_ids: Sequence[int] | None = None,
    allow_missing_heads: bool = False,
) -> tuple[BGEM3Model, tuple[str, ...]]:
    """Create the Keras model on `tf_device` in `precision` and load the checkpoint's weights.

    `compute_dtype` None computes in `precision`; "float32" with bfloat16/float16 weights computes the
    matmuls in float32 from the half-precision weights.

    Returns the model and the outputs it can produce (dense always; sparse/colbert when their heads exist).
    """
    outputs = check_heads(files, allow_missing_heads)
    base = BGEM3Config.from_json_file(files.config)
    config = BGEM3Config.from_dict(base.to_dict(), colbert_dim=_colbert_dim(files, base.hidden_size))
    with tf.device(tf_device):
        # Variables start at zero (no random init to pay for): every one is overwritten by porting.
        model = BGEM3Model(
            config,
            special_token_ids=special_token_ids,
            initializer="zeros",
            dtype=keras.DTypePolicy(precision),
            compute_dtype=compute_dtype,
            name="bgem3",
        )
        load_encoder_weights(model, files.weights)
        if files.sparse_head is not None:
            load_head_weights(model.sparse_linear, files.sparse_head)
        if files.colbert_head is not None:
            load_head_weights(model.colbert_linear, files.colbert_head)
    return model, outputs
