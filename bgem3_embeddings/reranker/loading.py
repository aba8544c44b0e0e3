"""Build a BGEM3RerankerModel from bge-reranker-v2-m3's files: config check, weights ported by name.

The checkpoint is transformers' XLMRobertaForSequenceClassification state dict: the encoder under
"roberta." and the head as "classifier.dense.*" / "classifier.out_proj.*". Loading goes through
`loading.build_with_weights`, so the converted-weights cache, the safe torch-pickle route and the device
placement are the encoder's own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import keras

from bgem3_embeddings.checkpoint.files import CheckpointFiles
from bgem3_embeddings.checkpoint.open_weights import open_tensor_source
from bgem3_embeddings.checkpoint.porting import (
    WeightSpec,
    _dense_specs,
    encoder_weight_specs,
    port_weights,
)
from bgem3_embeddings.config import BGEM3Config, ConfigError
from bgem3_embeddings.devices import CPU, DeviceChoice
from bgem3_embeddings.loading import build_with_weights
from bgem3_embeddings.reranker.model import BGEM3RerankerModel

SEQUENCE_CLASSIFIER = "XLMRobertaForSequenceClassification"
ENCODER_PREFIX = "roberta."


def reranker_config(files: CheckpointFiles) -> BGEM3Config:
    """config.json of a one-label XLM-R sequence classifier; a ConfigError naming the file otherwise.

    A BGE-M3 (embedding) checkpoint or a classifier with several labels would give meaningless scores, so
    both are refused here, before any weights load.
    """
    config = BGEM3Config.from_json_file(files.config)  # sizes, and a clear error for a broken file
    data = json.loads(Path(files.config).read_text(encoding="utf-8"))
    architectures = data.get("architectures") or []
    if SEQUENCE_CLASSIFIER not in architectures:
        raise ConfigError(
            f"{files.config}: architectures {architectures} is not a cross-encoder reranker "
            f"({SEQUENCE_CLASSIFIER}); pass a reranker checkpoint such as BAAI/bge-reranker-v2-m3 "
            f"(an embedding model such as BAAI/bge-m3 goes to BGEM3Encoder)"
        )
    labels = data.get("num_labels", len(data.get("id2label") or {}) or 2)  # transformers' default is 2
    if labels != 1:
        raise ConfigError(
            f"{files.config}: the classifier has {labels} labels; a reranker scores with one (num_labels 1)"
        )
    return config


def reranker_weight_specs(model: BGEM3RerankerModel) -> list[WeightSpec]:
    """XLMRobertaForSequenceClassification names -> Keras variables.

    The names carry the "roberta." prefix: porting strips it only when every tensor has it, and the
    classifier's do not.
    """
    specs = [
        WeightSpec(ENCODER_PREFIX + spec.name, spec.variable, spec.transform)
        for spec in encoder_weight_specs(model)
    ]
    return [
        *specs,
        *_dense_specs("classifier.dense", model.classifier_dense),
        *_dense_specs("classifier.out_proj", model.classifier_out_proj),
    ]


def build_reranker_model(
    files: CheckpointFiles,
    *,
    precision: str = "float32",
    compute_dtype: str | None = None,
    device: DeviceChoice = CPU,
    weights_cache: bool | str | Path | None = True,
) -> BGEM3RerankerModel:
    """The reranker on `device` in `precision` with the checkpoint's weights (from the converted cache when
    it holds them). `compute_dtype` as for `loading.build_model`."""
    config = reranker_config(files)

    def make_model() -> BGEM3RerankerModel:
        # Variables start at zero (no random init to pay for): every one is overwritten by porting.
        return BGEM3RerankerModel(
            config,
            initializer="zeros",
            dtype=keras.DTypePolicy(precision),
            compute_dtype=compute_dtype,
            name="bgem3_reranker",
        )

    def port(model: Any, row_blocks: bool) -> None:
        with open_tensor_source(files.weights) as source:
            specs = reranker_weight_specs(model)
            port_weights(source, specs, where=str(files.weights), row_blocks=row_blocks)

    model: BGEM3RerankerModel = build_with_weights(make_model, port, files, precision, device, weights_cache)
    return model
