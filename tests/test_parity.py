"""Numeric parity with the reference: transformers' PyTorch XLMRobertaModel and FlagEmbedding's M3 heads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bgem3_embeddings.batching import pad_batch
from tests.reference_m3 import ReferenceM3
from tests.tolerances import APPROX, UNIT_VECTORS

TEXTS = [
    "What is BGE M3?",
    "Defination of BM25",
    "BGE M3 is an embedding model supporting dense retrieval, lexical matching and multi-vector interaction.",
    "",
    "Der schnelle braune Fuchs springt über den faulen Hund. 東京は日本の首都です。",
    "BM25 is a bag-of-words retrieval function that ranks a set of documents based on the query terms "
    "appearing in each document " * 3,
    "a",
]


@pytest.fixture(scope="module")
def reference(tiny_checkpoint: Path) -> ReferenceM3:
    return ReferenceM3(tiny_checkpoint)  # transformers' own tokenizer: ours is compared, not shared


def _keras_hidden(encoder: Any, texts: list[str], max_length: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    ids, mask = pad_batch(encoder.tokenize(texts, max_length), encoder.tokenizer.pad_token_id)
    return encoder.model.encode_hidden(ids, mask).numpy(), mask


def test_last_hidden_state_matches_transformers(tiny_encoder: Any, reference: ReferenceM3) -> None:
    # Mixed lengths in one batch: most rows carry padding.
    ours, mask = _keras_hidden(tiny_encoder, TEXTS)
    ref, ref_mask = reference.last_hidden_state(TEXTS)
    np.testing.assert_array_equal(mask, ref_mask)
    assert mask.min() == 0, "the batch must contain padding for this test to mean anything"
    diff = np.abs(ours - ref)[mask.astype(bool)]
    assert diff.max() <= 1e-5, f"max abs diff {diff.max():.2e}"
    assert np.abs(ref).mean() > 0.1  # the weights are non-trivial


def test_left_padding_gives_the_same_hidden_states(tiny_encoder: Any) -> None:
    texts = ["short", "a much longer text with many more tokens in it"]
    right, right_mask = _keras_hidden(tiny_encoder, texts)
    tok = tiny_encoder.tokenizer
    ids = [tok(t)["input_ids"] for t in texts]
    width = max(map(len, ids))
    left_ids = np.array([[tok.pad_token_id] * (width - len(i)) + i for i in ids], dtype=np.int32)
    left_mask = (left_ids != tok.pad_token_id).astype(np.int32)
    left = tiny_encoder.model.encode_hidden(left_ids, left_mask).numpy()
    n = len(ids[0])
    np.testing.assert_allclose(left[0, width - n :], right[0, :n], atol=1e-5)


def test_heads_match_the_reference_semantics(tiny_encoder: Any, reference: ReferenceM3) -> None:
    ours = tiny_encoder.encode(TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True)
    ref = reference.encode(TEXTS)
    np.testing.assert_allclose(ours["dense_vecs"], ref["dense_vecs"], atol=1e-5)
    for i, (a, b) in enumerate(zip(ours["lexical_weights"], ref["lexical_weights"], strict=True)):
        assert a.keys() == b.keys(), f"text {i}: token sets differ: {sorted(a)} vs {sorted(b)}"
        for token in a:
            assert abs(a[token] - b[token]) <= 1e-5, f"text {i} token {token}: {a[token]} vs {b[token]}"
    assert any(ref["lexical_weights"]), "the reference produced no lexical weights: the test would be empty"
    for i, (a, b) in enumerate(zip(ours["colbert_vecs"], ref["colbert_vecs"], strict=True)):
        assert a.shape == b.shape, f"text {i}: colbert shape {a.shape} vs {b.shape}"
        np.testing.assert_allclose(a, b, atol=1e-5)
        np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)


def test_empty_string_is_encoded_like_the_reference(tiny_encoder: Any, reference: ReferenceM3) -> None:
    ours = tiny_encoder.encode([""], return_sparse=True, return_colbert_vecs=True)
    ref = reference.encode([""])
    assert ours["lexical_weights"] == [{}] == ref["lexical_weights"]
    assert ours["colbert_vecs"][0].shape == ref["colbert_vecs"][0].shape == (1, tiny_encoder.hidden_size)
    np.testing.assert_allclose(ours["dense_vecs"], ref["dense_vecs"], atol=1e-5)


def test_compute_score_matches_the_reference(tiny_encoder: Any, reference: ReferenceM3) -> None:
    pairs = [(q, p) for q in TEXTS[:2] for p in TEXTS[2:6]]
    weights = [0.4, 0.2, 0.4]
    ours = tiny_encoder.compute_score(pairs, max_passage_length=16, weights_for_different_modes=weights)
    ref = reference.compute_score(pairs, weights, max_passage_length=16)
    assert set(ours) == {"dense", "sparse", "colbert", "sparse+dense", "colbert+sparse+dense"}
    for key in ref:
        np.testing.assert_allclose(ours[key], ref[key], atol=1e-5, err_msg=key)


def test_score_helpers_match_the_reference(tiny_encoder: Any, reference: ReferenceM3) -> None:
    out = tiny_encoder.encode(TEXTS[:3], return_sparse=True, return_colbert_vecs=True)
    lw, cv = out["lexical_weights"], out["colbert_vecs"]
    assert tiny_encoder.compute_lexical_matching_score(lw[0], lw[2]) == pytest.approx(
        reference.lexical_score(lw[0], lw[2]), **APPROX
    )
    assert tiny_encoder.colbert_score(cv[0], cv[2]) == pytest.approx(
        reference.colbert_score(cv[0], cv[2]), **APPROX
    )


def test_batched_equals_one_at_a_time(tiny_encoder: Any) -> None:
    kw = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    batched = tiny_encoder.encode(TEXTS, batch_size=3, **kw)
    for i, text in enumerate(TEXTS):
        single = tiny_encoder.encode(text, **kw)
        np.testing.assert_allclose(single["dense_vecs"], batched["dense_vecs"][i], **UNIT_VECTORS)
        np.testing.assert_allclose(single["colbert_vecs"], batched["colbert_vecs"][i], **UNIT_VECTORS)
        assert single["lexical_weights"].keys() == batched["lexical_weights"][i].keys()
        for k, v in single["lexical_weights"].items():
            assert v == pytest.approx(batched["lexical_weights"][i][k], **APPROX)


@pytest.mark.slow
def test_full_size_hidden_state_matches_transformers(tmp_path_factory: pytest.TempPathFactory) -> None:
    """BGE-M3-size random-init checkpoint (2.3 GB): last hidden state within 1e-4 of transformers."""
    from bgem3_embeddings import BGEM3Encoder
    from tests.tiny_checkpoint import make_tiny_checkpoint

    path = make_tiny_checkpoint(tmp_path_factory.mktemp("full"), size="full", seed=1)
    encoder = BGEM3Encoder(path, precision="float32", device="cpu")
    ours, mask = _keras_hidden(encoder, TEXTS)
    del encoder
    ref, _ = ReferenceM3(path).last_hidden_state(TEXTS)
    diff = np.abs(ours - ref)[mask.astype(bool)]
    assert diff.max() <= 1e-4, f"max abs diff {diff.max():.2e}"
