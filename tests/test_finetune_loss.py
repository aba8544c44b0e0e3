"""Our M3 fine-tuning loss and gradients against FlagEmbedding's trainer and torch's autograd, per backend.

The reference is FlagEmbedding's own `EncoderOnlyEmbedderM3Model` (its `finetune` package) in training mode
on the tiny checkpoint with dropout set to 0 in a copy of its config.json, fed by its own collator; its loss
is differentiated by torch. tests/finetune_worker.py computes ours on TensorFlow, JAX and PyTorch, each in a
process of its own, from the very same token ids: the loss within 1e-5 relative, the gradient of every
parameter (embeddings, every layer, both heads) within 1e-5 of the gradients' scale (and 5e-5 of the
tensor's own largest), and the weights after
one SGD step of `fit()` within float32 rounding of torch's SGD step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.finetune_exactness import (
    GRAD_RTOL,
    MAX_GRAD_NORM,
    assert_one_sgd_step,
    gradients_of,
    reference_step,
    run_worker,
)
from tests.finetune_worker import CASES, FEATURES, GROUP_SIZE, SGD_CASE, TEMPERATURE
from tests.optional import require_module

torch = require_module("torch", "the reference trainer runs on torch (the dev extra)")

BACKENDS = ("tensorflow", "jax", "torch")
LOSS_RTOL = 1e-5


def _reference_case(
    checkpoint: Path, model_kwargs: dict, no_in_batch_neg: bool, kd: bool, max_lengths: tuple[int, int]
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """FlagEmbedding's batch, loss and gradients (and the weights after one SGD step) for one case."""
    from tests.flagembedding_ref import m3_collator, m3_finetune_model

    # the trainer's argument defaults (the model class's own differ: unified_finetuning=True, m3_kd_loss)
    defaults = {"unified_finetuning": False, "use_self_distill": False, "kd_loss_type": "kl_div"}
    model = m3_finetune_model(
        checkpoint, temperature=TEMPERATURE, normalize_embeddings=True, **(defaults | model_kwargs)
    )
    collator = m3_collator(checkpoint, query_max_len=max_lengths[0], passage_max_len=max_lengths[1])
    batch = collator([(q, p, s if kd else None) for q, p, s in FEATURES])
    loss = model(
        batch["queries"], batch["passages"], batch["teacher_scores"], no_in_batch_neg_flag=no_in_batch_neg
    ).loss
    result = reference_step(loss, _named_parameters(model))
    q, p = batch["queries"], batch["passages"]
    inputs = {
        "query_input_ids": q["input_ids"],
        "query_attention_mask": q["attention_mask"],
        "passage_input_ids": p["input_ids"],
        "passage_attention_mask": p["attention_mask"],
    }
    arrays = {k: v.numpy().astype(np.int32) for k, v in inputs.items()}
    arrays["step"] = np.zeros((len(FEATURES),), np.int32)
    if kd:
        arrays["teacher_scores"] = np.asarray(batch["teacher_scores"], np.float32).reshape(
            len(FEATURES), GROUP_SIZE
        )
    return result, arrays


def _named_parameters(model: Any) -> dict[str, Any]:
    params = dict(model.model.named_parameters())
    for head in ("colbert_linear", "sparse_linear"):
        layer = getattr(model, head)
        if layer is not None:
            params |= {f"{head}.{name}": value for name, value in layer.named_parameters()}
    return params


@pytest.fixture(scope="module")
def reference(no_dropout_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cases, arrays = {}, {}
    for name, model_kwargs, no_in_batch_neg, kd, max_lengths in CASES:
        cases[name], batch = _reference_case(
            no_dropout_checkpoint, model_kwargs, no_in_batch_neg, kd, max_lengths
        )
        arrays |= {f"{name}/{key}": value for key, value in batch.items()}
    batches = tmp_path_factory.mktemp("finetune_batches") / "batches.npz"
    np.savez(batches, **arrays)
    return {"cases": cases, "batches": batches, "arrays": arrays}


@pytest.fixture(scope="module", params=BACKENDS)
def ours(
    request: pytest.FixtureRequest,
    reference: dict,
    no_dropout_checkpoint: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, np.ndarray]:
    out = tmp_path_factory.mktemp(f"finetune_{request.param}") / "out.npz"
    return run_worker(
        "tests.finetune_worker", request.param, no_dropout_checkpoint, reference["batches"], out
    )


def test_the_batches_are_truncated_where_a_case_says(reference: dict) -> None:
    """The 'truncated' case cuts queries and passages at 8 and 12 tokens; the others cut nothing."""
    arrays = reference["arrays"]
    assert arrays["truncated/query_input_ids"].shape[1] == 8
    assert arrays["truncated/passage_input_ids"].shape[1] == 12
    assert arrays["dense/passage_input_ids"].shape[1] > 12


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_loss_equals_flagembedding(ours: dict, reference: dict, case: str) -> None:
    expected = reference["cases"][case]["loss"]
    assert float(ours[f"{case}/term/loss"]) == pytest.approx(expected, rel=LOSS_RTOL)


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_every_gradient_equals_torch_autograd(ours: dict, reference: dict, case: str) -> None:
    expected = reference["cases"][case]["grads"]
    got = gradients_of(ours, case)
    # every parameter torch differentiated is one of ours; ours differentiates nothing else (the heads of a
    # dense-only run are variables of ours, not of FlagEmbedding's model, and get no gradient)
    assert set(expected) <= set(got)
    assert all(not np.any(got[name]) for name in set(got) - set(expected))
    largest = max(float(np.abs(g).max()) for g in expected.values())
    for name, ref in expected.items():
        error = float(np.abs(got[name] - ref).max())
        # within 1e-5 of the model's gradient scale everywhere (float32 sums over the batch's tokens in
        # another order differ by up to 2e-6 of it here), and within 5e-5 of the tensor's own largest
        assert error <= GRAD_RTOL * largest, (name, error, largest)
        if not name.endswith("attention.self.key.bias"):
            # q.(k + b) - q.k is one constant per query row, which softmax removes: the key bias' gradient
            # is 0 in exact arithmetic, and both sides hold float32 noise there, compared above only.
            assert error <= 5 * GRAD_RTOL * float(np.abs(ref).max()), (name, error, float(np.abs(ref).max()))


def test_one_sgd_step_of_fit_equals_torch(ours: dict, reference: dict) -> None:
    """One clipped SGD step (the gradient's norm is above the clip, so the norm itself is held to torch's)."""
    case = reference["cases"][SGD_CASE]
    assert case["grad_norm"] > 2 * MAX_GRAD_NORM
    # BGE-M3 does not use the pooler; our model has none
    assert_one_sgd_step(ours, SGD_CASE, case, skip="pooler.")
