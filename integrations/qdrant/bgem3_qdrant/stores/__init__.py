"""Store engines behind one interface: Qdrant Edge (embedded default), qdrant-client (server, local)."""

from __future__ import annotations

from typing import Any

from .base import RRF_K, BGEM3Store, QuerySpec, ScoredPoint, StoredPoint, doc_filter
from .layout import LegacyStoreError


def as_store(obj: Any) -> BGEM3Store:
    """A BGEM3Store as is; a QdrantClient (server or local mode) wrapped in one."""
    if isinstance(obj, BGEM3Store):
        return obj
    from qdrant_client import QdrantClient

    if isinstance(obj, QdrantClient):
        from .client_store import ClientStore

        return ClientStore(obj)
    raise TypeError(
        f"expected a store from bgem3_qdrant.open_client or a QdrantClient, got {type(obj).__name__}"
    )


__all__ = [
    "RRF_K",
    "BGEM3Store",
    "LegacyStoreError",
    "QuerySpec",
    "ScoredPoint",
    "StoredPoint",
    "as_store",
    "doc_filter",
]
