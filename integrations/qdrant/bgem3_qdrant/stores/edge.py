"""The store interface on Qdrant Edge (`qdrant-edge-py`): Qdrant's own engine inside this process.

Layout of a store folder:

    PATH/bgem3-store.json              {"engine": "edge", "format": 1}
    PATH/.lock                         held (flock) by the one process that has the store open
    PATH/collections/NAME/schema.json  the CollectionSchema the collection was created with
    PATH/collections/NAME/model.json   the model that writes it (identity.py)
    PATH/collections/NAME/shard/       one EdgeShard (segments + WAL)
    PATH/damaged/NAME-TIME/            a collection's damaged files, set aside by `check --repair`

Collections are created without Edge's write-ahead log and every update is flushed before it returns:
the WAL would keep a second, float32 copy of every ColBERT matrix (measured: disk 2.7x the raw float32
ColBERT with a float16 store, instead of 0.5x) and halve the write rate. Flushed segments are durable,
so a process killed with kill -9 loses nothing that `upsert` returned for; a re-run re-encodes the rest.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from bgem3_embeddings.install_hint import pip_install

from ..errors import (
    BGEM3QdrantError,
    StoreDamagedError,
    StoreUnavailableError,
    check_command,
    store_busy_message,
)
from ..filters import FieldMatch, Filter, StoreFilter
from ..payload import IndexKind
from ..schema import CollectionSchema, compare_schemas
from .base import (
    RESCORE_OVERSAMPLING,
    BGEM3Store,
    QuerySpec,
    ScoredPoint,
    StoredPoint,
    vectors_from_engine,
)
from .layout import allocated_bytes, lock_store, write_marker

logger = logging.getLogger(__name__)
# Beside schema.json: the model that wrote the collection (identity.py).
MODEL_RECORD = "model.json"
# Written while the engine opens a collection, removed when it opened: one left behind means the engine
# ended the process (an abort) while opening it, so the next open probes it in a child process first.
OPENING_MARKER = ".opening"
EDGE_PIP = pip_install("qdrant-edge-py==0.9.*")


def import_edge() -> Any:
    """The qdrant_edge module, or an ImportError saying what to install."""
    try:
        import qdrant_edge
    except ImportError as e:  # pragma: no cover - a dependency of this package
        raise ImportError(f"the embedded Qdrant Edge store needs qdrant-edge-py: {EDGE_PIP}") from e
    return qdrant_edge


def _pid(value: Any) -> str:
    return str(value)


def _edge_id(pid: str) -> Any:
    """Edge takes UUIDs and unsigned integers; our ids are uuid strings (integers pass through)."""
    if isinstance(pid, int):
        return pid
    try:
        return uuid.UUID(str(pid))
    except ValueError:
        return int(pid)


class EdgeFilter:
    """The package's `Filter` (or a qdrant-client `models.Filter`) -> qdrant_edge Filter."""

    def __init__(self, qe: Any) -> None:
        self.qe = qe

    def __call__(self, f: StoreFilter | None) -> Any:
        if f is None:
            return None
        if isinstance(f, Filter):
            return self.qe.Filter(
                must=[self._match(c) for c in f.must] or None,
                must_not=[self._match(c) for c in f.must_not] or None,
            )
        return self._qdrant(f)

    def _match(self, c: FieldMatch) -> Any:
        qe = self.qe
        if c.any is not None:
            return qe.FieldCondition(c.key, match=qe.MatchAny(list(c.any)))
        if c.is_empty is not None:
            return qe.FieldCondition(c.key, is_empty=c.is_empty)
        return qe.FieldCondition(c.key, match=qe.MatchValue(c.value))

    def _qdrant(self, f: Any) -> Any:
        """A qdrant-client models.Filter (its caller imported qdrant-client already)."""
        qe = self.qe

        def conds(items: Any) -> list[Any] | None:
            if items is None:
                return None
            items = items if isinstance(items, list) else [items]
            return [self._cond(c) for c in items]

        return qe.Filter(must=conds(f.must), should=conds(f.should), must_not=conds(f.must_not))

    def _cond(self, c: Any) -> Any:
        from qdrant_client import models

        qe = self.qe
        if isinstance(c, models.Filter):
            return self._qdrant(c)
        if isinstance(c, models.HasIdCondition):
            return qe.HasIdCondition([_edge_id(str(i)) for i in c.has_id])
        if isinstance(c, models.FieldCondition):
            if c.match is not None:
                m = c.match
                if isinstance(m, models.MatchValue):
                    match = qe.MatchValue(m.value)
                elif isinstance(m, models.MatchAny):
                    match = qe.MatchAny(list(m.any))
                elif isinstance(m, models.MatchExcept):
                    match = qe.MatchExcept(list(m.except_))
                elif isinstance(m, models.MatchText):
                    match = qe.MatchText(m.text)
                else:
                    raise BGEM3QdrantError(
                        f"filter match {type(m).__name__} is not supported by the Edge store"
                    )
                return qe.FieldCondition(c.key, match=match)
            if isinstance(c.range, models.Range):
                r = c.range
                return qe.FieldCondition(c.key, range=qe.RangeFloat(gte=r.gte, gt=r.gt, lte=r.lte, lt=r.lt))
            if c.is_empty is not None or c.is_null is not None:
                return qe.FieldCondition(c.key, is_empty=c.is_empty, is_null=c.is_null)
        raise BGEM3QdrantError(f"filter condition {type(c).__name__} is not supported by the Edge store")


def _payload_selector(with_payload: bool | list[str]) -> Any:
    return with_payload if isinstance(with_payload, bool) else list(with_payload)


class EdgeStore(BGEM3Store):
    """BGEM3Store on Qdrant Edge: one EdgeShard per collection, in a folder only this process opens."""

    kind = "edge"
    label = "Qdrant Edge"
    in_process = True

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True) -> None:
        self.qe = import_edge()
        self.path = Path(path)
        self._filter = EdgeFilter(self.qe)
        self._lock_file = lock_store(self.path, create=create)
        if create:
            write_marker(self.path)
        self._shards: dict[str, Any] = {}
        self._schemas: dict[str, CollectionSchema] = {}
        self._guard = threading.Lock()

    # -- layout
    def _dir(self, name: str) -> Path:
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            raise ValueError(f"invalid collection name {name!r}")
        return self.path / "collections" / name

    def describe(self) -> str:
        return f"Qdrant Edge store at {self.path}"

    def location_option(self) -> str:
        return f"--path {self.path}"

    def collection_exists(self, name: str) -> bool:
        return (self._dir(name) / "schema.json").is_file()

    def list_collections(self) -> list[str]:
        root = self.path / "collections"
        return (
            # A leading dot: a collection being rebuilt by `check --repair`, not one of the user's.
            sorted(p.name for p in root.iterdir() if (p / "schema.json").is_file() and p.name[0] != ".")
            if root.is_dir()
            else []
        )

    def delete_collection(self, name: str) -> None:
        """Renamed to a hidden folder (one atomic step: the collection is gone even if removing its files
        is interrupted, and its name is free at once), then removed."""
        d = self._dir(name)
        aside = d.with_name(f".{name}.dropped")
        with self._guard:
            shard = self._shards.pop(name, None)
            if shard is not None:
                shard.close()
            self._schemas.pop(name, None)
            shutil.rmtree(aside, ignore_errors=True)  # a drop interrupted before
            d.rename(aside)
            shutil.rmtree(aside)

    def stored_schema(self, name: str) -> CollectionSchema:
        if name not in self._schemas:
            f = self._dir(name) / "schema.json"
            if not f.is_file():
                raise self.missing(name)
            try:
                self._schemas[name] = CollectionSchema.from_dict(json.loads(f.read_text(encoding="utf-8")))
            except (OSError, UnicodeDecodeError, ValueError, TypeError) as e:
                raise BGEM3QdrantError(
                    f"cannot read {f} ({e}): collection {name!r} is damaged; re-ingest its documents into "
                    "a new collection (--collection) or a new store (--path)"
                ) from e
        return self._schemas[name]

    def read_model_record(self, name: str) -> dict[str, Any] | None:
        f = self._dir(name) / MODEL_RECORD
        if not f.is_file():
            return None
        try:
            data = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BGEM3QdrantError(
                f"cannot read {f} ({e}): the model record of collection {name!r} is damaged; "
                f"run `bgem3-qdrant check -c {name} --path {self.path}`"
            ) from e
        return data if isinstance(data, dict) else {"damaged": data}

    def write_model_record(self, name: str, record: dict[str, Any]) -> None:
        d = self._dir(name)
        tmp = d / (MODEL_RECORD + ".tmp")
        tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
        tmp.replace(d / MODEL_RECORD)

    def schema_problems(self, name: str, schema: CollectionSchema) -> list[str]:
        return compare_schemas(self.stored_schema(name), schema)

    def _config(self, schema: CollectionSchema) -> Any:
        qe = self.qe
        dtype = {
            "float32": qe.VectorStorageDatatype.Float32,
            "float16": qe.VectorStorageDatatype.Float16,
            # Edge's raw Uint8 expects integers 0..255 (unit vectors would become zeros); Turbo8 is
            # its 8-bit encoding of float vectors.
            "uint8": qe.VectorStorageDatatype.Turbo8,
            # In the engine though not in qdrant-edge-py 0.9's type stubs.
            "turbo4": qe.VectorStorageDatatype.Turbo4,
        }[schema.colbert_dtype]
        # Pinned: the copy is read into RAM when the collection is first used and never evicted (reranks
        # read nothing else but their best candidates' rows). Cold: it stays a memory-mapped file read page
        # by page as reranks touch it (the collection opens at once: docs/design/qdrant-store.md).
        memory = qe.Memory.Cold if schema.colbert_copy_on_disk else qe.Memory.Pinned
        quantization = {
            "none": None,
            "int8": qe.ScalarQuantizationConfig(qe.ScalarType.Int8, quantile=0.99, memory=memory),
            "binary": qe.BinaryQuantizationConfig(memory=memory),
        }[schema.colbert_quantization]
        return qe.EdgeConfig(
            vectors={
                schema.dense_name: qe.EdgeVectorParams(
                    schema.size, qe.Distance.Cosine, on_disk=schema.dense_on_disk
                ),
                schema.colbert_name: qe.EdgeVectorParams(
                    schema.size,
                    qe.Distance.Cosine,
                    on_disk=schema.colbert_on_disk,
                    datatype=dtype,
                    quantization_config=quantization,
                    multivector_config=qe.MultiVectorConfig(qe.MultiVectorComparator.MaxSim),
                    # m=0: no graph; ColBERT only reranks prefetched candidates.
                    hnsw_config=qe.HnswIndexConfig(m=0, ef_construct=100, full_scan_threshold=10_000),
                ),
            },
            sparse_vectors={
                schema.sparse_name: qe.EdgeSparseVectorParams(
                    modifier=qe.Modifier.Idf if schema.sparse_modifier == "idf" else None,
                    on_disk=schema.sparse_on_disk,
                )
            },
            wal_enabled=False,  # see the module docstring: every update is flushed instead
        )

    def create_collection(self, name: str, schema: CollectionSchema) -> None:
        d = self._dir(name)
        with self._guard:
            shard = self.qe.EdgeShard.create(str(d / "shard"), self._config(schema))
            # schema.json last: a collection exists once it is complete.
            tmp = d / "schema.json.tmp"
            tmp.write_text(json.dumps(schema.to_dict(), indent=1), encoding="utf-8")
            tmp.replace(d / "schema.json")
            self._shards[name] = shard
            self._schemas[name] = schema

    def _shard(self, name: str) -> Any:
        shard = self._shards.get(name)
        if shard is not None:
            return shard
        with self._guard:
            if name not in self._shards:
                self.stored_schema(name)  # CollectionNotFoundError with the command to run
                marker = self._dir(name) / OPENING_MARKER
                if marker.exists():  # the last open of this collection never finished: the engine aborted?
                    self.probe(name)
                marker.write_text(str(os.getpid()), encoding="utf-8")
                try:
                    with self._engine(name):
                        self._shards[name] = self.qe.EdgeShard.load(str(self._dir(name) / "shard"))
                finally:  # an error or a panic returns here; only an abort leaves the marker behind
                    marker.unlink(missing_ok=True)
            return self._shards[name]

    def probe(self, name: str) -> None:
        """Open the collection's files in a child process first: an engine abort (a failed allocation on a
        damaged id tracker ends the process, uncatchable) then ends the child, and this one reports it as
        StoreDamagedError. A collection already open here needs no probe."""
        if name in self._shards:
            return
        code = "import sys, qdrant_edge; qdrant_edge.EdgeShard.load(sys.argv[1]).close()"
        shard_dir = str(self._dir(name) / "shard")
        done = subprocess.run([sys.executable, "-c", code, shard_dir], capture_output=True, text=True)
        if done.returncode < 0 or done.returncode == 134:  # killed by a signal: SIGABRT from the engine
            first = (done.stderr.strip().splitlines() or [f"signal {-done.returncode}"])[0][:200]
            raise StoreDamagedError(
                name,
                self.describe(),
                f"the engine aborted opening its files: {first}",
                check_command(name, self.location_option()),
            )
        (self._dir(name) / OPENING_MARKER).unlink(missing_ok=True)

    @contextmanager
    def _engine(self, name: str) -> Iterator[None]:
        """Engine errors and Rust panics (BaseException in PyO3) on a collection's files: StoreDamagedError.

        An engine abort (a failed allocation on a damaged id tracker) ends the process and cannot be
        caught; docs/qdrant-check.md says what it looks like and what to run.
        """
        try:
            yield
        except (KeyboardInterrupt, SystemExit, BGEM3QdrantError):
            raise
        except BaseException as e:
            if "WouldBlock" in str(e):
                raise StoreUnavailableError(store_busy_message(self.path)) from e
            detail = " ".join(str(e).split())[:300] or type(e).__name__
            cause = f"the engine failed reading its files: {detail}"
            raise StoreDamagedError(
                name, self.describe(), cause, check_command(name, self.location_option())
            ) from e

    def _apply(self, name: str, op: Any) -> None:
        """Apply an update and flush it: durable when this returns (collections have no WAL)."""
        shard = self._shard(name)
        with self._engine(name):
            shard.update(op)
            shard.flush()

    # -- points
    def upsert(self, name: str, points: Sequence[StoredPoint]) -> None:
        qe = self.qe
        pts = []
        for p in points:
            vec: dict[str, Any] = {}
            for k, v in p.vectors.items():
                if isinstance(v, tuple):
                    vec[k] = qe.SparseVector(np.asarray(v[0]).tolist(), np.asarray(v[1], np.float32).tolist())
                else:
                    # Lists convert about 1.6x faster than numpy arrays in qdrant-edge-py 0.9 (measured:
                    # 4.4 vs 7.2 ms per 128 x 1024 ColBERT matrix); the conversion bounds the write rate.
                    vec[k] = np.asarray(v, np.float32).tolist()
            pts.append(qe.Point(_edge_id(p.id), vec, p.payload))
        self._apply(name, qe.UpdateOperation.upsert_points(pts))

    def retrieve(
        self,
        name: str,
        ids: Sequence[str],
        *,
        with_payload: bool = True,
        with_vectors: bool | list[str] = False,
    ) -> list[StoredPoint]:
        if not ids:
            return []
        shard = self._shard(name)
        with self._engine(name):
            recs = shard.retrieve([_edge_id(i) for i in ids], with_payload, with_vectors)
        return [StoredPoint(_pid(r.id), dict(r.payload or {}), vectors_from_engine(r.vector)) for r in recs]

    def overwrite_payload(self, name: str, ids: Sequence[str], payload: dict[str, Any]) -> None:
        self._apply(name, self.qe.UpdateOperation.overwrite_payload([_edge_id(i) for i in ids], payload))

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
        req = self.qe.ScrollRequest(
            offset=offset,
            limit=limit,
            filter=self._filter(filter),
            with_payload=_payload_selector(with_payload),
            with_vector=with_vectors,
        )
        shard = self._shard(name)
        with self._engine(name):
            recs, nxt = shard.scroll(req)
        points = [StoredPoint(_pid(r.id), dict(r.payload or {}), vectors_from_engine(r.vector)) for r in recs]
        return points, nxt

    def delete(self, name: str, ids: Sequence[str]) -> None:
        if ids:
            self._apply(name, self.qe.UpdateOperation.delete_points([_edge_id(i) for i in ids]))

    def delete_by_filter(self, name: str, filter: StoreFilter) -> None:
        self._apply(name, self.qe.UpdateOperation.delete_points_by_filter(self._filter(filter)))

    def count(self, name: str, filter: StoreFilter | None = None) -> int:
        shard = self._shard(name)
        with self._engine(name):
            return int(shard.count(self.qe.CountRequest(exact=True, filter=self._filter(filter))))

    def query(self, name: str, spec: QuerySpec) -> list[ScoredPoint]:
        qe = self.qe
        s = self.stored_schema(name)
        flt = self._filter(spec.filter)
        params = qe.SearchParams(exact=True) if spec.exact else None
        dense_q = qe.Query.Nearest(spec.dense.astype(np.float32).tolist(), using=s.dense_name)
        sparse_q = qe.Query.Nearest(
            qe.SparseVector(spec.sparse[0].tolist(), spec.sparse[1].astype(np.float32).tolist()),
            using=s.sparse_name,
        )
        prefetch = [qe.Prefetch(spec.prefetch_limit, query=dense_q, filter=flt, params=params)]
        if len(spec.sparse[0]):  # a query with no lexical weight has no sparse candidates
            prefetch.append(qe.Prefetch(spec.prefetch_limit, query=sparse_q, filter=flt, params=params))
        kwargs: dict[str, Any]
        if spec.mode == "dense":
            kwargs = {"query": dense_q}
        elif spec.mode == "sparse":
            kwargs = {"query": sparse_q}
        elif spec.mode == "hybrid":
            kwargs = {"prefetches": prefetch, "query": qe.Fusion.Rrf(k=spec.rrf_k)}
        else:
            kwargs = {
                "prefetches": prefetch,
                "query": qe.Query.Nearest(spec.colbert.astype(np.float32).tolist(), using=s.colbert_name),
            }
        req = qe.QueryRequest(
            limit=spec.limit,
            filter=flt,
            with_payload=True,
            with_vector=list(spec.with_vectors) if spec.with_vectors else False,
            # The prefetches carry `exact`; the top stage is the rerank (or a single index search).
            params=self._rerank_params(s) if spec.mode == "rerank" else params,
            **kwargs,
        )
        shard = self._shard(name)
        with self._engine(name):
            res = shard.query(req)
        return [
            ScoredPoint(_pid(p.id), dict(p.payload or {}), vectors_from_engine(p.vector), float(p.score))
            for p in res
        ]

    def _rerank_params(self, schema: CollectionSchema) -> Any:
        """Search parameters of the rerank stage: a quantized collection rescores the best candidates on
        their original rows (Qdrant rescores binary by default, int8 not)."""
        over = RESCORE_OVERSAMPLING.get(schema.colbert_quantization)
        if over is None:
            return None
        qe = self.qe
        return qe.SearchParams(quantization=qe.QuantizationSearchParams(rescore=True, oversampling=over))

    # -- maintenance
    def create_payload_index(self, name: str, field_name: str, kind: IndexKind) -> None:
        qe = self.qe
        schema = qe.PayloadSchemaType.Keyword if kind == "keyword" else qe.PayloadSchemaType.Integer
        self._apply(name, qe.UpdateOperation.create_field_index(field_name, schema))

    def payload_indexes(self, name: str) -> set[str]:
        return set(self._shard(name).info().payload_schema.keys())

    def optimize(self, name: str) -> bool:
        shard = self._shard(name)
        changed = bool(shard.optimize())
        # The segments the optimizer replaced stay on disk until a flush (measured: twice the collection's
        # size in between), so flush now rather than at close.
        shard.flush()
        return changed

    def disk_bytes(self, name: str) -> int | None:
        return allocated_bytes(self._dir(name))

    can_rebuild = True

    def rebuild(self, name: str, points: Iterable[StoredPoint], batch: int = 256) -> str:
        """A fresh shard beside the damaged one, filled with `points`, then swapped in by two renames
        (the damaged folder goes to PATH/damaged/); an interrupted rebuild leaves the old one in place."""
        schema = self.stored_schema(name)
        record = self.read_model_record(name)
        try:
            indexes = {k: str(v.data_type) for k, v in self._shard(name).info().payload_schema.items()}
        except BGEM3QdrantError:
            indexes = {}
        fresh = f".{name}.rebuild"
        shutil.rmtree(self._dir(fresh), ignore_errors=True)  # a rebuild interrupted before
        self.create_collection(fresh, schema)
        if record is not None:
            self.write_model_record(fresh, record)
        for field_name, kind in indexes.items():
            self.create_payload_index(fresh, field_name, "integer" if "Integer" in kind else "keyword")
        buf: list[StoredPoint] = []
        for p in points:
            buf.append(p)
            if len(buf) == batch:
                self.upsert(fresh, buf)
                buf = []
        if buf:
            self.upsert(fresh, buf)
        with self._guard:
            for n in (name, fresh):
                shard = self._shards.pop(n, None)
                if shard is not None:
                    shard.close()
            self._schemas.pop(fresh, None)
            stamp = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
            aside = self.path / "damaged" / stamp
            attempt = 1
            while aside.exists():  # a second repair within the same second
                attempt += 1
                aside = self.path / "damaged" / f"{stamp}-{attempt}"
            aside.parent.mkdir(exist_ok=True)
            self._dir(name).rename(aside)
            self._dir(fresh).rename(self._dir(name))
        return str(aside)

    def flush(self) -> None:
        for shard in self._shards.values():
            shard.flush()

    def close(self) -> None:
        with self._guard:
            for name, shard in list(self._shards.items()):
                try:
                    shard.close()
                except Exception as e:  # closing must release the rest
                    logger.warning("closing collection %s: %s", name, e)
            self._shards.clear()
            if self._lock_file is not None:
                self._lock_file.close()  # releases the flock
                self._lock_file = None


__all__ = ["EdgeStore", "import_edge"]
