"""Writing to a collection: encoded batches -> points, one writer thread, retries, bounded queue."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from qdrant_client import QdrantClient

from .retry import call_with_retries
from .schema import CollectionSchema
from .stores import BGEM3Store, StoredPoint, as_store, doc_filter

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class EncodedBatch:
    """Chunks with their three BGE-M3 representations, ready to become points."""

    ids: list[str]
    payloads: list[dict[str, Any]]
    dense: np.ndarray  # [n, hidden] float32
    sparse: list[tuple[np.ndarray, np.ndarray]]  # per chunk: (int token ids, float32 weights)
    colbert: list[np.ndarray]  # per chunk: [tokens, hidden] float32

    def __len__(self) -> int:
        return len(self.ids)


def sparse_from_lexical(weights: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """{str(token_id): weight} (the encoder's lexical weights) as sorted (indices, values) arrays."""
    if not weights:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    idx = np.fromiter((int(k) for k in weights), dtype=np.int64, count=len(weights))
    val = np.fromiter((float(v) for v in weights.values()), dtype=np.float32, count=len(weights))
    order = np.argsort(idx)
    return idx[order], val[order]


def encode_batch(
    encoder: Any,
    texts: list[str],
    ids: list[str],
    payloads: list[dict[str, Any]],
    max_length: int,
    batch_size: int,
) -> EncodedBatch:
    """Run the encoder once for all three outputs of a batch of chunk texts."""
    out = encoder.encode_corpus(
        texts,
        batch_size=batch_size,
        max_length=max_length,
        return_dense=True,
        return_sparse=True,
        return_colbert_vecs=True,
    )
    return EncodedBatch(
        ids=ids,
        payloads=payloads,
        dense=np.asarray(out["dense_vecs"], dtype=np.float32),
        sparse=[sparse_from_lexical(lw) for lw in out["lexical_weights"]],
        colbert=[np.asarray(c, dtype=np.float32) for c in out["colbert_vecs"]],
    )


def to_points(batch: EncodedBatch, schema: CollectionSchema) -> list[StoredPoint]:
    """Engine-neutral points with named vectors dense / sparse / colbert (numpy arrays)."""
    return [
        StoredPoint(
            pid,
            batch.payloads[i],
            {
                schema.dense_name: batch.dense[i],
                schema.colbert_name: batch.colbert[i],
                schema.sparse_name: batch.sparse[i],
            },
        )
        for i, pid in enumerate(batch.ids)
    ]


class Store:
    """All store calls of one ingestion go through one worker thread, in order.

    That keeps embedded engines (not thread-safe in local mode) safe while the caller encodes the next
    batch, and lets writes overlap with encoding. At most `max_pending` upserts wait (back-pressure).
    """

    def __init__(
        self,
        store: BGEM3Store | QdrantClient,
        collection: str,
        schema: CollectionSchema,
        *,
        retries: int = 5,
        max_pending: int = 2,
    ) -> None:
        self.store = as_store(store)
        self.collection = collection
        self.schema = schema
        self.local = self.store.in_process
        self.retries = retries
        self.max_pending = max_pending
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bgem3-qdrant-store")
        self._pending: deque[Future[int]] = deque()
        self.points_written = 0

    # -- generic
    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Run fn(*args) on the store thread (after everything submitted before)."""
        return self._pool.submit(fn, *args, **kwargs)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run fn(*args) on the store thread and wait for its result."""
        return self.submit(fn, *args, **kwargs).result()

    def _retry(self, fn: Callable[[], T], what: str) -> T:
        return call_with_retries(fn, attempts=self.retries, what=what)

    # -- reads
    def _existing(self, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        recs = self._retry(
            lambda: self.store.retrieve(self.collection, list(ids), with_payload=True), "retrieve"
        )
        return {r.id: r.payload for r in recs}

    def existing_async(self, ids: Sequence[str]) -> Future[dict[str, dict[str, Any]]]:
        """Payloads of the ids already stored (a future; queued before later writes)."""
        return self.submit(self._existing, ids)

    # -- writes
    def _upsert(self, batch: EncodedBatch) -> int:
        points = to_points(batch, self.schema)
        self._retry(lambda: self.store.upsert(self.collection, points), "upsert")
        self.points_written += len(points)
        return len(points)

    def upsert_async(self, batch: EncodedBatch) -> Future[int]:
        """Queue a write; blocks while `max_pending` writes wait. Errors surface here or in flush()."""
        while len(self._pending) >= self.max_pending:
            self._pending.popleft().result()
        fut = self.submit(self._upsert, batch)
        self._pending.append(fut)
        return fut

    def overwrite_payloads(self, items: Iterable[tuple[str, dict[str, Any]]]) -> None:
        """Replace the payload of stored points whose vectors are still valid (metadata changed)."""
        for pid, payload in items:
            self._pending.append(
                self.submit(
                    self._retry,
                    lambda pid=pid, payload=payload: self.store.overwrite_payload(
                        self.collection, [pid], payload
                    ),
                    "overwrite_payload",
                )
            )

    def flush(self) -> None:
        """Wait for every queued write; re-raises the first write error."""
        while self._pending:
            self._pending.popleft().result()
        self.call(lambda: None)

    def close(self) -> None:
        """Finish queued work and stop the thread (the store stays open)."""
        try:
            self.flush()
        finally:
            self._pool.shutdown(wait=True)

    # -- pruning
    def _stale_ids(self, doc_points: Mapping[str, set[str]]) -> list[str]:
        """Stored points of the given documents that the current run did not produce."""
        stale: list[str] = []
        keys = list(doc_points)
        for i in range(0, len(keys), 256):
            flt = doc_filter(keys[i : i + 256])
            for r in self.store.iter_points(self.collection, filter=flt, with_payload=["doc_id"]):
                doc = r.payload.get("doc_id")
                wanted = doc_points.get(doc) if isinstance(doc, str) else None
                if wanted is not None and r.id not in wanted:
                    stale.append(r.id)
        return stale

    def prune(self, doc_points: Mapping[str, set[str]]) -> int:
        """Delete points of these documents that are not in their current set (changed or removed chunks)."""
        if not doc_points:
            return 0
        stale = self.call(self._retry, lambda: self._stale_ids(doc_points), "scroll")
        for i in range(0, len(stale), 1000):
            part = stale[i : i + 1000]
            self.call(self._retry, lambda p=part: self.store.delete(self.collection, p), "delete")
        if stale:
            logger.info("pruned %d outdated chunks", len(stale))
        return len(stale)
