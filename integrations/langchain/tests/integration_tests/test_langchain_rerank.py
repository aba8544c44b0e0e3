"""BGE's cross-encoder in LangChain's own pipelines, on a real BGEM3Retriever over an in-memory Qdrant (tiny
checkpoints): `ContextualCompressionRetriever` with `BGEM3CrossEncoderRerank`, langchain-classic's
`CrossEncoderReranker` with `BGEM3CrossEncoder`, and the retriever's own cross-encoder stage
(`as_retriever(reranker=...)`). Orders and scores are checked against `BGEM3Reranker` itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.optional import require_module

require_module("langchain_qdrant")
require_module("bgem3_qdrant")
classic = require_module("langchain_classic")

from langchain_bgem3 import BGEM3CrossEncoder, BGEM3CrossEncoderRerank, BGEM3QdrantIndex  # noqa: E402
from langchain_classic.retrievers import ContextualCompressionRetriever  # noqa: E402
from langchain_classic.retrievers.document_compressors import CrossEncoderReranker  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from qdrant_client import QdrantClient  # noqa: E402

from tests.support import assert_reordered  # noqa: E402

QUERY = "what do search engines return?"
RERANKER_KWARGS = {"device": "cpu", "precision": "float32"}
SCALED = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def reranker(tiny_reranker_checkpoint: Path) -> Any:
    from langchain_bgem3.rerank import load_reranker

    return load_reranker(str(tiny_reranker_checkpoint), RERANKER_KWARGS)


@pytest.fixture
def index(lc_encoder: Any, corpus: list[str]) -> BGEM3QdrantIndex:
    idx = BGEM3QdrantIndex(client=QdrantClient(location=":memory:"), collection_name="rr", encoder=lc_encoder)
    idx.add_documents([Document(page_content=t, metadata={"i": i}) for i, t in enumerate(corpus)])
    return idx


def _library(reranker: Any, texts: list[str], top_n: int) -> list[tuple[int, float]]:
    ranked: list[tuple[int, float]] = reranker.rerank(QUERY, texts, top_n=top_n)
    assert_reordered([i for i, _ in ranked])  # else the first stage's own order would pass
    return ranked


def test_contextual_compression_with_the_compressor(index: BGEM3QdrantIndex, reranker: Any) -> None:
    base = index.as_retriever(k=6)
    candidates = [d.page_content for d in base.invoke(QUERY)]
    compressor = BGEM3CrossEncoderRerank(reranker=reranker, top_n=3)
    docs = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=base).invoke(QUERY)
    want = _library(reranker, candidates, 3)
    assert [d.page_content for d in docs] == [candidates[i] for i, _ in want]
    np.testing.assert_allclose([d.metadata["relevance_score"] for d in docs], [s for _, s in want], **SCALED)
    assert all("i" in d.metadata and "colbert_score" in d.metadata for d in docs)  # the retriever's own


def test_compressor_loads_the_model_once_by_name(tiny_reranker_checkpoint: Path, reranker: Any) -> None:
    a = BGEM3CrossEncoderRerank(model_name=str(tiny_reranker_checkpoint), model_kwargs=RERANKER_KWARGS)
    b = BGEM3CrossEncoder(str(tiny_reranker_checkpoint), model_kwargs=RERANKER_KWARGS, normalize=True)
    assert a.reranker is reranker and b.reranker is reranker
    assert BGEM3CrossEncoder(reranker=a).reranker is reranker  # a component holding one
    scores = b.score([(QUERY, "hi"), (QUERY, "search engines return documents")])
    want = reranker.compute_score([(QUERY, "hi"), (QUERY, "search engines return documents")], normalize=True)
    np.testing.assert_allclose(scores, want, **SCALED)
    assert all(0 < s < 1 for s in scores) and b.score([]) == []
    with pytest.raises(TypeError, match="BGEM3Reranker"):
        BGEM3CrossEncoder(reranker=object())


def test_classic_cross_encoder_reranker_takes_our_cross_encoder(
    index: BGEM3QdrantIndex, reranker: Any
) -> None:
    base = index.as_retriever(k=6)
    candidates = [d.page_content for d in base.invoke(QUERY)]
    compressor = CrossEncoderReranker(model=BGEM3CrossEncoder(reranker=reranker), top_n=2)
    docs = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=base).invoke(QUERY)
    assert [d.page_content for d in docs] == [candidates[i] for i, _ in _library(reranker, candidates, 2)]


def test_as_retriever_with_a_cross_encoder_stage(index: BGEM3QdrantIndex, reranker: Any) -> None:
    first = [d.page_content for d in index.as_retriever(k=5).invoke(QUERY)]  # the mode's top 5
    retriever = index.as_retriever(k=2, reranker=reranker, rerank_candidates=5)
    docs = retriever.invoke(QUERY)
    want = _library(reranker, first, 2)
    assert [d.page_content for d in docs] == [first[i] for i, _ in want]
    for d, (_, score) in zip(docs, want, strict=True):
        np.testing.assert_allclose(d.metadata["cross_encoder_score"], score, **SCALED)
        assert d.metadata["score"] == d.metadata["cross_encoder_score"]
        assert "colbert_score" in d.metadata and "dense_score" in d.metadata  # the first stage's too
    # a compressor holding the model is accepted as the stage
    holder = index.as_retriever(k=2, reranker=BGEM3CrossEncoderRerank(reranker=reranker), rerank_candidates=5)
    assert [d.page_content for d in holder.invoke(QUERY)] == [d.page_content for d in docs]
