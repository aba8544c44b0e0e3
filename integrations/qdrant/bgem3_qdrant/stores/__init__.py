"""Store engines behind one interface (`BGEM3Store`): Qdrant Edge (folder, default), qdrant-client (server,
local mode). `open_store` picks one for a `StoreTarget`; nothing outside this package checks which it is."""

from __future__ import annotations

from .base import (
    MODES,
    RRF_K,
    BGEM3Store,
    Mode,
    QuerySpec,
    ScoredPoint,
    StoredPoint,
    ensure_collection,
)
from .open import STORE_ENGINES, StoreEngine, StoreTarget, as_store, open_store, resolve_target

__all__ = [
    "MODES",
    "RRF_K",
    "STORE_ENGINES",
    "BGEM3Store",
    "Mode",
    "QuerySpec",
    "ScoredPoint",
    "StoreEngine",
    "StoreTarget",
    "StoredPoint",
    "as_store",
    "ensure_collection",
    "open_store",
    "resolve_target",
]
