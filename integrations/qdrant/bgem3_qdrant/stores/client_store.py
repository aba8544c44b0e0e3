"""The store interface on qdrant-client: a Qdrant server (`--url`), or local mode (`--store-engine local`).

Local mode (qdrant-client's pure-Python engine, `QdrantClient(path=...)`) is kept for stores written
by earlier releases (see `bgem3-qdrant migrate`) and for side-by-side benchmarks; Edge is the default
embedded engine.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from qdrant_client import QdrantClient, models

from ..schema import CollectionSchema, client_schema_problems, client_stored_schema
from .base import BGEM3Store, QuerySpec, ScoredPoint, StoredPoint

logger = logging.getLogger(__name__)


def is_local_client(client: QdrantClient) -> bool:
    """True for qdrant-client's local mode (a path or ":memory:"), which runs in this process."""
    opts = client.init_options
    return opts.get("path") is not None or opts.get("location") == ":memory:"


def _vectors_out(vector: Any) -> dict[str, Any]:
    """qdrant-client record vectors as numpy arrays / (indices, values) pairs."""
    out: dict[str, Any] = {}
    if not isinstance(vector, dict):
        return out
    for k, v in vector.items():
        if isinstance(v, models.SparseVector):
            out[k] = (np.asarray(v.indices, np.int64), np.asarray(v.values, np.float32))
        else:
            out[k] = np.asarray(v, np.float32)
    return out


class ClientStore(BGEM3Store):
    """BGEM3Store over a QdrantClient (server or local mode)."""

    def __init__(self, client: QdrantClient, *, description: str | None = None) -> None:
        self.client = client
        self.local = is_local_client(client)
        self.kind = "local" if self.local else "server"
        self.in_process = self.local
        self._description = description
        self._tuned: set[str] = set()

    def describe(self) -> str:
        if self._description:
            return self._description
        opts = self.client.init_options
        return str(opts.get("url") or opts.get("path") or opts.get("location") or "qdrant")

    def collection_exists(self, name: str) -> bool:
        return bool(self.client.collection_exists(name))

    def list_collections(self) -> list[str]:
        return sorted(c.name for c in self.client.get_collections().collections)

    def create_collection(self, name: str, schema: CollectionSchema) -> None:
        self.client.create_collection(
            name, vectors_config=schema.vectors_config(), sparse_vectors_config=schema.sparse_vectors_config()
        )

    def schema_problems(self, name: str, schema: CollectionSchema) -> list[str]:
        return client_schema_problems(self.client, name, schema)

    def stored_schema(self, name: str) -> CollectionSchema:
        return client_stored_schema(self.client, name)

    def _tune(self, name: str) -> None:
        if self.local and name not in self._tuned:
            self._tuned.add(name)
            tune_local_storage(self.client, name)

    def _point(self, p: StoredPoint) -> models.PointStruct:
        vector: dict[str, Any] = {}
        for k, v in p.vectors.items():
            if isinstance(v, tuple):
                idx, val = v
                sv = models.SparseVector.model_construct(
                    indices=np.asarray(idx).tolist(), values=np.asarray(val).tolist()
                )
                vector[k] = sv if self.local else models.SparseVector(indices=sv.indices, values=sv.values)
            else:
                # Local mode converts to numpy anyway; a server needs lists.
                vector[k] = np.asarray(v, np.float32) if self.local else np.asarray(v, np.float32).tolist()
        if self.local:
            # No pydantic validation per float: ColBERT matrices hold hundreds of thousands of floats.
            return models.PointStruct.model_construct(id=p.id, vector=vector, payload=p.payload)
        return models.PointStruct(id=p.id, vector=vector, payload=p.payload)

    def upsert(self, name: str, points: Sequence[StoredPoint]) -> None:
        self._tune(name)
        self.client.upsert(name, [self._point(p) for p in points], wait=True)

    def retrieve(
        self,
        name: str,
        ids: Sequence[str],
        *,
        with_payload: bool = True,
        with_vectors: bool | list[str] = False,
    ) -> list[StoredPoint]:
        recs = self.client.retrieve(name, list(ids), with_payload=with_payload, with_vectors=with_vectors)
        return [StoredPoint(str(r.id), dict(r.payload or {}), _vectors_out(r.vector)) for r in recs]

    def overwrite_payload(self, name: str, ids: Sequence[str], payload: dict[str, Any]) -> None:
        self.client.overwrite_payload(name, payload=payload, points=list(ids), wait=True)

    def scroll(
        self,
        name: str,
        *,
        filter: models.Filter | None = None,
        limit: int = 1024,
        offset: Any = None,
        with_payload: bool | list[str] = True,
        with_vectors: bool | list[str] = False,
    ) -> tuple[list[StoredPoint], Any]:
        recs, nxt = self.client.scroll(
            name,
            scroll_filter=filter,
            limit=limit,
            offset=offset,
            with_payload=with_payload,
            with_vectors=with_vectors,
        )
        return [StoredPoint(str(r.id), dict(r.payload or {}), _vectors_out(r.vector)) for r in recs], nxt

    def delete(self, name: str, ids: Sequence[str]) -> None:
        self.client.delete(name, points_selector=models.PointIdsList(points=list(ids)), wait=True)

    def delete_by_filter(self, name: str, filter: models.Filter) -> None:
        self.client.delete(name, points_selector=models.FilterSelector(filter=filter), wait=True)

    def count(self, name: str, filter: models.Filter | None = None) -> int:
        return int(self.client.count(name, count_filter=filter, exact=True).count)

    def query(self, name: str, spec: QuerySpec) -> list[ScoredPoint]:
        s = self.stored_names(name)
        sparse_q = models.SparseVector(indices=spec.sparse[0].tolist(), values=spec.sparse[1].tolist())
        flt = spec.filter
        params = models.SearchParams(exact=True) if spec.exact else None
        prefetch = [
            models.Prefetch(
                query=spec.dense.tolist(),
                using=s.dense_name,
                limit=spec.prefetch_limit,
                filter=flt,
                params=params,
            )
        ]
        if len(spec.sparse[0]):  # a query with no lexical weight has no sparse candidates
            prefetch.append(
                models.Prefetch(
                    query=sparse_q, using=s.sparse_name, limit=spec.prefetch_limit, filter=flt, params=params
                )
            )
        kwargs: dict[str, Any]
        if spec.mode == "dense":
            kwargs = {"query": spec.dense.tolist(), "using": s.dense_name}
        elif spec.mode == "sparse":
            kwargs = {"query": sparse_q, "using": s.sparse_name}
        elif spec.mode == "hybrid":
            kwargs = {"prefetch": prefetch, "query": models.RrfQuery(rrf=models.Rrf(k=spec.rrf_k))}
        else:
            kwargs = {"prefetch": prefetch, "query": spec.colbert.tolist(), "using": s.colbert_name}
        res = self.client.query_points(
            name,
            query_filter=flt,
            search_params=params,
            limit=spec.limit,
            with_payload=True,
            with_vectors=spec.with_vectors or False,
            **kwargs,
        )
        return [
            ScoredPoint(str(p.id), dict(p.payload or {}), _vectors_out(p.vector), float(p.score))
            for p in res.points
        ]

    def stored_names(self, name: str) -> CollectionSchema:
        """Vector names to query (the collection's own; cached per collection)."""
        cache: dict[str, CollectionSchema] = self.__dict__.setdefault("_names", {})
        if name not in cache:
            try:
                cache[name] = self.stored_schema(name)
            except Exception:  # not a bgem3-qdrant layout: the standard names
                cache[name] = CollectionSchema()
        return cache[name]

    def create_payload_index(self, name: str, field_name: str, kind: Literal["keyword", "integer"]) -> None:
        if self.local:
            return  # local mode has no payload indexes (it warns and ignores them)
        schema = models.PayloadSchemaType.KEYWORD if kind == "keyword" else models.PayloadSchemaType.INTEGER
        self.client.create_payload_index(name, field_name=field_name, field_schema=schema, wait=True)

    def payload_indexes(self, name: str) -> set[str]:
        if self.local:
            return set()
        return set((self.client.get_collection(name).payload_schema or {}).keys())

    def close(self) -> None:
        self.client.close()


def tune_local_storage(client: QdrantClient, collection: str) -> bool:
    """Switch local mode's sqlite file for `collection` to WAL with synchronous=NORMAL.

    Local mode commits every point separately; with the default journal each commit waits for an
    fsync (about 20 ms on this project's test machines), which made storing slower than encoding with
    small models. In WAL mode with synchronous=NORMAL a commit survives the process being killed; only
    an OS crash or power loss can drop the last commits, and a re-run re-encodes exactly those.
    This reaches into qdrant-client's local-mode internals, so any failure just keeps the defaults.
    """
    if not is_local_client(client):
        return False
    try:
        storage = client._client.collections[collection].storage  # type: ignore[attr-defined]
        if storage is None:  # ":memory:" has no file
            return False
        con = storage.storage
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")
        return True
    except Exception as e:  # internals differ across qdrant-client versions
        logger.debug("could not tune local storage of %s: %s", collection, e)
        return False
