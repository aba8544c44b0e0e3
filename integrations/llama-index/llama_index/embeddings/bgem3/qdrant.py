"""A LlamaIndex QdrantVectorStore in hybrid mode with BGE-M3 sparse vectors (needs the `qdrant` extra)."""

from __future__ import annotations

from typing import Any

from ._shared import require, resolve_encoder
from .sparse import sparse_doc_fn, sparse_query_fn

QDRANT_EXTRA = '"llama-index-embeddings-bgem3[qdrant]"'


def qdrant_hybrid_vector_store(
    collection_name: str,
    *,
    encoder: Any,
    client: Any = None,
    aclient: Any = None,
    path: str | None = None,
    sparse_batch_size: int | None = None,
    **kwargs: Any,
) -> Any:
    """`QdrantVectorStore(enable_hybrid=True)` whose sparse vectors are BGE-M3 lexical weights.

    `encoder`: a BGEM3Encoder or a BGEM3Embedding / BGEM3SparseEmbedding (its model is shared, not
    reloaded). Give a `client` / `aclient`, or `path` for qdrant-client's local mode: LlamaIndex's
    QdrantVectorStore needs a QdrantClient, so it cannot use the Qdrant Edge store; local mode holds every
    point in RAM and suits small data (up to some thousands of chunks), beyond that run a server. For a
    folder store at any size, with ColBERT stored and reranked in Qdrant, use BGEM3QdrantRetriever. The sparse
    field uses no IDF modifier, so Qdrant's sparse score is exactly the reference lexical matching score.
    Other keyword arguments go to QdrantVectorStore (hybrid_fusion_fn, batch_size, vector names...).
    """
    vs = require("llama_index.vector_stores.qdrant", QDRANT_EXTRA, "qdrant_hybrid_vector_store")
    models = require("qdrant_client.models", QDRANT_EXTRA, "qdrant_hybrid_vector_store")
    enc = resolve_encoder(encoder)
    if client is None and aclient is None:
        if path is None:
            raise ValueError("give a QdrantClient (client=/aclient=) or a local database path (path=)")
        client = require("qdrant_client", QDRANT_EXTRA, "qdrant_hybrid_vector_store").QdrantClient(path=path)
    kwargs.setdefault(
        "sparse_config",
        models.SparseVectorParams(index=models.SparseIndexParams(), modifier=models.Modifier.NONE),
    )
    return vs.QdrantVectorStore(
        collection_name=collection_name,
        client=client,
        aclient=aclient,
        enable_hybrid=True,
        sparse_doc_fn=sparse_doc_fn(enc, batch_size=sparse_batch_size),
        sparse_query_fn=sparse_query_fn(enc),
        **kwargs,
    )
