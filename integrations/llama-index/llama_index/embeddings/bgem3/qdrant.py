"""A LlamaIndex QdrantVectorStore in hybrid mode with BGE-M3 sparse vectors (needs the `qdrant` extra)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from functools import cache
from typing import Any

from ._shared import require, resolve_encoder
from .sparse import sparse_doc_fn, sparse_query_fn

QDRANT_EXTRA = "llama-index-embeddings-bgem3[qdrant]"


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
    require("llama_index.vector_stores.qdrant", QDRANT_EXTRA, "qdrant_hybrid_vector_store")  # each call
    store_class = _stable_id_store()  # LlamaIndex's QdrantVectorStore, with stable ids (made once)
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
    return store_class(
        collection_name=collection_name,
        client=client,
        aclient=aclient,
        enable_hybrid=True,
        sparse_doc_fn=sparse_doc_fn(enc, batch_size=sparse_batch_size),
        sparse_query_fn=sparse_query_fn(enc),
        **kwargs,
    )


def stable_node_ids(nodes: Sequence[Any]) -> Sequence[Any]:
    """Each node whose id is LlamaIndex's default, a random uuid4 (new on every run), gets one made from
    its text and metadata, as `bgem3-qdrant ingest` makes a chunk's (bgem3_qdrant.ids): the same text
    added again replaces its point instead of adding a copy. An id the caller chose is kept."""
    ids = require("bgem3_qdrant.ids", QDRANT_EXTRA, "qdrant_hybrid_vector_store")
    schema = require("llama_index.core.schema", QDRANT_EXTRA, "qdrant_hybrid_vector_store")
    for node in nodes:
        if not _is_random_id(node.id_):
            continue
        text = node.get_content(metadata_mode=schema.MetadataMode.NONE)
        key = json.dumps(node.metadata, sort_keys=True, default=str)  # in place of ingest's document id
        node.id_ = ids.point_id(key, 0, ids.content_hash(text))
    return nodes


def _is_random_id(node_id: str) -> bool:
    try:
        return uuid.UUID(node_id).version == 4
    except ValueError:
        return False


@cache
def _stable_id_store() -> Any:
    """LlamaIndex's QdrantVectorStore, adding nodes under `stable_node_ids` (made once, on first use: the
    qdrant extra is imported only then)."""
    vs = require("llama_index.vector_stores.qdrant", QDRANT_EXTRA, "qdrant_hybrid_vector_store")

    class StableIdQdrantVectorStore(vs.QdrantVectorStore):  # type: ignore[name-defined]
        """QdrantVectorStore whose point ids are the nodes' text hashes (no copy on a second add)."""

        def add(self, nodes: Sequence[Any], **kwargs: Any) -> list[str]:
            return list(super().add(stable_node_ids(nodes), **kwargs))

        async def async_add(self, nodes: Sequence[Any], **kwargs: Any) -> list[str]:
            return list(await super().async_add(stable_node_ids(nodes), **kwargs))

    return StableIdQdrantVectorStore
