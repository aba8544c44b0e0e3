"""`bgem3 finetune --precision bfloat16`: the projections compute in bf16 (float32 weights and optimizer
state), and the loss stays within bf16 rounding of the float32 loss, which the loss tests hold to
FlagEmbedding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.finetune_worker import FEATURES


def _loss(checkpoint: Path, bfloat16: bool) -> tuple[dict[str, float], list[str]]:
    from bgem3_embeddings.checkpoint.files import checkpoint_files_in
    from bgem3_embeddings.finetune.batch_source import model_inputs
    from bgem3_embeddings.finetune.batches import tokenize_batch
    from bgem3_embeddings.finetune.data import SampledGroup
    from bgem3_embeddings.finetune.gradients import loss_and_gradients
    from bgem3_embeddings.finetune.loss import LossSettings
    from bgem3_embeddings.finetune.train_model import M3Finetuner
    from bgem3_embeddings.finetune.trainer import _mixed_bfloat16
    from bgem3_embeddings.loading import build_model
    from bgem3_embeddings.tokenizer import BGEM3Tokenizer

    model, _ = build_model(checkpoint_files_in(checkpoint), precision="float32", weights_cache=False)
    if bfloat16:
        _mixed_bfloat16(model)
    groups = [SampledGroup(q, list(p), None) for q, p, _ in FEATURES]
    batch = tokenize_batch(BGEM3Tokenizer.from_dir(checkpoint), groups, query_max_len=32, passage_max_len=64)
    finetuner = M3Finetuner(model, LossSettings(unified=True, self_distill=True), group_size=3)
    terms, grads = loss_and_gradients(finetuner, model_inputs(batch, step=0))
    assert all(np.all(np.isfinite(g)) for g in grads)
    kinds = sorted({str(v.dtype) for v in finetuner.trainable_variables})
    compute = model.encoder_layers[0].query.compute_dtype
    return terms, [*kinds, compute]


def test_bfloat16_matmuls_stay_within_bf16_rounding_of_float32(tiny_checkpoint: Path) -> None:
    full, full_kinds = _loss(tiny_checkpoint, bfloat16=False)
    half, half_kinds = _loss(tiny_checkpoint, bfloat16=True)
    assert full_kinds == ["float32", "float32"]
    assert half_kinds == ["float32", "bfloat16"]  # weights float32, the projections compute in bf16
    assert half["loss"] != full["loss"]  # bf16 did run
    # bf16 keeps 8 bits of mantissa (relative rounding 2**-8 = 3.9e-3) per product; the scores are divided
    # by the temperature 0.02, so a loss term moves by a few percent at most
    for name in ("loss", "dense", "colbert"):
        assert half[name] == pytest.approx(full[name], rel=5e-2), name
