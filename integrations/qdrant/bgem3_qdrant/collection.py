"""One BGE-M3 collection behind one object: add documents, search, delete documents, count.

This is the front the LangChain and LlamaIndex retrievers use (neither touches the stores' internals).
Calls into the encoder hold its lock (`bgem3_embeddings.concurrency`), so components sharing one model
from worker threads take turns.

    >>> with Collection.open("kb", encoder, path="./qdrant_data") as kb:      # doctest: +SKIP
    ...     kb.add([Document("faq-1", "faq.md", "Reset the router by ...", {"lang": "en"})])
    ...     hits = kb.search("how do I reset the router?", limit=3)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from bgem3_embeddings.concurrency import encoder_lock

from .encoder import EncoderLike
from .filters import FilterLike, doc_filter
from .ingest import IngestOptions, Ingestor, IngestSummary
from .schema import CollectionSchema
from .search import Hit, QueryEmbedding, Searcher
from .sources import Document
from .stores.base import RRF_K, BGEM3Store, Mode
from .stores.open import as_store, open_store, resolve_target


class Collection:
    """A collection `name` in `store` (a BGEM3Store from `open_store`, or a QdrantClient).

    `schema` is used when `add` creates the collection (default: the standard names, the encoder's size);
    `options` sets chunking and batching for `add`. `owns_store=True` closes the store with `close()`.
    """

    def __init__(
        self,
        store: Any,
        name: str,
        encoder: EncoderLike,
        *,
        schema: CollectionSchema | None = None,
        options: IngestOptions | None = None,
        owns_store: bool = False,
    ) -> None:
        self.store: BGEM3Store = as_store(store)
        self.name = name
        self.encoder = encoder
        self.schema = schema or CollectionSchema(size=int(encoder.hidden_size))
        self.options = options or IngestOptions(show_progress=False)
        self.owns_store = owns_store
        self._searcher = Searcher(self.store, name, encoder, self.schema)

    @classmethod
    def open(
        cls,
        name: str,
        encoder: EncoderLike,
        *,
        path: str | None = None,
        url: str | None = None,
        api_key: str | None = None,
        **kwargs: Any,
    ) -> Collection:
        """The collection in Qdrant Edge at `path` (default ./qdrant_data) or on the server at `url`
        (QDRANT_URL / QDRANT_API_KEY are read when not given). Close it so another process can open the
        folder."""
        store = open_store(resolve_target(path=path, url=url, api_key=api_key))
        return cls(store, name, encoder, owns_store=True, **kwargs)

    # -- reading
    def exists(self) -> bool:
        return self.store.collection_exists(self.name)

    def count(self) -> int:
        """Points (chunks) stored; 0 before the first `add`."""
        return self.store.count(self.name) if self.exists() else 0

    def embed_query(self, query: str) -> QueryEmbedding:
        """The query's three vectors (one forward pass, under the encoder's lock)."""
        with encoder_lock(self.encoder):
            return self._searcher.embed_query(query)

    def search(
        self,
        query: str,
        *,
        mode: Mode = "rerank",
        limit: int = 10,
        prefetch_limit: int | None = None,
        filter: FilterLike = None,
        rrf_k: int = RRF_K,
    ) -> list[Hit]:
        """Hits for `query` (see `Searcher.search`); a missing collection raises CollectionNotFoundError."""
        return self._searcher.search(
            query,
            mode=mode,
            limit=limit,
            prefetch_limit=prefetch_limit,
            filter=filter,
            rrf_k=rrf_k,
            embedding=self.embed_query(query),
        )

    # -- writing
    def add(self, documents: Iterable[Document]) -> IngestSummary:
        """Chunk, encode and store documents (creating the collection on first use).

        Chunks already stored are skipped; a document id stored before has its chunks replaced.
        """
        ingestor = Ingestor(self.store, self.name, self.encoder, self.schema, self.options)
        with encoder_lock(self.encoder):
            return ingestor.ingest_documents(documents)

    def delete_documents(self, doc_ids: Sequence[str]) -> None:
        """Delete every chunk of these documents (by the document ids given to `add`)."""
        if doc_ids and self.exists():
            self.store.delete_by_filter(self.name, doc_filter([str(i) for i in doc_ids]))

    # -- the store
    def qdrant_client(self) -> Any:
        """The QdrantClient behind the store (a server, local mode), or None for Qdrant Edge."""
        return self.store.as_qdrant_client()

    def close(self) -> None:
        """Close the store if this collection opened it (`open`, or owns_store=True)."""
        if self.owns_store:
            self.store.close()

    def __enter__(self) -> Collection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
