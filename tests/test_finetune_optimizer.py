"""finetune/optimizer.py's AdamW (Keras' arithmetic, fewer temporaries) against Keras' own AdamW.

tests/finetune_optimizer_worker.py trains the same small model (an embedding table, whose gradient is
IndexedSlices on TensorFlow, and dense layers) three `train_on_batch` steps with each optimizer, global-norm
clipping on, on TensorFlow, JAX and PyTorch, each in a process of its own (on PyTorch the update split into
many groups, on TensorFlow the embedding table's update in blocks of rows). Every weight and every moment
must be bit for bit Keras': the savings reorder when temporaries live, never what is computed. With weight
decay 0 (bgem3 finetune's default, where the decay pass is skipped), with weight decay on, and without the
clip.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.optional import require_module

BACKENDS = ("tensorflow", "jax", "torch")


# (weight decay, global clip norm): bgem3 finetune's default (0, clip 1.0), decay on, and no clip (on
# TensorFlow the only case where the table's update gets the IndexedSlices gradient itself).
SETTINGS = [(0.0, "0.5"), (0.01, "0.5"), (0.0, "none")]


@pytest.mark.parametrize(("weight_decay", "clipnorm"), SETTINGS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_adamw_equals_keras_bit_for_bit(
    backend: str, weight_decay: float, clipnorm: str, tmp_path: Path
) -> None:
    require_module(backend, f"the {backend} backend")
    out = tmp_path / "after.npz"
    worker = "tests.finetune_optimizer_worker"
    command = [sys.executable, "-m", worker, backend, str(weight_decay), clipnorm, str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(out) as saved:
        keras_side = {n.removeprefix("keras/"): saved[n] for n in saved.files if n.startswith("keras/")}
        ours = {n.removeprefix("ours/"): saved[n] for n in saved.files if n.startswith("ours/")}
    assert sorted(ours) == sorted(keras_side)  # the same state, named alike (a saved state resumes)
    assert any(n.endswith("_momentum") for n in ours) and any(n.endswith("_velocity") for n in ours)
    moved = [n for n in ours if "emb" in n and not np.any(keras_side[n])]
    assert not moved, f"no step reached {moved}"  # the steps moved the table and its moments
    differ = [n for n in ours if not np.array_equal(ours[n], keras_side[n])]
    assert not differ, f"{backend}: not Keras' AdamW's values: {differ}"


def test_groups() -> None:
    from bgem3_embeddings.finetune.optimizer_groups import groups

    assert groups([10, 10, 30, 5], 20) == [(0, 2), (2, 3), (3, 4)]
    assert groups([30], 20) == [(0, 1)]
    assert groups([], 20) == []
    assert groups([1, 1, 1], 2) == [(0, 2), (2, 3)]
