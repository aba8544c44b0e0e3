"""The store interface on qdrant-client: a Qdrant server (`--url`), or local mode (`--store-engine local`).

Local mode (qdrant-client's pure-Python engine, `QdrantClient(path=...)`) is kept for stores written
by earlier releases (see `bgem3-qdrant migrate`) and for side-by-side benchmarks; Edge is the default
embedded engine.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from qdrant_client import QdrantClient, models

from ..errors import SchemaMismatchError
from ..filters import StoreFilter, to_qdrant_filter
from ..payload import IndexKind
from ..schema import ColbertDtype, ColbertQuantization, CollectionSchema
from .base import (
    RESCORE_OVERSAMPLING,
    BGEM3Store,
    QuerySpec,
    ScoredPoint,
    StoredPoint,
    vectors_from_engine,
)

logger = logging.getLogger(__name__)
# The collection metadata key holding the model that wrote the collection (identity.py).
MODEL_METADATA_KEY = "bgem3_model"


def is_local_client(client: QdrantClient) -> bool:
    """True for qdrant-client's local mode (a path or ":memory:"), which runs in this process."""
    opts = client.init_options
    return opts.get("path") is not None or opts.get("location") == ":memory:"


# -- CollectionSchema <-> qdrant-client collection parameters
_CLIENT_DATATYPE: dict[str, models.Datatype] = {
    "float32": models.Datatype.FLOAT32,
    "float16": models.Datatype.FLOAT16,
    # Qdrant's raw uint8 expects integers 0..255 (unit vectors would become zeros); turbo8 is its 8-bit
    # encoding of float vectors.
    "uint8": models.Datatype.TURBO8,
    "turbo4": models.Datatype.TURBO4,
}
_COLBERT_DTYPE_OF: dict[models.Datatype, ColbertDtype] = {
    models.Datatype.FLOAT32: "float32",
    models.Datatype.FLOAT16: "float16",
    models.Datatype.TURBO8: "uint8",
    models.Datatype.TURBO4: "turbo4",
}


def _quantization_config(kind: str, on_disk: bool = False) -> models.QuantizationConfig | None:
    """The ColBERT copy (schema.colbert_quantization; in RAM unless `on_disk`) as qdrant-client's
    quantization config."""
    if kind == "int8":
        scalar = models.ScalarQuantizationConfig(
            type=models.ScalarType.INT8, quantile=0.99, always_ram=not on_disk
        )
        return models.ScalarQuantization(scalar=scalar)
    if kind == "binary":
        return models.BinaryQuantization(binary=models.BinaryQuantizationConfig(always_ram=not on_disk))
    return None


def _copy_on_disk(config: Any) -> bool:
    """Whether a collection's quantized copy is kept off RAM (always_ram false or unset)."""
    inner = getattr(config, "scalar", None) or getattr(config, "binary", None)
    return inner is not None and not getattr(inner, "always_ram", False)


def _quantization_of(config: Any) -> ColbertQuantization:
    if isinstance(config, models.ScalarQuantization):
        return "int8"
    if isinstance(config, models.BinaryQuantization):
        return "binary"
    return "none"


def vectors_config(schema: CollectionSchema) -> dict[str, models.VectorParams]:
    """Dense and ColBERT vector parameters for create_collection."""
    return {
        schema.dense_name: models.VectorParams(
            size=schema.size, distance=models.Distance.COSINE, on_disk=schema.dense_on_disk
        ),
        schema.colbert_name: models.VectorParams(
            size=schema.size,
            distance=models.Distance.COSINE,
            on_disk=schema.colbert_on_disk,
            datatype=_CLIENT_DATATYPE[schema.colbert_dtype],
            quantization_config=_quantization_config(
                schema.colbert_quantization, schema.colbert_copy_on_disk
            ),
            multivector_config=models.MultiVectorConfig(comparator=models.MultiVectorComparator.MAX_SIM),
            # m=0 disables the HNSW graph: ColBERT is only used to rerank prefetched candidates.
            hnsw_config=models.HnswConfigDiff(m=0),
        ),
    }


def sparse_vectors_config(schema: CollectionSchema) -> dict[str, models.SparseVectorParams]:
    """Sparse vector parameters for create_collection."""
    modifier = models.Modifier.IDF if schema.sparse_modifier == "idf" else models.Modifier.NONE
    return {
        schema.sparse_name: models.SparseVectorParams(
            modifier=modifier, index=models.SparseIndexParams(on_disk=schema.sparse_on_disk)
        )
    }


def client_schema_problems(client: QdrantClient, name: str, schema: CollectionSchema) -> list[str]:
    """Differences between an existing collection and `schema` that would break writes or search.

    Storage options (on_disk) are not problems: they change speed, not results.
    """
    params = client.get_collection(name).config.params
    vectors = params.vectors
    named = vectors if isinstance(vectors, dict) else ({"": vectors} if vectors is not None else {})
    sparse = params.sparse_vectors or {}
    problems: list[str] = []

    for vname, want_multi in ((schema.dense_name, False), (schema.colbert_name, True)):
        have = named.get(vname)
        if have is None:
            problems.append(f"no vector named {vname!r} (has: {sorted(k for k in named if k) or 'none'})")
            continue
        if have.size != schema.size:
            problems.append(f"vector {vname!r} has size {have.size}, the encoder produces {schema.size}")
        if have.distance != models.Distance.COSINE:
            problems.append(f"vector {vname!r} uses {have.distance.value} distance, expected Cosine")
        mv = have.multivector_config
        if want_multi and (mv is None or mv.comparator != models.MultiVectorComparator.MAX_SIM):
            problems.append(f"vector {vname!r} is not a MAX_SIM multivector")
        if not want_multi and mv is not None:
            problems.append(f"vector {vname!r} is a multivector, expected a single dense vector")

    have_sparse = sparse.get(schema.sparse_name)
    if have_sparse is None:
        problems.append(f"no sparse vector named {schema.sparse_name!r} (has: {sorted(sparse) or 'none'})")
    else:
        have_mod = (have_sparse.modifier or models.Modifier.NONE).value
        if have_mod != schema.sparse_modifier:
            problems.append(
                f"sparse vector {schema.sparse_name!r} has modifier {have_mod!r}, "
                f"asked for {schema.sparse_modifier!r}"
            )
    return problems


def client_stored_schema(client: QdrantClient, name: str) -> CollectionSchema:
    """The CollectionSchema of an existing bgem3-qdrant collection read through qdrant-client."""
    params = client.get_collection(name).config.params
    vectors = params.vectors if isinstance(params.vectors, dict) else {}
    base = CollectionSchema()
    multi = [k for k, v in vectors.items() if v.multivector_config is not None]
    dense = [k for k, v in vectors.items() if v.multivector_config is None]
    sparse = params.sparse_vectors or {}
    if len(multi) != 1 or len(dense) != 1 or len(sparse) != 1:
        raise SchemaMismatchError(
            f"collection {name!r} is not a bgem3-qdrant collection (vectors: {sorted(vectors)}, "
            f"sparse: {sorted(sparse)})"
        )
    dtype = vectors[multi[0]].datatype
    sp_name, sp = next(iter(sparse.items()))
    return CollectionSchema(
        size=int(vectors[dense[0]].size),
        dense_name=dense[0],
        colbert_name=multi[0],
        sparse_name=sp_name,
        sparse_modifier="idf" if sp.modifier == models.Modifier.IDF else base.sparse_modifier,
        colbert_dtype=_COLBERT_DTYPE_OF.get(dtype, "float32") if dtype is not None else "float32",
        colbert_quantization=_quantization_of(vectors[multi[0]].quantization_config),
        colbert_copy_on_disk=_copy_on_disk(vectors[multi[0]].quantization_config),
    )


class ClientStore(BGEM3Store):
    """BGEM3Store over a QdrantClient (server or local mode)."""

    def __init__(self, client: QdrantClient, *, description: str | None = None) -> None:
        self.client = client
        self.local_mode = is_local_client(client)
        self.kind = "local" if self.local_mode else "server"
        self.label = "qdrant-client local mode" if self.local_mode else "Qdrant server"
        self.in_process = self.local_mode
        self._description = description
        self._tuned: set[str] = set()

    def describe(self) -> str:
        if self._description:
            return self._description
        opts = self.client.init_options
        return str(opts.get("url") or opts.get("path") or opts.get("location") or "qdrant")

    def location_option(self) -> str:
        opts = self.client.init_options
        if self.local_mode:
            return f"--path {opts.get('path')} --store-engine local" if opts.get("path") else ""
        url = opts.get("url") or opts.get("location")
        return f"--url {url}" if url else ""

    def collection_exists(self, name: str) -> bool:
        return bool(self.client.collection_exists(name))

    def list_collections(self) -> list[str]:
        return sorted(c.name for c in self.client.get_collections().collections)

    def delete_collection(self, name: str) -> None:
        self.client.delete_collection(name)

    def create_collection(self, name: str, schema: CollectionSchema) -> None:
        self.client.create_collection(
            name, vectors_config=vectors_config(schema), sparse_vectors_config=sparse_vectors_config(schema)
        )

    def schema_problems(self, name: str, schema: CollectionSchema) -> list[str]:
        return client_schema_problems(self.client, name, schema)

    def stored_schema(self, name: str) -> CollectionSchema:
        return client_stored_schema(self.client, name)

    def read_model_record(self, name: str) -> dict[str, Any] | None:
        metadata = self.client.get_collection(name).config.metadata or {}
        record = metadata.get(MODEL_METADATA_KEY)
        return record if isinstance(record, dict) or record is None else {"damaged": record}

    def write_model_record(self, name: str, record: dict[str, Any]) -> None:
        self.client.update_collection(name, metadata={MODEL_METADATA_KEY: record})

    def _tune(self, name: str) -> None:
        if self.local_mode and name not in self._tuned:
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
                if not self.local_mode:
                    sv = models.SparseVector(indices=sv.indices, values=sv.values)
                vector[k] = sv
            else:
                # Local mode converts to numpy anyway; a server needs lists.
                arr = np.asarray(v, np.float32)
                vector[k] = arr if self.local_mode else arr.tolist()
        if self.local_mode:
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
        return [StoredPoint(str(r.id), dict(r.payload or {}), vectors_from_engine(r.vector)) for r in recs]

    def overwrite_payload(self, name: str, ids: Sequence[str], payload: dict[str, Any]) -> None:
        self.client.overwrite_payload(name, payload=payload, points=list(ids), wait=True)

    def scroll(
        self,
        name: str,
        *,
        filter: StoreFilter | None = None,
        limit: int = 1024,
        offset: Any = None,
        with_payload: bool | list[str] = True,
        with_vectors: bool | list[str] = False,
    ) -> tuple[list[StoredPoint], Any]:
        recs, nxt = self.client.scroll(
            name,
            scroll_filter=to_qdrant_filter(filter),
            limit=limit,
            offset=offset,
            with_payload=with_payload,
            with_vectors=with_vectors,
        )
        points = [StoredPoint(str(r.id), dict(r.payload or {}), vectors_from_engine(r.vector)) for r in recs]
        return points, nxt

    def delete(self, name: str, ids: Sequence[str]) -> None:
        self.client.delete(name, points_selector=models.PointIdsList(points=list(ids)), wait=True)

    def delete_by_filter(self, name: str, filter: StoreFilter) -> None:
        flt = to_qdrant_filter(filter)
        assert flt is not None, "delete_by_filter needs a filter"
        selector = models.FilterSelector(filter=flt)
        self.client.delete(name, points_selector=selector, wait=True)

    def count(self, name: str, filter: StoreFilter | None = None) -> int:
        return int(self.client.count(name, count_filter=to_qdrant_filter(filter), exact=True).count)

    def query(self, name: str, spec: QuerySpec) -> list[ScoredPoint]:
        s = self.stored_names(name)
        sparse_q = models.SparseVector(indices=spec.sparse[0].tolist(), values=spec.sparse[1].tolist())
        flt = to_qdrant_filter(spec.filter)
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
        if spec.mode == "rerank":  # the prefetches carry `exact`; a quantized copy rescores its best
            over = RESCORE_OVERSAMPLING.get(s.colbert_quantization)
            params = None
            if over is not None and not self.local_mode:  # local mode is exact and warns about params
                quant = models.QuantizationSearchParams(rescore=True, oversampling=over)
                params = models.SearchParams(quantization=quant)
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
            ScoredPoint(str(p.id), dict(p.payload or {}), vectors_from_engine(p.vector), float(p.score))
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

    def as_qdrant_client(self) -> QdrantClient:
        return self.client

    def create_payload_index(self, name: str, field_name: str, kind: IndexKind) -> None:
        if self.local_mode:
            return  # local mode has no payload indexes (it warns and ignores them)
        schema = models.PayloadSchemaType.KEYWORD if kind == "keyword" else models.PayloadSchemaType.INTEGER
        self.client.create_payload_index(name, field_name=field_name, field_schema=schema, wait=True)

    def payload_indexes(self, name: str) -> set[str]:
        if self.local_mode:
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
