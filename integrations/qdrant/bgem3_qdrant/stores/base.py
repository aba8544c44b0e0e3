"""The one store interface every engine implements (Qdrant Edge, qdrant-client for a server or local mode).

Ingestion, search, pruning, migration and the integrations talk to a `BGEM3Store`; nothing outside
`bgem3_qdrant.stores` checks which engine it is. Filters are the package's neutral `filters.Filter` (or a
qdrant-client `StoreFilter` a user wrote); each engine translates them.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np

from ..errors import CollectionNotFoundError, SchemaMismatchError
from ..filters import StoreFilter
from ..payload import IndexKind
from ..schema import CollectionSchema

logger = logging.getLogger(__name__)

# Search modes: one index (dense, sparse), RRF of both (hybrid), or ColBERT over both (rerank, the default).
Mode = Literal["dense", "sparse", "hybrid", "rerank"]
MODES: tuple[Mode, ...] = get_args(Mode)
# A server's RRF default; qdrant-client's local mode defaults to 2, so every engine is given it explicitly.
RRF_K = 60
Sparse = tuple[np.ndarray, np.ndarray]  # (int64 token ids, float32 weights)
# A quantized ColBERT collection (schema.colbert_quantization) reranks every candidate on the copy in RAM,
# then rescores the best `limit x oversampling` on the original rows read from disk.
RESCORE_OVERSAMPLING: dict[str, float] = {"int8": 2.0, "binary": 3.0}


@dataclass
class StoredPoint:
    """One point as stored: id, payload and the vectors asked for (dense/colbert arrays, sparse pair)."""

    id: str
    payload: dict[str, Any] = field(default_factory=dict)
    vectors: dict[str, Any] = field(default_factory=dict)


@dataclass
class ScoredPoint(StoredPoint):
    """A search result: a stored point with the engine's final score."""

    score: float = 0.0


@dataclass
class QuerySpec:
    """One search, engine-neutral: the query's three vectors, the mode and the limits."""

    mode: Mode
    limit: int
    prefetch_limit: int
    dense: np.ndarray
    sparse: Sparse
    colbert: np.ndarray
    filter: StoreFilter | None = None
    # Vectors returned with each point. A sparse query without weights prefetches dense candidates alone
    # (hybrid, rerank): `bgem3-qdrant eval`'s colbert mode is such a rerank.
    with_vectors: list[str] = field(default_factory=list)
    rrf_k: int = RRF_K
    # Exact (brute-force) candidate search instead of the HNSW graph an optimized store uses: to compare
    # engines and ColBERT dtypes on the same candidates. The rerank stage itself is never made exact (that
    # would bypass a quantized collection's copy in RAM, and so what its storage costs in agreement).
    exact: bool = False


class BGEM3Store(ABC):
    """A place holding BGE-M3 collections. Use as a context manager or call close().

    `kind` is "edge" (Qdrant Edge), "local" (qdrant-client's local mode) or "server"; `in_process` is True
    for the engines that run inside this process (only the process that opened them can write, so the
    Ray engine writes from its driver), False for a server.
    """

    kind: str = "abstract"
    # The engine, for reports: "Qdrant Edge", "qdrant-client local mode" or "Qdrant server".
    label: str = "abstract"
    in_process: bool = True

    # -- collections
    @abstractmethod
    def describe(self) -> str:
        """Where the data lives, for messages."""

    @abstractmethod
    def collection_exists(self, name: str) -> bool: ...

    @abstractmethod
    def create_collection(self, name: str, schema: CollectionSchema) -> None: ...

    @abstractmethod
    def schema_problems(self, name: str, schema: CollectionSchema) -> list[str]:
        """Differences between collection `name` and `schema` that would break writes or search."""

    @abstractmethod
    def list_collections(self) -> list[str]: ...

    def delete_collection(self, name: str) -> None:
        """Delete collection `name` and every point of it (`bgem3-qdrant drop`)."""
        raise NotImplementedError(f"{self.describe()} cannot delete a collection")

    @abstractmethod
    def stored_schema(self, name: str) -> CollectionSchema:
        """The schema collection `name` was created with (sizes, names, modifier, ColBERT dtype)."""

    @abstractmethod
    def read_model_record(self, name: str) -> dict[str, Any] | None:
        """The record of the model that wrote collection `name` (see identity.py), or None."""

    @abstractmethod
    def write_model_record(self, name: str, record: dict[str, Any]) -> None:
        """Record the model that writes collection `name` (durable when this returns)."""

    # -- points
    @abstractmethod
    def upsert(self, name: str, points: Sequence[StoredPoint]) -> None:
        """Insert or replace points; durable when this returns (a kill -9 later loses nothing)."""

    @abstractmethod
    def retrieve(
        self,
        name: str,
        ids: Sequence[str],
        *,
        with_payload: bool = True,
        with_vectors: bool | list[str] = False,
    ) -> list[StoredPoint]: ...

    @abstractmethod
    def overwrite_payload(self, name: str, ids: Sequence[str], payload: dict[str, Any]) -> None: ...

    @abstractmethod
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
        """One page of points and the offset of the next page (None at the end)."""

    @abstractmethod
    def delete(self, name: str, ids: Sequence[str]) -> None: ...

    @abstractmethod
    def delete_by_filter(self, name: str, filter: StoreFilter) -> None: ...

    @abstractmethod
    def count(self, name: str, filter: StoreFilter | None = None) -> int: ...

    @abstractmethod
    def query(self, name: str, spec: QuerySpec) -> list[ScoredPoint]:
        """dense / sparse: one index; hybrid: RRF(k) of dense + sparse prefetches; rerank: ColBERT MAX_SIM
        over the prefetched candidates. Scores are the engine's (MAX_SIM sums over query vectors)."""

    # -- maintenance
    @abstractmethod
    def create_payload_index(self, name: str, field_name: str, kind: IndexKind) -> None:
        """Index a payload field used by filters (a no-op where the engine has no payload indexes)."""

    @abstractmethod
    def payload_indexes(self, name: str) -> set[str]: ...

    def missing(self, name: str) -> CollectionNotFoundError:
        """The error for collection `name` not being here; it names the collections that are."""
        return CollectionNotFoundError(name, self.describe(), self.list_collections())

    def as_qdrant_client(self) -> Any:
        """The `qdrant_client.QdrantClient` this store runs on (a server, local mode), or None (Qdrant Edge).

        For tools that need a QdrantClient themselves (LangChain's and LlamaIndex's QdrantVectorStore).
        """
        return None

    def probe(self, name: str) -> None:  # noqa: B027 - a no-op unless the engine runs in this process
        """Open collection `name` where a crash of the engine cannot end this process, and raise
        StoreDamagedError if it crashes (embedded engines; a server's crash is the server's)."""

    def location_option(self) -> str:
        """The command-line options that open this store again (`--path P`, `--url U`)."""
        return ""

    # Whether `rebuild` is available (an embedded store whose files may be damaged beyond updating).
    can_rebuild = False

    def rebuild(self, name: str, points: Iterable[StoredPoint], batch: int = 256) -> str:
        """Write `points` into a fresh copy of collection `name` (same schema, model record and payload
        indexes), then put it in the collection's place; the old files are kept aside. Returns where."""
        raise NotImplementedError(f"{self.describe()} cannot rebuild a collection; repair it in place")

    def optimize(self, name: str) -> bool:
        """Build indexes / merge segments so queries stop being brute force. True if anything changed."""
        return False

    def disk_bytes(self, name: str) -> int | None:
        """Bytes collection `name` takes on disk (allocated blocks), or None where this process cannot
        see its files (a server, qdrant-client local mode)."""
        return None

    @abstractmethod
    def close(self) -> None: ...

    # -- shared helpers (engine-independent)
    def iter_points(
        self,
        name: str,
        *,
        filter: StoreFilter | None = None,
        with_payload: bool | list[str] = True,
        with_vectors: bool | list[str] = False,
        page: int = 1024,
    ) -> Iterator[StoredPoint]:
        """Every point (matching `filter`), page by page."""
        offset: Any = None
        while True:
            pts, offset = self.scroll(
                name,
                filter=filter,
                limit=page,
                offset=offset,
                with_payload=with_payload,
                with_vectors=with_vectors,
            )
            yield from pts
            if offset is None:
                return

    def __enter__(self) -> BGEM3Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def vectors_from_engine(vector: Any) -> dict[str, Any]:
    """An engine's named vectors as numpy: dense and ColBERT arrays, sparse (int64 ids, float32 weights).

    Both engines' sparse vectors carry `indices` and `values`; anything else is a dense or multi-vector.
    """
    out: dict[str, Any] = {}
    if not isinstance(vector, dict):
        return out
    for k, v in vector.items():
        if hasattr(v, "indices"):
            out[k] = (np.asarray(v.indices, np.int64), np.asarray(v.values, np.float32))
        else:
            out[k] = np.asarray(v, np.float32)
    return out


def ensure_collection(store: BGEM3Store, name: str, schema: CollectionSchema) -> bool:
    """Create the collection if missing; check it if present. Returns True if it was created.

    An existing collection with an incompatible schema raises SchemaMismatchError and is left untouched.
    """
    if store.collection_exists(name):
        problems = store.schema_problems(name, schema)
        if problems:
            raise SchemaMismatchError(
                f"collection {name!r} exists with an incompatible schema: "
                + "; ".join(problems)
                + ". Nothing was changed. Use another --collection, match its options "
                "(e.g. --sparse-modifier), or delete it first."
            )
        return False
    logger.info(
        "creating collection %s (vector size %d, ColBERT %s)", name, schema.size, schema.colbert_dtype
    )
    store.create_collection(name, schema)
    return True
