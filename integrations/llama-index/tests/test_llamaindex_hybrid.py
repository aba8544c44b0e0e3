"""VectorStoreIndex + QdrantVectorStore(enable_hybrid=True) on the embedded Qdrant with BGE-M3."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.optional import require_module

require_module("llama_index.vector_stores.qdrant")
from llama_index.core import StorageContext, VectorStoreIndex  # noqa: E402
from llama_index.core.schema import TextNode  # noqa: E402
from llama_index.embeddings.bgem3 import (  # noqa: E402
    BGEM3Embedding,
    qdrant_hybrid_vector_store,
    sparse_doc_fn,
    sparse_query_fn,
)
from llama_index.vector_stores.qdrant import QdrantVectorStore  # noqa: E402
from qdrant_client import QdrantClient  # noqa: E402

DOCS = [
    "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
    "Mount Kilimanjaro is the highest mountain in Africa.",
    "BGE-M3 produces dense, sparse and multi-vector embeddings.",
    "Espresso is brewed by forcing hot water through ground coffee.",
    "Qdrant is a vector database written in Rust.",  # the tiny model gives it an empty sparse vector
    "BM25 is a bag-of-words retrieval function that ranks a set of documents based on the query terms.",
    "Machine learning models learn patterns from data and generalise to new examples.",
    "Un motor de búsqueda encuentra los documentos más relevantes para una consulta.",
]


@pytest.fixture(scope="module")
def encoder(tiny_encoder: Any) -> Any:
    """The session's BGEM3Encoder on the tiny checkpoint (root conftest.py)."""
    return tiny_encoder


@pytest.fixture()
def client(tmp_path: Path) -> Iterator[QdrantClient]:
    c = QdrantClient(path=str(tmp_path / "qdrant"))  # embedded (local-mode) database on disk
    yield c
    c.close()


def _index(store: QdrantVectorStore, embed: BGEM3Embedding) -> VectorStoreIndex:
    nodes = [TextNode(text=t, id_=f"00000000-0000-0000-0000-{i:012d}") for i, t in enumerate(DOCS)]
    return VectorStoreIndex(
        nodes, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embed
    )


def test_hybrid_returns_the_exact_text_first(encoder: Any, client: QdrantClient) -> None:
    embed = BGEM3Embedding(encoder=encoder, embed_batch_size=3)
    query_fn = sparse_query_fn(embed)  # shares the dense model's encoder
    seen: list[str] = []

    def counting_query_fn(texts: list[str]) -> tuple[list[list[int]], list[list[float]]]:
        seen.extend(texts)
        return query_fn(texts)

    store = QdrantVectorStore(
        collection_name="docs",
        client=client,
        enable_hybrid=True,
        sparse_doc_fn=sparse_doc_fn(embed),
        sparse_query_fn=counting_query_fn,
        batch_size=5,  # Qdrant upload batches differ from the embedding batches: order must survive
    )
    retriever = _index(store, embed).as_retriever(
        vector_store_query_mode="hybrid", similarity_top_k=3, sparse_top_k=5
    )
    for text in DOCS:
        hits = retriever.retrieve(text)
        assert hits and hits[0].node.get_content() == text
    assert seen == DOCS  # every hybrid query went through the BGE-M3 sparse leg


def test_stored_sparse_vectors_and_scores_are_the_reference(encoder: Any, client: QdrantClient) -> None:
    embed = BGEM3Embedding(encoder=encoder)
    store = qdrant_hybrid_vector_store("docs", encoder=embed, client=client)
    index = _index(store, embed)
    lw = encoder.encode_corpus(DOCS, return_dense=False, return_sparse=True)["lexical_weights"]

    points, _ = client.scroll("docs", limit=100, with_vectors=True, with_payload=False)
    assert len(points) == len(DOCS)
    for p in points:
        i = int(str(p.id).rsplit("-", 1)[1])
        sv = p.vector[store.sparse_vector_name]
        assert dict(zip(sv.indices, sv.values, strict=True)) == pytest.approx(
            {int(k): v for k, v in lw[i].items()}, rel=1e-5, abs=1e-5
        )

    # sparse-only retrieval: Qdrant's scores (no IDF modifier) are the reference lexical matching scores,
    # so its ranking is the reference ranking (only documents sharing a token score above zero).
    q_lws = encoder.encode_queries(DOCS, return_dense=False, return_sparse=True)["lexical_weights"]
    retriever = index.as_retriever(vector_store_query_mode="sparse", similarity_top_k=3, sparse_top_k=3)
    for query, q_lw in zip(DOCS, q_lws, strict=True):
        ref = sorted(
            ((encoder.compute_lexical_matching_score(q_lw, w), t) for w, t in zip(lw, DOCS, strict=True)),
            reverse=True,
        )
        ref = [(s, t) for s, t in ref if s > 0][:3]
        hits = retriever.retrieve(query)
        assert [h.node.get_content() for h in hits] == [t for _, t in ref]
        assert [h.score for h in hits] == pytest.approx([s for s, _ in ref], abs=1e-5)

    hybrid = index.as_retriever(vector_store_query_mode="hybrid", similarity_top_k=2, sparse_top_k=4)
    assert hybrid.retrieve(DOCS[5])[0].node.get_content() == DOCS[5]


def test_store_helper_opens_an_embedded_path(encoder: Any, tmp_path: Path) -> None:
    store = qdrant_hybrid_vector_store("c", encoder=encoder, path=str(tmp_path / "q"))
    try:
        assert store.enable_hybrid
        index = _index(store, BGEM3Embedding(encoder=encoder))
        hits = index.as_retriever(vector_store_query_mode="hybrid", similarity_top_k=1).retrieve(DOCS[0])
        assert hits[0].node.get_content() == DOCS[0]
    finally:
        store.client.close()
    with pytest.raises(ValueError, match="path="):
        qdrant_hybrid_vector_store("c", encoder=encoder)


def test_the_quick_start_run_twice_adds_no_copy(encoder: Any, tmp_path: Path) -> None:
    """Issue 58, item 8: the README's quick start, run twice on one local-mode folder as a user reruns it
    (a fresh Document, whose id is a new uuid4, each time): one point per text, as ingest keeps it; an id
    the caller chose stays."""
    from llama_index.core import Document

    text = "BGE M3 supports dense retrieval, lexical matching and multi-vector interaction."
    embed = BGEM3Embedding(encoder=encoder)
    for _ in range(2):
        store = qdrant_hybrid_vector_store("docs", encoder=embed, path=str(tmp_path / "qdrant_local"))
        VectorStoreIndex.from_documents(
            [Document(text=text)], storage_context=StorageContext.from_defaults(vector_store=store),
            embed_model=embed,
        )  # fmt: skip
        store.client.close()
    client = QdrantClient(path=str(tmp_path / "qdrant_local"))
    try:
        assert client.count("docs").count == 1
        store = qdrant_hybrid_vector_store("docs", encoder=embed, client=client)
        chosen = "00000000-0000-0000-0000-000000000007"  # not a uuid4: the caller's own
        VectorStoreIndex([TextNode(text=text, id_=chosen)], embed_model=embed,
                         storage_context=StorageContext.from_defaults(vector_store=store))  # fmt: skip
        assert client.count("docs").count == 2 and client.retrieve("docs", [chosen])
    finally:
        client.close()
