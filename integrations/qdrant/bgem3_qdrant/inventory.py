"""What a store holds, collection by collection: chunks, the model that wrote it, its ColBERT storage, its
size on disk and the metadata keys a filter can use.

`bgem3-qdrant collections` prints it; the MCP `collections` tool and the page's collection list return it,
with whether their own model can search each collection (`ui/session.py`).
"""

from __future__ import annotations

from typing import Any

from .errors import BGEM3QdrantError
from .identity import stored_identity
from .payload import METADATA
from .schema import describe_colbert_storage
from .stores.base import BGEM3Store

# Points read for the filter suggestions (metadata key=value pairs seen in them).
FILTER_SAMPLE = 256
FILTER_SUGGESTIONS = 40


def describe_collection(store: BGEM3Store, name: str) -> dict[str, Any]:
    """One collection: `chunks`, vector `size`, `model` and `precision` that wrote it, ColBERT `storage`
    (dtype, pooling, copy), `disk_bytes` (None where not visible: a server), `metadata_keys` and `filters`
    (key=value pairs seen); `problem` says why it cannot be read (None when it can)."""
    out: dict[str, Any] = {"name": name, "problem": None}
    try:
        schema = store.stored_schema(name)
        identity = stored_identity(store, name)
        pooling = identity.colbert_pooling if identity else 1
        out.update(
            chunks=store.count(name),
            size=schema.size,
            colbert_dtype=schema.colbert_dtype,
            model=identity.model if identity else None,
            precision=identity.precision if identity else None,
            pooling=pooling,
            sparse_modifier=schema.sparse_modifier,
            storage=describe_colbert_storage(schema, pooling),
            disk_bytes=store.disk_bytes(name),
            **metadata_seen(store, name),
        )
    except BGEM3QdrantError as e:  # one damaged or foreign collection does not hide the others
        out["problem"] = str(e)
    return out


def describe_store(store: BGEM3Store) -> list[dict[str, Any]]:
    """Every collection of `store`, by name (`describe_collection`)."""
    return [describe_collection(store, name) for name in store.list_collections()]


def metadata_seen(store: BGEM3Store, name: str) -> dict[str, list[str]]:
    """The metadata keys of the first points (`metadata_keys`) and `key=value` pairs seen in them
    (`filters`: what the page's filter box proposes)."""
    points, _ = store.scroll(name, limit=FILTER_SAMPLE, with_payload=[METADATA])
    keys: set[str] = set()
    seen: dict[str, set[str]] = {}
    for p in points:
        for key, value in (p.payload.get(METADATA) or {}).items():
            keys.add(str(key))
            if isinstance(value, str | int) and not isinstance(value, bool) and len(str(value)) <= 40:
                seen.setdefault(str(key), set()).add(str(value))
    pairs = [f"{k}={v}" for k in sorted(seen) for v in sorted(seen[k])[:8]]
    return {"metadata_keys": sorted(keys), "filters": pairs[:FILTER_SUGGESTIONS]}
