"""One model per collection: the identity of the model that wrote a collection, recorded and checked.

Vectors of two models are not comparable even when their sizes match, so a collection records which
checkpoint wrote it (its fingerprint: config, tokenizer and sampled weights, see
`bgem3_embeddings.checkpoint.fingerprint`), with the hub id or folder and the precision. Ingest and search
with another checkpoint are refused; precisions of the same weights (float32, bfloat16, int8) share a
collection. A collection written before records existed is adopted on first use when the `model` every
point records in its payload is the running model's name.

The record also holds the ColBERT pooling factor of the stored documents (pooling.py; 1: unpooled, and
what a record without the field means): an ingest with another factor is refused like another model,
since one collection's rows must all be pooled alike for its rerank scores to compare.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, fields
from typing import Any

from .errors import BGEM3QdrantError
from .payload import MODEL
from .stores.base import BGEM3Store

logger = logging.getLogger(__name__)
# Points read to adopt a collection on search (a read-only check; ingest reads them all and records).
SEARCH_ADOPTION_SAMPLE = 256


@dataclass(frozen=True)
class ModelIdentity:
    """Which model wrote a collection. `fingerprint` None: the encoder cannot tell (not a BGEM3Encoder)."""

    model: str
    fingerprint: str | None = None
    precision: str | None = None
    vocab_size: int | None = None
    # ColBERT token pooling factor of the stored documents (1: rows as the model gives them).
    colbert_pooling: int = 1

    def same_weights(self, other: ModelIdentity) -> bool:
        if self.fingerprint and other.fingerprint:
            return self.fingerprint == other.fingerprint
        return self.model == other.model

    def describe(self) -> str:
        details = [f"fingerprint {self.fingerprint[:12]}" if self.fingerprint else "no fingerprint"]
        if self.precision:
            details.append(self.precision)
        return f"{self.model} ({', '.join(details)})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelIdentity:
        known = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or not isinstance(data.get("model"), str):
            raise ValueError(f"not a model record: {json.dumps(data)[:200]}")
        return cls(**{k: v for k, v in data.items() if k in known})


class ModelMismatchError(BGEM3QdrantError):
    """The collection was written by another model; nothing was read or written."""


def identity_of(encoder: Any, model_id: str | None = None) -> ModelIdentity | None:
    """The identity of a BGEM3Encoder or an Encoding (None for encoders that cannot tell their weights)."""
    fingerprint = getattr(encoder, "fingerprint", None)
    if not callable(fingerprint):
        return None
    config = getattr(getattr(encoder, "config", None), "vocab_size", None)
    return ModelIdentity(
        model=model_id or str(getattr(encoder, "model_id", "unknown")),
        fingerprint=str(fingerprint()),
        precision=getattr(encoder, "precision", None),
        vocab_size=getattr(encoder, "vocab_size", None) or config,
    )


def _mismatch(collection: str, stored: str, running: ModelIdentity) -> ModelMismatchError:
    return ModelMismatchError(
        f"collection {collection!r} holds vectors of another model (--model): it was written by {stored}, "
        f"this run uses {running.describe()}; search it with the model that wrote it, ingest into another "
        "--collection, or re-ingest everything into a new one (precisions of the same weights, float32, "
        "bfloat16 and int8, may share a collection)"
    )


def _pooling_mismatch(collection: str, stored: int, running: int) -> ModelMismatchError:
    return ModelMismatchError(
        f"collection {collection!r} holds ColBERT rows pooled with factor {stored} (--colbert-pooling): "
        f"this run asks for factor {running}; ingest with --colbert-pooling {stored} (or leave the option "
        "out to use the collection's own), or into another --collection"
    )


def stored_identity(store: BGEM3Store, collection: str) -> ModelIdentity | None:
    """The identity recorded for `collection` (None: no record yet); a damaged record is one clear error."""
    stored = store.read_model_record(collection)
    if stored is None:
        return None
    try:
        return ModelIdentity.from_dict(stored)
    except (TypeError, ValueError) as e:
        raise BGEM3QdrantError(
            f"the model record of collection {collection!r} is damaged ({e}); run "
            f"`bgem3-qdrant check -c {collection}`"
        ) from e


def stored_pooling(store: BGEM3Store, collection: str) -> int:
    """The ColBERT pooling factor of a collection's stored documents (1: unpooled, no record, or a
    record written before the factor was recorded)."""
    identity = stored_identity(store, collection)
    return identity.colbert_pooling if identity is not None else 1


def payload_models(store: BGEM3Store, collection: str, limit: int | None = None) -> set[str]:
    """The `model` names points record in their payloads (all points, or the first `limit`)."""
    names: set[str] = set()
    for i, p in enumerate(store.iter_points(collection, with_payload=[MODEL])):
        if limit is not None and i >= limit:
            break
        name = p.payload.get(MODEL)
        names.add(str(name) if name is not None else "an unrecorded model")
    return names


def ensure_model(store: BGEM3Store, collection: str, running: ModelIdentity | None, *, write: bool) -> None:
    """Refuse (ModelMismatchError) unless `running` is the model that wrote `collection`.

    `write`: record the identity when the collection has none yet (ingest); a search only reads.
    Writing also needs `running.colbert_pooling` to be the collection's factor (a search reads rows
    pooled any way: queries are never pooled).
    """
    if running is None:
        return
    identity = stored_identity(store, collection)
    if identity is not None:
        if not identity.same_weights(running):
            raise _mismatch(collection, identity.describe(), running)
        if write and identity.colbert_pooling != running.colbert_pooling:
            raise _pooling_mismatch(collection, identity.colbert_pooling, running.colbert_pooling)
        return
    # No record: a new collection, or one written before records existed.
    names = payload_models(store, collection, None if write else SEARCH_ADOPTION_SAMPLE)
    others = names - {running.model}
    if others:
        raise _mismatch(collection, " and ".join(sorted(others)) + " (recorded in its points)", running)
    if write and names and running.colbert_pooling != 1:  # points written before records were unpooled
        raise _pooling_mismatch(collection, 1, running.colbert_pooling)
    if write:
        store.write_model_record(collection, running.to_dict())
        if names:
            logger.info("collection %s adopted: written by %s", collection, running.describe())
