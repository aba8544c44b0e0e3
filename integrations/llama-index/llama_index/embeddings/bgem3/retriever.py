"""ColBERT-reranked hybrid retrieval on bgem3-qdrant's store (Qdrant Edge for a folder), as a LlamaIndex
retriever (needs the `qdrant` extra).

Storage and search are bgem3_qdrant's own code, through its public front for one collection
(`bgem3_qdrant.Collection`): the ColBERT vectors are stored
once at ingest and the rerank runs inside Qdrant, in one Query API call, instead of re-encoding the
candidates at query time as `BGEM3ColbertRerank` does. A collection written here can be searched with
`bgem3-qdrant search` and the other way round.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, QueryBundle, TextNode

from bgem3_embeddings.query_text import check_query, log_cut_queries

from ._shared import require, resolve_encoder

logger = logging.getLogger("llama_index.embeddings.bgem3")
QDRANT_EXTRA = "llama-index-embeddings-bgem3[qdrant]"
SearchMode = Literal["rerank", "hybrid", "dense", "sparse"]  # bgem3_qdrant.Mode


def _bgem3_qdrant() -> Any:
    return require("bgem3_qdrant", QDRANT_EXTRA, "BGEM3QdrantRetriever")


class BGEM3QdrantRetriever(BaseRetriever):
    """Dense + sparse candidates reranked by stored ColBERT vectors inside Qdrant.

    `store` is a bgem3_qdrant store (`BGEM3QdrantRetriever.open(path=...)` or `bgem3_qdrant.open_store`:
    Qdrant Edge for a folder, the default, or a server for a URL) or a QdrantClient (a server, or
    qdrant-client's local mode). A node's score is the reference ColBERT score in rerank mode (the
    scale of BGEM3ColbertRerank), Qdrant's score otherwise; its metadata carries the stored metadata plus
    per-stage scores (`colbert_score`, `dense_score`, `sparse_score`) and `doc_id`, `source`, `chunk_index`.

    Example:
        ```python
        with BGEM3QdrantRetriever.open("notes", encoder, path="./qdrant_data", k=5) as retriever:
            retriever.add_documents([Document(text=t) for t in texts])
            nodes = retriever.retrieve("how do I reset the router?")
        ```
    """

    def __init__(
        self,
        store: Any,
        collection_name: str,
        encoder: Any,
        *,
        k: int = 4,
        mode: SearchMode = "rerank",
        prefetch_limit: int | None = None,
        filter: Mapping[str, Any] | Any | None = None,
        collection_schema: Any = None,
        chunk_size: int = 512,
        chunk_overlap: int = 64,
        batch_size: int = 32,
        **kwargs: Any,
    ) -> None:
        bq = _bgem3_qdrant()
        if k < 1:
            raise ValueError(f"k must be >= 1, not {k}")
        options = bq.IngestOptions(
            chunk_size=chunk_size, chunk_overlap=chunk_overlap, batch_size=batch_size, show_progress=False
        )
        # A TypeError naming what is accepted when `store` is neither a store nor a QdrantClient.
        self.collection = bq.Collection(
            store, collection_name, resolve_encoder(encoder), schema=collection_schema, options=options,
            owns_store=True,
        )
        self.k, self.mode, self.prefetch_limit, self.filter = k, mode, prefetch_limit, filter
        super().__init__(**kwargs)

    @property
    def encoder(self) -> Any:
        return self.collection.encoder

    @property
    def collection_name(self) -> str:
        return str(self.collection.name)

    @classmethod
    def open(
        cls,
        collection_name: str,
        encoder: Any,
        *,
        path: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
        **kwargs: Any,
    ) -> BGEM3QdrantRetriever:
        """A retriever on Qdrant Edge in `path` (default ./qdrant_data) or on the server at `url`.

        The retriever owns the store: close it (`close()` or a `with` block) so another process can open it.
        """
        bq = _bgem3_qdrant()
        store = bq.open_store(bq.resolve_target(path=path, url=url, api_key=api_key))
        return cls(store, collection_name, encoder, **kwargs)

    def close(self) -> None:
        """Close the store (releases an embedded store's folder for other processes)."""
        self.collection.close()

    def __enter__(self) -> BGEM3QdrantRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_documents(self, documents: Sequence[BaseNode]) -> list[str]:
        """Chunk, encode and store documents or nodes; returns their ids (`ref_doc_id` or node id).

        Chunks already stored are skipped (no encoding); re-adding a document replaces its chunks.
        Stored chunk text is the exact slice of the node's text that was encoded (`char_start`/`char_end`).
        """
        bq = _bgem3_qdrant()
        records = []
        for node in documents:
            doc_id = str(node.ref_doc_id if isinstance(node, TextNode) and node.ref_doc_id else node.node_id)
            meta = dict(node.metadata)
            records.append(
                bq.Document(
                    doc_id=doc_id,
                    source=str(meta.get("source", meta.get("file_path", doc_id))),
                    text=node.get_content(metadata_mode=MetadataMode.NONE),
                    metadata=meta,
                )
            )
        self.collection.add(records)
        return [r.doc_id for r in records]

    def delete(self, doc_ids: Sequence[str]) -> None:
        """Delete documents (all their chunks) by the ids add_documents returned."""
        self.collection.delete_documents([str(i) for i in doc_ids])

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        log_cut_queries(logger, self.encoder, [check_query(query_bundle.query_str)])
        hits = self.collection.search(
            query_bundle.query_str,
            mode=self.mode,
            limit=self.k,
            prefetch_limit=self.prefetch_limit,
            filter=self.filter,
        )
        nodes = []
        for h in hits:
            node = TextNode(id_=h.id, text=h.text, metadata=h.flat_metadata())
            # rerank: the reference ColBERT score (as BGEM3ColbertRerank gives), not Qdrant's MAX_SIM sum
            score = h.scores.get("colbert", h.score)
            nodes.append(NodeWithScore(node=node, score=score))
        return nodes


__all__ = ["BGEM3QdrantRetriever"]
