"""BGE-M3 in Qdrant: dense + sparse + ColBERT named vectors, ingestion, hybrid search, Ray and Spark engines.

The data flow, one module per step (docs/architecture.md has the whole map):

    sources -> chunking -> ingest/plan -> ingest/plain | ingest/ray | ingest/spark -> ingest/writer -> stores/
    search (Searcher) reads a collection; collection (Collection) is the front for one collection.
"""

from __future__ import annotations

from .chunking import Chunk, chunk_text
from .collection import Collection
from .errors import (
    BGEM3QdrantError,
    CollectionNotFoundError,
    LegacyStoreError,
    SchemaMismatchError,
    SourceError,
    StoreUnavailableError,
)
from .ids import point_id
from .ingest import Encoding, IngestOptions, Ingestor, IngestSummary, PlainEncoding
from .schema import CollectionSchema
from .search import Hit, Searcher
from .sources import Document, iter_documents
from .stores import (
    MODES,
    BGEM3Store,
    Mode,
    StoreTarget,
    as_store,
    ensure_collection,
    open_store,
    resolve_target,
)

__all__ = [
    "MODES",
    "BGEM3QdrantError",
    "BGEM3Store",
    "Chunk",
    "Collection",
    "CollectionNotFoundError",
    "CollectionSchema",
    "Document",
    "Encoding",
    "Hit",
    "IngestOptions",
    "IngestSummary",
    "Ingestor",
    "LegacyStoreError",
    "Mode",
    "PlainEncoding",
    "SchemaMismatchError",
    "Searcher",
    "SourceError",
    "StoreTarget",
    "StoreUnavailableError",
    "as_store",
    "chunk_text",
    "ensure_collection",
    "iter_documents",
    "open_store",
    "point_id",
    "resolve_target",
]
__version__ = "0.1.0"
