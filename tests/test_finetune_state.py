"""A training state resumes in a process that built other Keras objects first (their names take Keras'
per-process numbering: "adamw_1/..."), and still refuses a state of another model."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest

from bgem3_embeddings.finetune.state import (
    TrainingStateError,
    read_state,
    restore_state,
    stable_path,
    write_state,
)


def _model_and_optimizer(units: int = 3) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(units), keras.layers.Dense(2)])
    optimizer = keras.optimizers.AdamW(1e-3)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def test_stable_path_drops_only_the_numbering() -> None:
    numbered = "adam_w_1/sequential_1_dense_3_kernel_momentum"
    assert stable_path(numbered) == "adam_w/sequential_dense_kernel_momentum"
    assert stable_path("sequential_2/dense_5/kernel") == "sequential/dense/kernel"
    assert stable_path("encoder/layer_norm/gamma") == "encoder/layer_norm/gamma"


def test_resume_after_other_models_were_built(tmp_path: Path) -> None:
    model, optimizer = _model_and_optimizer()
    for v in model.variables:
        v.assign(np.random.default_rng(0).normal(size=v.shape).astype("float32"))
    write_state(tmp_path, model, optimizer, step=7, fingerprint={"lr": 1e-3})
    _model_and_optimizer()  # another model and optimizer first: the resumed ones' names get other numbers
    again, again_optimizer = _model_and_optimizer()
    assert [v.path for v in again.variables] != [v.path for v in model.variables]
    restore_state(read_state(tmp_path), again, again_optimizer, {"lr": 1e-3})
    for a, b in zip(again.variables, model.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(a.value), np.asarray(b.value))

    wider, wider_optimizer = _model_and_optimizer(units=5)  # same names, other shapes: refused
    with pytest.raises(TrainingStateError, match="has shape"):
        restore_state(read_state(tmp_path), wider, wider_optimizer, {"lr": 1e-3})
