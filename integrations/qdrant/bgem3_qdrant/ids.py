"""Deterministic point ids: the same chunk of the same document always gets the same id."""

from __future__ import annotations

import hashlib
import uuid

# A fixed namespace so ids are stable across runs, machines and engines (plain / Ray).
NAMESPACE = uuid.UUID("3f1b7a52-6d0e-5b8c-9a41-2c7e0d5f8b13")


def content_hash(text: str) -> str:
    """Hex SHA-256 of the chunk text (stored in the payload too)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def point_id(doc_id: str, chunk_index: int, text_hash: str) -> str:
    """uuid5 of (document id, chunk index, content hash), as a string Qdrant accepts as a point id.

    The content hash is part of the id so a stored id proves the stored chunk is unchanged: a re-run
    can skip it without comparing vectors; changed chunks get new ids and the old ones are pruned.
    """
    return str(uuid.uuid5(NAMESPACE, f"{doc_id}\x1f{chunk_index}\x1f{text_hash}"))
