"""The training pass (finetune/dropout.py): at rate 0 it is the model's own forward pass, remat changes no
gradient (with dropout too: the recomputed layer drops the same units, on every backend), and dropout drops
at transformers' rate, differently at each step and never at inference."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from keras import ops

from tests.finetune_worker import FEATURES


@pytest.fixture(scope="module")
def pieces(tiny_checkpoint: Path) -> dict:
    from bgem3_embeddings.checkpoint.files import checkpoint_files_in
    from bgem3_embeddings.finetune.batch_source import model_inputs
    from bgem3_embeddings.finetune.batches import tokenize_batch
    from bgem3_embeddings.finetune.data import SampledGroup
    from bgem3_embeddings.loading import build_model
    from bgem3_embeddings.tokenizer import BGEM3Tokenizer

    model, _ = build_model(checkpoint_files_in(tiny_checkpoint), precision="float32", weights_cache=False)
    groups = [SampledGroup(q, list(p), None) for q, p, _ in FEATURES]
    batch = tokenize_batch(
        BGEM3Tokenizer.from_dir(tiny_checkpoint), groups, query_max_len=32, passage_max_len=64
    )
    return {"model": model, "inputs": model_inputs(batch, step=0)}


def _finetuner(model: object, dropout: object) -> object:
    from bgem3_embeddings.finetune.loss import LossSettings
    from bgem3_embeddings.finetune.train_model import M3Finetuner

    return M3Finetuner(model, LossSettings(unified=True, self_distill=True), group_size=3, dropout=dropout)


def test_rate_zero_is_the_models_own_pass_and_remat_changes_no_gradient(pieces: dict) -> None:
    from bgem3_embeddings.finetune.dropout import EncoderDropout
    from bgem3_embeddings.finetune.gradients import loss_and_gradients

    model, inputs = pieces["model"], pieces["inputs"]
    ids, mask = inputs["passage_input_ids"], inputs["passage_attention_mask"]
    plain = ops.convert_to_numpy(model.encode_hidden(ids, mask))
    remat = EncoderDropout(0.0, 0.0, remat=True)
    assert remat.active  # the training pass runs (for remat), with nothing dropped
    np.testing.assert_allclose(
        ops.convert_to_numpy(remat.encode_hidden(model, ids, mask)), plain, rtol=1e-5, atol=1e-5
    )
    terms, grads = loss_and_gradients(_finetuner(model, None), inputs)
    terms_remat, grads_remat = loss_and_gradients(_finetuner(model, remat), inputs)
    assert terms_remat["loss"] == pytest.approx(terms["loss"], rel=1e-6)
    for g, r in zip(grads, grads_remat, strict=True):
        np.testing.assert_allclose(r, g, rtol=1e-4, atol=1e-6 * max(1.0, float(np.abs(g).max())))


def test_dropout_drops_at_its_rate_each_step_anew_and_never_at_inference(pieces: dict) -> None:
    from bgem3_embeddings.finetune.dropout import EncoderDropout

    model, inputs = pieces["model"], pieces["inputs"]
    dropout = EncoderDropout(0.1, 0.1, seed=7)
    x = ops.ones((64, 128))
    dropped = ops.convert_to_numpy(dropout.drop(x, 0.1))
    share = float(np.mean(dropped == 0))
    assert 0.08 < share < 0.12  # 8,192 draws at p = 0.1
    np.testing.assert_allclose(dropped[dropped != 0], 1 / 0.9, rtol=1e-6)  # inverted dropout, as torch's
    ids, mask = inputs["passage_input_ids"], inputs["passage_attention_mask"]
    first = ops.convert_to_numpy(dropout.encode_hidden(model, ids, mask))
    second = ops.convert_to_numpy(dropout.encode_hidden(model, ids, mask))
    plain = ops.convert_to_numpy(model.encode_hidden(ids, mask))
    assert np.abs(first - plain).max() > 1e-2 and np.abs(first - second).max() > 1e-2
    finetuner = _finetuner(model, dropout)
    at_inference = [float(ops.convert_to_numpy(finetuner(inputs, training=False)["loss"])) for _ in range(2)]
    assert at_inference[0] == at_inference[1]  # no dropout outside training
    in_training = [float(ops.convert_to_numpy(finetuner(inputs, training=True)["loss"])) for _ in range(2)]
    assert in_training[0] != in_training[1] and at_inference[0] not in in_training


def remat_gradient_gap(checkpoint: Path) -> float:
    """The largest difference between the gradients of one dropout step with and without remat, from the
    same seed (relative to the gradients' scale): 0 up to float32 rounding when the recomputation replays the
    forward pass's masks."""
    from bgem3_embeddings.checkpoint.files import checkpoint_files_in
    from bgem3_embeddings.finetune.batch_source import model_inputs
    from bgem3_embeddings.finetune.batches import tokenize_batch
    from bgem3_embeddings.finetune.data import SampledGroup
    from bgem3_embeddings.finetune.dropout import EncoderDropout
    from bgem3_embeddings.finetune.gradients import loss_and_gradients
    from bgem3_embeddings.loading import build_model
    from bgem3_embeddings.tokenizer import BGEM3Tokenizer

    model, _ = build_model(checkpoint_files_in(checkpoint), precision="float32", weights_cache=False)
    groups = [SampledGroup(q, list(p), None) for q, p, _ in FEATURES]
    batch = tokenize_batch(BGEM3Tokenizer.from_dir(checkpoint), groups, query_max_len=32, passage_max_len=64)
    inputs = model_inputs(batch, step=0)
    runs = [
        loss_and_gradients(_finetuner(model, EncoderDropout(0.1, 0.1, seed=5, remat=remat)), inputs)
        for remat in (False, True)
    ]
    (_, plain), (_, remat) = runs
    scale = max(float(np.abs(g).max()) for g in plain)
    return max(float(np.abs(a - b).max()) for a, b in zip(plain, remat, strict=True)) / scale


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_remat_replays_the_dropout_masks(backend: str, tiny_checkpoint: Path) -> None:
    code = (
        "import os, sys; os.environ['KERAS_BACKEND'] = sys.argv[1]\n"
        "from pathlib import Path\n"
        "from tests.test_finetune_dropout import remat_gradient_gap\n"
        "print('gap', remat_gradient_gap(Path(sys.argv[2])))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, backend, str(tiny_checkpoint)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    gap = float(done.stdout.split("gap")[-1])
    assert gap <= 1e-5, gap  # other masks in the recomputation would be off by the gradients' own size
