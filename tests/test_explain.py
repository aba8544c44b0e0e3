"""`explain(query, passage)` against FlagEmbedding 1.4.2's own M3 code on the same weights.

The totals must be FlagEmbedding's numbers (compute_score, compute_lexical_matching_score, colbert_score)
and each part must be the term FlagEmbedding adds up: the sparse products are its lexical weights
multiplied, the ColBERT maxima are the maxima of its own vectors' similarity matrix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.flagembedding_ref import flagembedding_m3
from tests.tolerances import APPROX, UNIT_VECTORS

QUERY = "What is BGE M3?"
SENTENCE = "BGE M3 is an embedding model supporting dense retrieval, lexical matching and multi-vectors."
LONG_PASSAGE = "What is BGE M3? " + " ".join([SENTENCE] * 40)
PAIRS = [
    # shared tokens with weight in both texts (the tiny checkpoint's sparse head is sparse: checked below)
    (QUERY, "What is BGE M3? BGE M3 is an embedding model."),
    ("Which model supports lexical matching?", "Lexical matching: the model supports lexical matching."),
    ("bag-of-words retrieval function", "BM25 is a bag-of-words retrieval function that ranks documents"),
    # no token in common at all
    ("zzz qqq", "BM25 is a bag-of-words retrieval function"),
    # over 512 tokens
    (QUERY, LONG_PASSAGE),
]
WEIGHTS = [(0.4, 0.2, 0.4), (1.0, 1.0, 1.0), (0.0, 1.0, 3.0)]


@pytest.fixture(scope="module")
def flag(tiny_checkpoint: Path) -> Any:
    return flagembedding_m3(tiny_checkpoint)


def _reference_parts(flag: Any, query: str, passage: str, max_passage_length: int) -> dict[str, Any]:
    outputs = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    q = flag.encode([query], max_length=512, **outputs)
    p = flag.encode([passage], max_length=max_passage_length, **outputs)
    q_lex, p_lex = q["lexical_weights"][0], p["lexical_weights"][0]
    q_col, p_col = q["colbert_vecs"][0], p["colbert_vecs"][0]
    return {
        "lexical": (q_lex, p_lex),
        "colbert": (q_col, p_col),
        "lexical_score": float(flag.compute_lexical_matching_score(q_lex, p_lex)),
        "colbert_score": float(flag.colbert_score(q_col, p_col)),
    }


@pytest.mark.parametrize("max_passage_length", [8192, 512])
@pytest.mark.parametrize("pair", PAIRS, ids=["shared", "lexical", "bag", "disjoint", "long"])
def test_explain_totals_and_parts_are_flagembeddings(
    tiny_encoder: Any, flag: Any, pair: tuple[str, str], max_passage_length: int
) -> None:
    query, passage = pair
    e = tiny_encoder.explain(query, passage, max_passage_length=max_passage_length, colbert_matrix=True)
    for weights in WEIGHTS:
        ref = flag.compute_score(
            [(query, passage)],
            max_query_length=512,
            max_passage_length=max_passage_length,
            weights_for_different_modes=list(weights),
        )
        w = tiny_encoder.explain(query, passage, weights=weights, max_passage_length=max_passage_length)
        assert w.dense == pytest.approx(ref["dense"][0], **APPROX)
        assert w.sparse == pytest.approx(ref["sparse"][0], **APPROX)
        assert w.colbert == pytest.approx(ref["colbert"][0], **APPROX)
        assert w.combined == pytest.approx(ref["colbert+sparse+dense"][0], **APPROX)
        assert sum(w.parts.values()) == pytest.approx(w.combined, **APPROX)
        assert w.weights == weights

    parts = _reference_parts(flag, query, passage, max_passage_length)
    # sparse: the products add up to compute_lexical_matching_score, over exactly the shared ids
    q_lex, p_lex = parts["lexical"]
    assert sum(t.product for t in e.sparse_terms) == pytest.approx(parts["lexical_score"], **APPROX)
    assert {str(t.token_id) for t in e.sparse_terms} == set(q_lex) & set(p_lex)
    for t in e.sparse_terms:
        assert t.query_weight == pytest.approx(float(q_lex[str(t.token_id)]), **APPROX)
        assert t.passage_weight == pytest.approx(float(p_lex[str(t.token_id)]), **APPROX)
        assert t.product == pytest.approx(t.query_weight * t.passage_weight, **APPROX)
        assert t.passage_spans, f"token {t.token_id} has no place in the passage"
        for start, stop in t.passage_spans:
            assert passage[start:stop]  # a real stretch of the passage
    assert [t.product for t in e.sparse_terms] == sorted((t.product for t in e.sparse_terms), reverse=True)
    if e.sparse_terms:
        assert sum(t.share for t in e.sparse_terms) == pytest.approx(1.0, **APPROX)

    # ColBERT: one match per query vector (FlagEmbedding's count: tokens - 1), the mean = colbert_score
    q_vecs, p_vecs = parts["colbert"]
    assert len(e.colbert_matches) == len(q_vecs) == len(e.query.tokens) - 1
    mean_of_maxima = np.mean([m.similarity for m in e.colbert_matches])
    assert mean_of_maxima == pytest.approx(parts["colbert_score"], **APPROX)
    reference_matrix = q_vecs @ p_vecs.T
    assert e.colbert_matrix is not None
    np.testing.assert_allclose(e.colbert_matrix, reference_matrix, **UNIT_VECTORS)
    for i, m in enumerate(e.colbert_matches):
        assert m.query_token == i + 1
        # the chosen passage token is a maximum of the reference's row (ties may pick another index)
        assert reference_matrix[i, m.passage_token - 1] == pytest.approx(reference_matrix[i].max(), **APPROX)
        assert m.similarity == pytest.approx(reference_matrix[i].max(), **APPROX)
    assert sum(m.share for m in e.colbert_matches) == pytest.approx(1.0, **APPROX)


def test_the_pairs_cover_what_they_claim(tiny_encoder: Any) -> None:
    """The parity test above is only worth something if some pairs have sparse terms, one has no shared
    token, and one passage is longer than 512 tokens (cut at 512, whole at 8192)."""
    shared = tiny_encoder.explain(*PAIRS[0])
    assert shared.sparse > 0 and len(shared.sparse_terms) >= 2
    disjoint = tiny_encoder.explain(*PAIRS[3])
    q_ids = {t.id for t in disjoint.query.tokens if not t.special}
    p_ids = {t.id for t in disjoint.passage.tokens if not t.special}
    assert not q_ids & p_ids and disjoint.sparse == 0 and disjoint.sparse_terms == []
    long_whole = tiny_encoder.explain(*PAIRS[4])
    long_cut = tiny_encoder.explain(*PAIRS[4], max_passage_length=512)
    assert len(long_whole.passage.tokens) > 512 and not long_whole.passage.truncated
    assert len(long_cut.passage.tokens) == 512 and long_cut.passage.truncated


def test_tokens_are_the_encoders_with_their_spans(tiny_encoder: Any) -> None:
    passage = "BGE M3 is an embedding model: héllo wörld, 日本語"
    e = tiny_encoder.explain(QUERY, passage)
    assert e.passage.ids == tiny_encoder.tokenize([passage], 8192)[0]
    assert e.query.ids == tiny_encoder.tokenize([QUERY], 512)[0]
    assert e.passage.tokens[0].special and e.passage.tokens[-1].special
    for token in e.passage.tokens[1:-1]:
        assert 0 <= token.start < token.stop <= len(passage)
    assert e.passage.surface(len(e.passage.tokens) - 1) == "</s>"


def test_explain_many_equals_explain_one_by_one(tiny_encoder: Any) -> None:
    passages = [p for _, p in PAIRS[:3]]
    many = tiny_encoder.explain_many(QUERY, passages)
    for p, e in zip(passages, many, strict=True):
        one = tiny_encoder.explain(QUERY, p)
        assert e.scores == pytest.approx(one.scores, **APPROX)


def test_json_form_round_trips(tiny_encoder: Any) -> None:
    from bgem3_embeddings.explain import Explanation

    e = tiny_encoder.explain(*PAIRS[0], colbert_matrix=True)
    back = Explanation.from_dict(e.to_dict())
    assert back.to_dict() == e.to_dict()


@pytest.mark.parametrize(
    ("query", "passage", "error", "phrase"),
    [
        ("", "text", ValueError, "query is empty"),
        ("   ", "text", ValueError, "query is empty"),
        ("q", "", ValueError, "passage is empty"),
        ("q", 3, TypeError, "passage must be a str"),
    ],
)
def test_bad_input_is_named(tiny_encoder: Any, query: Any, passage: Any, error: type, phrase: str) -> None:
    with pytest.raises(error, match=phrase):
        tiny_encoder.explain(query, passage)


@pytest.mark.parametrize("weights", [(1, 2), (0, 0, 0), ("a", 1, 1), (float("nan"), 1, 1)])
def test_bad_weights_are_named(tiny_encoder: Any, weights: Any) -> None:
    with pytest.raises(ValueError, match="weights"):
        tiny_encoder.explain("q", "p", weights=weights)
