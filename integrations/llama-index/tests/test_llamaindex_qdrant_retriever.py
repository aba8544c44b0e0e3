"""BGEM3QdrantRetriever on bgem3-qdrant's Qdrant Edge store: stored ColBERT reranked inside Qdrant, scores
checked against the reference (transformers' model + FlagEmbedding semantics) on the tiny checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.optional import require_module

require_module("bgem3_qdrant")
from bgem3_qdrant import CollectionSchema  # noqa: E402
from llama_index.core.schema import Document, QueryBundle  # noqa: E402
from llama_index.embeddings.bgem3 import BGEM3QdrantRetriever  # noqa: E402

from tests.support import ReferenceM3  # noqa: E402

DOCS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
    "Mount Kilimanjaro is the highest mountain in Africa.",
    "BGE-M3 produces dense, sparse and multi-vector embeddings.",
    "Espresso is brewed by forcing hot water through ground coffee.",
    "Machine learning models learn patterns from data and generalise to new examples.",
]


def test_rerank_on_edge_matches_the_reference(
    tmp_path: Path, tiny_encoder: Any, tiny_checkpoint: Path
) -> None:
    schema = CollectionSchema(size=tiny_encoder.hidden_size, colbert_dtype="float32")  # exact scores
    docs = [Document(text=t, metadata={"i": i, "lang": "en" if i % 2 else "de"}) for i, t in enumerate(DOCS)]
    with BGEM3QdrantRetriever.open(
        "notes", tiny_encoder, path=str(tmp_path / "qd"), k=3, collection_schema=schema
    ) as retriever:
        assert retriever.collection.store.kind == "edge"
        ids = retriever.add_documents(docs)
        assert retriever.add_documents(docs) == ids  # re-adding: same ids, nothing new stored
        assert retriever.collection.count() == len(DOCS)

        ref = ReferenceM3(tiny_checkpoint)
        passages = ref.encode(DOCS)["colbert_vecs"]
        for i, text in enumerate(DOCS):
            nodes = retriever.retrieve(text)
            assert nodes[0].node.get_content() == text and nodes[0].node.metadata["i"] == i
            q = ref.encode([text])["colbert_vecs"][0]
            for n in nodes:  # Qdrant's rerank score is the reference ColBERT score of the stored text
                want = ref.colbert_score(q, passages[n.node.metadata["i"]])
                assert n.node.metadata["colbert_score"] == pytest.approx(want, abs=1e-5)
            assert [n.score for n in nodes] == sorted((n.score for n in nodes), reverse=True)

        retriever.filter = {"lang": "en"}
        assert {n.node.metadata["lang"] for n in retriever.retrieve(QueryBundle(DOCS[0]))} == {"en"}
        retriever.delete([ids[1]])
        assert retriever.collection.count() == len(DOCS) - 1


def test_bad_store_is_refused(tiny_encoder: Any) -> None:
    with pytest.raises(TypeError, match="open_store"):
        BGEM3QdrantRetriever("./qdrant_data", "notes", tiny_encoder)


def test_an_empty_query_is_one_error(tmp_path: Path, tiny_encoder: Any) -> None:
    """The rule every query follows (bgem3_embeddings.query_text): the retriever, the embeddings' query
    paths, the sparse query encoder of QdrantVectorStore and the ColBERT rerank refuse a query without
    text; documents are embedded whatever they hold, as the reference does."""
    from llama_index.core.schema import NodeWithScore, TextNode
    from llama_index.embeddings.bgem3 import (
        BGEM3ColbertRerank,
        BGEM3Embedding,
        BGEM3SparseEmbedding,
        sparse_query_fn,
    )

    from bgem3_embeddings.query_text import EMPTY_QUERY

    dense, sparse = BGEM3Embedding(encoder=tiny_encoder), BGEM3SparseEmbedding(encoder=tiny_encoder)
    rerank = BGEM3ColbertRerank(encoder=tiny_encoder)
    nodes = [NodeWithScore(node=TextNode(text=DOCS[0]), score=1.0)]
    with BGEM3QdrantRetriever.open("notes", tiny_encoder, path=str(tmp_path / "qd"), k=2) as retriever:
        retriever.add_documents([Document(text=t) for t in DOCS[:2]])
        calls = [lambda: retriever.retrieve(""), lambda: retriever.retrieve(QueryBundle(" \n")),
                 lambda: dense.get_query_embedding("  "), lambda: sparse.get_query_embedding(""),
                 lambda: sparse_query_fn(tiny_encoder)(["\t"]),
                 lambda: rerank.postprocess_nodes(nodes, query_str=" ")]  # fmt: skip
        for call in calls:
            with pytest.raises(ValueError) as refused:
                call()
            assert str(refused.value) == EMPTY_QUERY
    assert len(dense.get_text_embedding("")) == tiny_encoder.hidden_size
