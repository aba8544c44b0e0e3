"""langchain_qdrant.QdrantVectorStore with BGE-M3 dense / sparse / hybrid on the embedded Qdrant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.optional import require_module

require_module("langchain_qdrant")

from langchain_bgem3 import BGEM3Embeddings, BGEM3SparseEmbeddings  # noqa: E402
from langchain_qdrant import QdrantVectorStore, RetrievalMode  # noqa: E402
from qdrant_client import QdrantClient  # noqa: E402


@pytest.mark.parametrize("mode", [RetrievalMode.DENSE, RetrievalMode.SPARSE, RetrievalMode.HYBRID])
def test_exact_text_chunk_comes_first(mode: RetrievalMode, lc_encoder: Any, corpus: list[str]) -> None:
    dense = BGEM3Embeddings(encoder=lc_encoder)
    sparse = BGEM3SparseEmbeddings(encoder=dense)
    store = QdrantVectorStore.from_texts(
        corpus,
        embedding=dense if mode != RetrievalMode.SPARSE else None,
        sparse_embedding=sparse if mode != RetrievalMode.DENSE else None,
        metadatas=[{"i": i} for i in range(len(corpus))],
        location=":memory:",
        collection_name=f"lc_{mode.value}",
        retrieval_mode=mode,
    )
    for i, text in enumerate(corpus):
        top = store.similarity_search(text, k=3)
        assert top[0].page_content == text, (mode, i, [d.metadata for d in top])
        assert top[0].metadata["i"] == i


def test_hybrid_on_a_local_path(tmp_path: Path, lc_encoder: Any, corpus: list[str]) -> None:
    """The embedded on-disk store, closed and reopened: what was written is found again."""
    dense = BGEM3Embeddings(encoder=lc_encoder)
    sparse = BGEM3SparseEmbeddings(encoder=lc_encoder)
    path = str(tmp_path / "qdrant")
    store = QdrantVectorStore.from_texts(corpus, embedding=dense, sparse_embedding=sparse, path=path,
                                         collection_name="notes", retrieval_mode=RetrievalMode.HYBRID)
    store.client.close()
    client = QdrantClient(path=path)
    try:
        reopened = QdrantVectorStore(client=client, collection_name="notes", embedding=dense,
                                     sparse_embedding=sparse, retrieval_mode=RetrievalMode.HYBRID)
        hits = reopened.similarity_search_with_score(corpus[3], k=2)
        assert hits[0][0].page_content == corpus[3]
    finally:
        client.close()
