"""ColBERT-reranked hybrid retrieval over the bgem3-qdrant collection schema, as LangChain components.

Storage and search are bgem3_qdrant's own code, through its public front for one collection
(`bgem3_qdrant.Collection`): a collection written here can be searched with `bgem3-qdrant search` and the
other way round. A folder path opens Qdrant Edge (Qdrant's own engine in this process, the default
embedded store); a URL opens a server; a QdrantClient (server or local mode) is accepted as it is.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables.config import run_in_executor
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from bgem3_embeddings.query_text import check_query, log_cut_queries
from langchain_bgem3._encoder import import_optional, resolve_encoder

if TYPE_CHECKING:
    import bgem3_qdrant
    from qdrant_client import QdrantClient, models
else:
    # Optional extra: fail on import of this module with the pip command to run.
    import_optional("langchain_qdrant", "langchain-qdrant", extra="qdrant")
    import_optional("qdrant_client", "qdrant-client", extra="qdrant")
    bgem3_qdrant = import_optional("bgem3_qdrant", "bgem3-qdrant", extra="qdrant")
    from qdrant_client import QdrantClient, models

logger = logging.getLogger("langchain_bgem3")
SearchMode = Literal["rerank", "hybrid", "dense", "sparse"]  # bgem3_qdrant.Mode
FilterLike = Mapping[str, Any] | models.Filter | None


def _check_store(value: Any) -> Any:
    """A bgem3_qdrant store (from `open_store`) or a QdrantClient, kept as given."""
    try:
        bgem3_qdrant.as_store(value)
    except TypeError as e:
        raise ValueError(
            "client must be a store from bgem3_qdrant.open_store (Qdrant Edge for a path, a server for a "
            f"URL) or a qdrant_client.QdrantClient, got {type(value).__name__}"
        ) from e
    return value


class _Front:
    """One bgem3_qdrant.Collection per component, rebuilt only when the fields it is made of change.

    Reusing it keeps its once-per-collection checks (vector size, model identity) off every query.
    """

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._collection: Any = None

    def get(self, client: Any, name: str, encoder: Any, schema: Any = None, **options: Any) -> Any:
        key = (id(client), name, id(encoder), schema, tuple(sorted(options.items())))
        if key != self._key:
            self._collection = bgem3_qdrant.Collection(
                client, name, encoder, schema=schema, options=bgem3_qdrant.IngestOptions(**options),
                owns_store=True,  # close() closes `client`
            )
            self._key = key
        return self._collection


def _source(doc: Document) -> str:
    """The Document's own `source` metadata as text, or "" when it has none (the payload's source field
    is a string: bgem3-qdrant check holds every point to it)."""
    value = doc.metadata.get("source")
    return "" if value is None else str(value)


def _document_id(doc: Document) -> str:
    """Stable id for a Document without one: same text and metadata -> same id, so re-adding is a no-op."""
    blob = json.dumps([doc.page_content, doc.metadata], sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]


class BGEM3QdrantIndex(BaseModel):
    """Add LangChain Documents to a bgem3-qdrant collection (dense + sparse + ColBERT named vectors).

    The collection is created on first use with the bgem3-qdrant schema. Long documents are cut into
    token chunks of at most `chunk_size` tokens (shorter ones stay one point); already stored chunks
    are skipped, so adding the same documents again costs no encoding.

    `client` is a bgem3_qdrant store (`BGEM3QdrantIndex.open(path=...)` or `bgem3_qdrant.open_store`:
    Qdrant Edge for a folder, the default) or any QdrantClient (a server, or qdrant-client's local mode).

    Example:
        ```python
        with BGEM3QdrantIndex.open("notes", encoder, path="./qdrant_data") as index:  # Qdrant Edge
            index.add_documents(docs)
            docs = index.as_retriever(k=5).invoke("how do I reset the router?")
        ```
    """

    client: Any
    """A bgem3_qdrant store (Qdrant Edge, a server) or a QdrantClient (server, local mode)."""
    collection_name: str
    encoder: Any = Field(exclude=True, repr=False)
    """A BGEM3Encoder, or a langchain_bgem3 component holding one (the model is shared, not reloaded)."""
    collection_schema: Any = None
    """bgem3_qdrant.CollectionSchema; default: the standard names with the encoder's hidden size."""
    chunk_size: int = 512
    chunk_overlap: int = 64
    batch_size: int = 32
    show_progress: bool = False

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=(), extra="forbid")
    _front: _Front = PrivateAttr(default_factory=_Front)

    @field_validator("encoder", mode="before")
    @classmethod
    def _resolve(cls, value: Any) -> Any:
        return resolve_encoder(value)

    @field_validator("client")
    @classmethod
    def _check_client(cls, value: Any) -> Any:
        return _check_store(value)

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
    ) -> BGEM3QdrantIndex:
        """An index on bgem3_qdrant's store: Qdrant Edge in `path` (default ./qdrant_data) or a server.

        The index owns the store: close it (`close()` or a `with` block) so another process can open it.
        """
        store = bgem3_qdrant.open_store(bgem3_qdrant.resolve_target(path=path, url=url, api_key=api_key))
        return cls(client=store, collection_name=collection_name, encoder=encoder, **kwargs)

    def _collection(self) -> Any:
        return self._front.get(
            self.client, self.collection_name, self.encoder, self.collection_schema,
            chunk_size=self.chunk_size, chunk_overlap=self.chunk_overlap, batch_size=self.batch_size,
            show_progress=self.show_progress,
        )

    def close(self) -> None:
        """Close the store (releases an embedded store's folder for other processes)."""
        self._collection().close()

    def __enter__(self) -> BGEM3QdrantIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_documents(self, documents: Sequence[Document], ids: Sequence[str] | None = None) -> list[str]:
        """Store documents; returns their ids (Document.id, `ids`, or a content hash), one per document.

        Adding a document with an id already stored replaces that document's chunks.
        """
        if ids is not None and len(ids) != len(documents):
            raise ValueError(f"got {len(ids)} ids for {len(documents)} documents")
        doc_ids = [
            str(ids[i]) if ids is not None else (str(d.id) if d.id else _document_id(d))
            for i, d in enumerate(documents)
        ]
        records = [
            bgem3_qdrant.Document(
                doc_id=doc_id,
                # The file the Document names (a loader's metadata["source"]), else nothing: never its id,
                # which has its own field, so a hit's `source` is a file name or empty.
                source=_source(d),
                text=d.page_content,
                metadata=dict(d.metadata),
            )
            for doc_id, d in zip(doc_ids, documents, strict=True)
        ]
        self._collection().add(records)
        return doc_ids

    def add_texts(self, texts: Iterable[str], metadatas: Sequence[dict[str, Any]] | None = None,
                  ids: Sequence[str] | None = None) -> list[str]:
        """Store plain texts (with optional metadata); returns their ids."""
        texts = list(texts)
        metadatas = list(metadatas) if metadatas is not None else [{} for _ in texts]
        if len(metadatas) != len(texts):
            raise ValueError(f"got {len(metadatas)} metadatas for {len(texts)} texts")
        docs = [Document(page_content=t, metadata=m) for t, m in zip(texts, metadatas, strict=True)]
        return self.add_documents(docs, ids=ids)

    async def aadd_documents(
        self, documents: Sequence[Document], ids: Sequence[str] | None = None
    ) -> list[str]:
        """Async add_documents (runs in a worker thread)."""
        return await run_in_executor(None, self.add_documents, documents, ids)

    def delete(self, ids: Sequence[str]) -> None:
        """Delete documents (all their chunks) by the ids add_documents returned."""
        self._collection().delete_documents([str(i) for i in ids])

    def as_vector_store(self, retrieval_mode: str = "hybrid") -> Any:
        """A langchain_qdrant.QdrantVectorStore reading this collection (dense, sparse or hybrid RRF).

        For LangChain tools that want a VectorStore (similarity_search_with_score, MMR...). Write through
        this index, not the vector store: QdrantVectorStore.add_texts stores no ColBERT vectors and no
        doc_id, so its points would be missing from the ColBERT-reranked retriever.

        QdrantVectorStore talks to a QdrantClient, so this needs the index on a server or on
        qdrant-client's local mode; a Qdrant Edge store is searched with `as_retriever()` instead.
        """
        from langchain_qdrant import QdrantVectorStore, RetrievalMode

        collection = self._collection()
        client = collection.qdrant_client()  # None for Qdrant Edge
        if not isinstance(client, QdrantClient):
            raise ValueError(
                "as_vector_store needs a QdrantClient (langchain_qdrant.QdrantVectorStore cannot read "
                "a Qdrant Edge store): open the index on a server (url=...) or on QdrantClient(path=...) "
                "for small data, or search this store with as_retriever()"
            )

        from bgem3_qdrant import payload

        from langchain_bgem3.embeddings import BGEM3Embeddings
        from langchain_bgem3.sparse import BGEM3SparseEmbeddings

        schema = collection.schema
        mode = RetrievalMode(retrieval_mode)
        dense = BGEM3Embeddings(encoder=self.encoder) if mode != RetrievalMode.SPARSE else None
        sparse = BGEM3SparseEmbeddings(encoder=self.encoder) if mode != RetrievalMode.DENSE else None
        return QdrantVectorStore(
            client=client,
            collection_name=self.collection_name,
            embedding=dense,
            sparse_embedding=sparse,
            retrieval_mode=mode,
            vector_name=schema.dense_name,
            sparse_vector_name=schema.sparse_name,
            content_payload_key=payload.TEXT,  # bgem3-qdrant's payload layout
            metadata_payload_key=payload.METADATA,
        )

    def as_retriever(self, **kwargs: Any) -> BGEM3Retriever:
        """A BGEM3Retriever on this collection, sharing this index's client, encoder and schema.

        `reranker=BGEM3Reranker(...)` (and `rerank_candidates=N`) adds the cross-encoder stage: the mode's
        top N ordered by bge-reranker-v2-m3, the best k returned."""
        params: dict[str, Any] = {"client": self.client, "collection_name": self.collection_name,
                                  "encoder": self.encoder, "collection_schema": self.collection_schema}
        return BGEM3Retriever(**{**params, **kwargs})


class BGEM3Retriever(BaseRetriever):
    """Dense + sparse candidates from Qdrant, reranked by ColBERT MaxSim inside Qdrant (one Query API call).

    Document.metadata carries the stored metadata plus `score` (Qdrant's final score), `colbert_score`
    (reference scale: equals `BGEM3Encoder.colbert_score`), `dense_score`, `sparse_score`, `_id`,
    `doc_id`, `source`, `chunk_index` and `_collection_name`.

    Example:
        ```python
        index = BGEM3QdrantIndex(client=client, collection_name="notes", encoder=encoder)
        index.add_documents(docs)
        retriever = index.as_retriever(k=5, filter={"lang": "en"})
        retriever.invoke("how do I reset the router?", k=3)
        ```
    """

    client: Any
    """A bgem3_qdrant store (Qdrant Edge for a folder, a server) or a QdrantClient (server, local mode)."""
    collection_name: str
    encoder: Any = Field(exclude=True, repr=False)
    """A BGEM3Encoder, or a langchain_bgem3 component holding one (shared, not reloaded)."""
    k: int = Field(default=4, ge=1)
    """Number of documents to return."""
    prefetch_limit: int | None = Field(default=None, ge=1)
    """Candidates taken from each of the dense and sparse indexes before the rerank
    (default max(4 * k, 50))."""
    filter: Any = None
    """Payload filter: a qdrant `models.Filter`, or {key: value} (lists match any value); keys other
    than bgem3-qdrant's own payload fields (source, doc_id, ...) refer to document metadata."""
    mode: SearchMode = "rerank"
    """rerank (ColBERT over dense+sparse candidates), hybrid (RRF fusion), dense or sparse."""
    collection_schema: Any = None
    """bgem3_qdrant.CollectionSchema; default: the standard names with the encoder's hidden size."""
    reranker: Any = Field(default=None, exclude=True, repr=False)
    """A cross-encoder stage (a BGEM3Reranker, or a langchain_bgem3 rerank component holding one): the
    mode's top `rerank_candidates` ordered by it, the best k returned, `cross_encoder_score` (its logit)
    in the metadata and as `score`. None: the mode orders the hits."""
    rerank_candidates: int | None = Field(default=None, ge=1)
    """The mode's hits the cross-encoder reads (default 20, at least k)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=(), extra="forbid")
    _front: _Front = PrivateAttr(default_factory=_Front)

    @field_validator("encoder", mode="before")
    @classmethod
    def _resolve(cls, value: Any) -> Any:
        return resolve_encoder(value)

    @field_validator("reranker", mode="before")
    @classmethod
    def _resolve_reranker(cls, value: Any) -> Any:
        from langchain_bgem3.rerank import resolve_reranker

        return resolve_reranker(value) if value is not None else None

    @field_validator("client")
    @classmethod
    def _check_client(cls, value: Any) -> Any:
        return _check_store(value)

    @field_validator("filter")
    @classmethod
    def _check_filter(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, Mapping | models.Filter):
            raise ValueError(f"filter must be a qdrant models.Filter or a dict, got {type(value).__name__}")
        return value

    def _collection(self) -> Any:
        return self._front.get(self.client, self.collection_name, self.encoder, self.collection_schema)

    def add_documents(self, documents: Sequence[Document], ids: Sequence[str] | None = None,
                      **index_kwargs: Any) -> list[str]:
        """Store documents in this retriever's collection (see BGEM3QdrantIndex.add_documents)."""
        index = BGEM3QdrantIndex(client=self.client, collection_name=self.collection_name,
                                 encoder=self.encoder, collection_schema=self.collection_schema,
                                 **index_kwargs)
        return index.add_documents(documents, ids=ids)

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
        filter: FilterLike = None,
        prefetch_limit: int | None = None,
        mode: SearchMode | None = None,
    ) -> list[Document]:
        """Search; `k`, `filter`, `prefetch_limit` and `mode` given here override the fields."""
        from bgem3_qdrant.cross_encoder import search_with_cross_encoder

        log_cut_queries(logger, self.encoder, [check_query(query)])
        hits = search_with_cross_encoder(
            self._collection(),
            query,
            self.reranker,
            limit=k or self.k,
            rerank_candidates=self.rerank_candidates,
            mode=mode or self.mode,
            prefetch_limit=prefetch_limit or self.prefetch_limit,
            filter=filter if filter is not None else self.filter,
        )
        return [self._to_document(h) for h in hits]

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
        filter: FilterLike = None,
        prefetch_limit: int | None = None,
        mode: SearchMode | None = None,
    ) -> list[Document]:
        """Async search in a worker thread (the encoder and the local Qdrant client are synchronous)."""
        return await run_in_executor(
            None, lambda: self._get_relevant_documents(
                query, run_manager=run_manager.get_sync(), k=k, filter=filter,
                prefetch_limit=prefetch_limit, mode=mode,
            )
        )

    def _to_document(self, hit: bgem3_qdrant.Hit) -> Document:
        metadata = hit.flat_metadata()
        metadata.update({"_id": hit.id, "_collection_name": self.collection_name, "score": hit.score})
        return Document(id=hit.id, page_content=hit.text, metadata=metadata)
