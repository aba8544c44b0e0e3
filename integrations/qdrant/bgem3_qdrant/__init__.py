"""BGE-M3 in Qdrant: dense + sparse + ColBERT named vectors, ingestion, hybrid search, Ray Data engine."""

from __future__ import annotations

from .chunking import Chunk, chunk_text
from .client import StoreTarget, open_client, resolve_target
from .errors import (
    BGEM3QdrantError,
    CollectionNotFoundError,
    SchemaMismatchError,
    SourceError,
    StoreUnavailableError,
)
from .ids import point_id
from .ingest import IngestOptions, Ingestor, IngestSummary
from .schema import CollectionSchema, ensure_collection
from .search import Hit, Searcher
from .sources import Document, iter_documents
from .stores import BGEM3Store, LegacyStoreError

__all__ = [
    "BGEM3Store",
    "LegacyStoreError",
    "BGEM3QdrantError",
    "Chunk",
    "CollectionNotFoundError",
    "CollectionSchema",
    "Document",
    "Hit",
    "IngestOptions",
    "IngestSummary",
    "Ingestor",
    "SchemaMismatchError",
    "Searcher",
    "SourceError",
    "StoreTarget",
    "StoreUnavailableError",
    "chunk_text",
    "ensure_collection",
    "iter_documents",
    "open_client",
    "point_id",
    "resolve_target",
]
__version__ = "0.1.0"
