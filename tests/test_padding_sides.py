"""Right and left padding give the reference's outputs (transformers' model + FlagEmbedding's heads).

The reference pads on the right, as FlagEmbedding does; a user (or another runtime) may pad on the left.
Either way each text must get the reference's dense, sparse and ColBERT outputs. The export formats are
checked the same way in tests/test_export.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bgem3_embeddings import BGEM3Encoder
from bgem3_embeddings.batching import pad_batch
from tests.reference_m3 import ReferenceM3, assert_batch_matches_reference

TEXTS = [
    "What is BGE M3?",
    "BGE M3 is an embedding model supporting dense retrieval, lexical matching and multi-vector interaction.",
    "",
    "Der schnelle braune Fuchs springt über den faulen Hund. 東京は日本の首都です。",
    "a",
    "BM25 is a bag-of-words retrieval function that ranks a set of documents",
]


@pytest.fixture(scope="module")
def reference(tiny_checkpoint: Path) -> ReferenceM3:
    return ReferenceM3(tiny_checkpoint)  # transformers' own tokenizer


@pytest.mark.parametrize("side", ["right", "left"])
def test_model_on_a_padded_batch_equals_the_reference(
    side: str, tiny_encoder: Any, reference: ReferenceM3
) -> None:
    """BGEM3Model on a batch padded by transformers' tokenizer itself (padding_side=...)."""
    batch = reference.tokenizer(TEXTS, padding=True, padding_side=side, return_tensors="np")
    ids, mask = batch["input_ids"].astype(np.int32), batch["attention_mask"].astype(np.int32)
    assert mask.min() == 0 and (mask[:, 0 if side == "left" else -1] == 0).any(), "the batch must be padded"
    out = {
        k: np.asarray(v) for k, v in tiny_encoder.model({"input_ids": ids, "attention_mask": mask}).items()
    }
    assert_batch_matches_reference(out, ids, mask, reference.encode(TEXTS))


@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_batch_then_model_equals_the_reference(
    side: str, tiny_encoder: Any, reference: ReferenceM3
) -> None:
    token_ids = reference.tokenizer(TEXTS)["input_ids"]
    ids, mask = pad_batch(token_ids, tiny_encoder.config.pad_token_id, side)
    out = {
        k: np.asarray(v) for k, v in tiny_encoder.model({"input_ids": ids, "attention_mask": mask}).items()
    }
    assert_batch_matches_reference(out, ids, mask, reference.encode_ids(token_ids))


@pytest.mark.parametrize("eager", [False, True], ids=["traced", "eager"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_encoder_with_padding_side_equals_the_reference(
    side: str, eager: bool, tiny_checkpoint: Path, reference: ReferenceM3
) -> None:
    """Both ways a batch can run (the traced function, or eagerly for short batches), both padding sides."""
    paths = {"eager_max_tokens": 100_000, "eager_batches": 100} if eager else {"eager_batches": 0}
    encoder = BGEM3Encoder(tiny_checkpoint, precision="float32", device="cpu", padding_side=side, **paths)
    ours = encoder.encode(TEXTS, batch_size=4, return_sparse=True, return_colbert_vecs=True)
    ref = reference.encode(TEXTS)
    np.testing.assert_allclose(ours["dense_vecs"], ref["dense_vecs"], atol=1e-5)
    for i, (a, b) in enumerate(zip(ours["lexical_weights"], ref["lexical_weights"], strict=True)):
        assert a.keys() == b.keys(), f"text {i}: token sets differ"
        np.testing.assert_allclose([a[k] for k in b], [b[k] for k in b], atol=1e-5, rtol=1e-5)
    for a, b in zip(ours["colbert_vecs"], ref["colbert_vecs"], strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=1e-5)
    assert (encoder.trace_count() == 0) == eager, "the batches did not take the path named"


def test_padding_side_is_validated(tiny_checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="padding_side must be 'right' or 'left', got 'middle'"):
        BGEM3Encoder(tiny_checkpoint, device="cpu", padding_side="middle")
    with pytest.raises(ValueError, match="padding side must be 'right' or 'left'"):
        pad_batch([[0, 2]], 1, "top")
