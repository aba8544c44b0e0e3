"""BGEM3Embedding / BGEM3SparseEmbedding / sparse fns / ColBERT rerank equal the core encoder's outputs."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from llama_index.core.schema import NodeWithScore, TextNode
from llama_index.embeddings.bgem3 import (
    BGEM3ColbertRerank,
    BGEM3Embedding,
    BGEM3SparseEmbedding,
    sparse_doc_fn,
    sparse_query_fn,
)

TOL = 1e-6
TEXTS = [
    "BGE-M3 is an embedding model supporting dense retrieval, lexical matching and multi-vector interaction.",
    "BM25 is a bag-of-words retrieval function.",
    "Short text.",
    "Qdrant stores dense, sparse and multi-vector fields in one collection, " * 3,
    "What is BGE M3?",
    "Un texte en français, pour changer de langue.",
    "x",
]
QUERY = "Which model supports lexical matching?"


@pytest.fixture(scope="module")
def encoder(tiny_encoder: Any) -> Any:
    """The session's BGEM3Encoder on the tiny checkpoint (root conftest.py)."""
    return tiny_encoder


def _sparse_int(lw: dict[str, float]) -> dict[int, float]:
    return {int(k): float(v) for k, v in lw.items()}


def _assert_sparse_close(got: dict[int, float], want: dict[int, float]) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        assert abs(got[k] - v) <= TOL


def test_dense_equals_core_encoder(encoder: Any) -> None:
    # embed_batch_size 3 splits the texts differently from the reference call: batching must not matter.
    emb = BGEM3Embedding(encoder=encoder, embed_batch_size=3)
    assert emb.encoder is encoder
    want = encoder.encode_corpus(TEXTS)["dense_vecs"]
    got = np.array(emb.get_text_embedding_batch(TEXTS))
    assert got.shape == (len(TEXTS), encoder.hidden_size)
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)
    np.testing.assert_allclose(emb.get_text_embedding(TEXTS[0]), want[0], atol=TOL, rtol=0)
    want_q = encoder.encode_queries([QUERY])["dense_vecs"][0]
    np.testing.assert_allclose(emb.get_query_embedding(QUERY), want_q, atol=TOL, rtol=0)


def test_dense_async_equals_core_encoder(encoder: Any) -> None:
    emb = BGEM3Embedding(encoder=encoder, embed_batch_size=2)
    want = encoder.encode_corpus(TEXTS)["dense_vecs"]

    async def run() -> tuple[Any, Any, Any]:
        return (
            await emb.aget_text_embedding_batch(TEXTS),
            await emb.aget_query_embedding(QUERY),
            await emb.aget_text_embedding(TEXTS[1]),
        )

    batch, query, single = asyncio.run(run())
    np.testing.assert_allclose(np.array(batch), want, atol=TOL, rtol=0)
    np.testing.assert_allclose(query, encoder.encode_queries([QUERY])["dense_vecs"][0], atol=TOL, rtol=0)
    np.testing.assert_allclose(single, want[1], atol=TOL, rtol=0)


def test_query_and_passage_lengths_truncate(encoder: Any, caplog: pytest.LogCaptureFixture) -> None:
    emb = BGEM3Embedding(encoder=encoder, query_max_length=4, passage_max_length=6)
    long = TEXTS[3]
    whole = len(encoder.tokenize([long], 10_000)[0])
    with caplog.at_level(logging.WARNING, logger="llama_index.embeddings.bgem3"):
        query_vector = emb.get_query_embedding(long)
        BGEM3SparseEmbedding(encoder=encoder, query_max_length=4).get_query_embedding(long)
        emb.get_query_embedding("x")  # 3 tokens, within the limit: nothing said
    # issue 58 item 7: a query cut at the max length is said (dense and sparse), with its counts
    note = (
        f"the query has {whole:,} tokens, more than the model reads: only its first 4 were used (max length)"
    )
    assert [r.getMessage() for r in caplog.records] == [note, note]
    np.testing.assert_allclose(
        query_vector, encoder.encode([long], max_length=4)["dense_vecs"][0], atol=TOL, rtol=0
    )
    np.testing.assert_allclose(
        emb.get_text_embedding(long), encoder.encode([long], max_length=6)["dense_vecs"][0], atol=TOL, rtol=0
    )


def test_sparse_equals_core_encoder_and_shares_the_model(encoder: Any) -> None:
    dense = BGEM3Embedding(encoder=encoder)
    sparse = BGEM3SparseEmbedding(encoder=dense, embed_batch_size=4)
    assert sparse.encoder is dense.encoder is encoder  # one model in memory
    want = encoder.encode_corpus(TEXTS, return_dense=False, return_sparse=True)["lexical_weights"]
    got = sparse.get_text_embedding_batch(TEXTS)
    for g, w in zip(got, want, strict=True):
        assert all(isinstance(k, int) for k in g)
        _assert_sparse_close(g, _sparse_int(w))
    want_q = encoder.encode_queries([QUERY], return_dense=False, return_sparse=True)["lexical_weights"][0]
    _assert_sparse_close(sparse.get_query_embedding(QUERY), _sparse_int(want_q))
    _assert_sparse_close(asyncio.run(sparse.aget_query_embedding(QUERY)), _sparse_int(want_q))
    got_async = asyncio.run(sparse.aget_text_embedding_batch(TEXTS))
    for g, w in zip(got_async, want, strict=True):
        _assert_sparse_close(g, _sparse_int(w))


def test_sparse_fns_equal_core_lexical_weights(encoder: Any) -> None:
    want = encoder.encode_corpus(TEXTS, return_dense=False, return_sparse=True)["lexical_weights"]
    indices, values = sparse_doc_fn(encoder, batch_size=3)(TEXTS)
    assert len(indices) == len(values) == len(TEXTS)
    for idx, val, w in zip(indices, values, want, strict=True):
        assert len(set(idx)) == len(idx)  # Qdrant rejects duplicate indices
        _assert_sparse_close(dict(zip(idx, val, strict=True)), _sparse_int(w))
    want_q = encoder.encode_queries([QUERY], return_dense=False, return_sparse=True)["lexical_weights"][0]
    (qi,), (qv,) = sparse_query_fn(encoder)([QUERY])
    _assert_sparse_close(dict(zip(qi, qv, strict=True)), _sparse_int(want_q))


def test_builds_its_own_encoder_from_a_path(tiny_checkpoint: Path, encoder: Any) -> None:
    emb = BGEM3Embedding(model_name=str(tiny_checkpoint), device="cpu", precision="float32")
    assert emb.encoder is not encoder and emb.model_name == str(tiny_checkpoint)
    np.testing.assert_allclose(
        emb.get_text_embedding(TEXTS[0]), encoder.encode_corpus([TEXTS[0]])["dense_vecs"][0], atol=TOL, rtol=0
    )
    # sparse_doc_fn from a model name builds an encoder too (keyword options go to BGEM3Encoder).
    (idx,), (val,) = sparse_doc_fn(str(tiny_checkpoint), device="cpu")([TEXTS[1]])
    want = encoder.encode_corpus([TEXTS[1]], return_dense=False, return_sparse=True)["lexical_weights"][0]
    _assert_sparse_close(dict(zip(idx, val, strict=True)), _sparse_int(want))


def test_progress_uses_llama_index_flag(encoder: Any, capsys: pytest.CaptureFixture[str]) -> None:
    emb = BGEM3Embedding(encoder=encoder, embed_batch_size=2)
    emb.get_text_embedding_batch(TEXTS, show_progress=True)
    assert "Generating embeddings" in capsys.readouterr().err
    emb.get_text_embedding_batch(TEXTS)
    assert "Generating embeddings" not in capsys.readouterr().err


def test_colbert_rerank_scores_equal_core(encoder: Any) -> None:
    nodes = [NodeWithScore(node=TextNode(text=t), score=0.1 * i) for i, t in enumerate(TEXTS)]
    rerank = BGEM3ColbertRerank(encoder=encoder, top_n=3, keep_retrieval_score=True)
    out = rerank.postprocess_nodes(nodes, query_str=QUERY)
    q = encoder.encode_queries([QUERY], return_dense=False, return_colbert_vecs=True)["colbert_vecs"][0]
    p = encoder.encode_corpus(TEXTS, return_dense=False, return_colbert_vecs=True)["colbert_vecs"]
    want = sorted(((encoder.colbert_score(q, v), t) for t, v in zip(TEXTS, p, strict=True)), reverse=True)[:3]
    assert [n.node.get_content() for n in out] == [t for _, t in want]
    np.testing.assert_allclose([n.score for n in out], [s for s, _ in want], atol=TOL, rtol=0)
    assert "retrieval_score" in out[0].node.metadata
    assert rerank.postprocess_nodes([], query_str=QUERY) == []
