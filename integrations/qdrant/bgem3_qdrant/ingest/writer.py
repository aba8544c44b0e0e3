"""Writing an ingestion to a collection: encoded batches -> points, one writer thread, retries, bounded queue,
pruning, payload indexes and the optimizer at the end."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from ..filters import doc_filter
from ..payload import DOC_ID, IndexKind, wanted_indexes
from ..pooling import pool_rows
from ..retry import call_with_retries
from ..schema import CollectionSchema
from ..stores.base import BGEM3Store, StoredPoint
from .encoding import EncodedBatch

logger = logging.getLogger(__name__)
T = TypeVar("T")


def to_points(batch: EncodedBatch, schema: CollectionSchema, colbert_pooling: int = 1) -> list[StoredPoint]:
    """Engine-neutral points with named vectors dense / sparse / colbert (numpy arrays).

    Each chunk's ColBERT rows are pooled by `colbert_pooling` here (pooling.py), the one place both
    engines' chunks become points; 1 keeps them as encoded.
    """
    v = batch.vectors
    return [
        StoredPoint(
            pid,
            batch.payloads[i],
            {
                schema.dense_name: v.dense[i],
                schema.colbert_name: pool_rows(v.colbert[i], colbert_pooling),
                schema.sparse_name: v.sparse[i],
            },
        )
        for i, pid in enumerate(batch.ids)
    ]


class Writer:
    """All store calls of one ingestion go through one worker thread, in order.

    That keeps embedded engines (not thread-safe in local mode) safe while the caller encodes the next
    batch, and lets writes overlap with encoding. At most `max_pending` upserts wait (back-pressure).
    `colbert_pooling` is the collection's ColBERT pooling factor (applied in `to_points`).
    """

    def __init__(
        self,
        store: BGEM3Store,
        collection: str,
        schema: CollectionSchema,
        *,
        retries: int = 5,
        max_pending: int = 2,
        colbert_pooling: int = 1,
    ) -> None:
        self.store = store
        self.collection = collection
        self.schema = schema
        self.colbert_pooling = colbert_pooling
        self.retries = retries
        self.max_pending = max_pending
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bgem3-qdrant-writer")
        self._pending: deque[Future[Any]] = deque()
        self.points_written = 0

    # -- generic
    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        """Run fn(*args) on the writer thread (after everything submitted before)."""
        return self._pool.submit(fn, *args, **kwargs)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run fn(*args) on the writer thread and wait for its result."""
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
        points = to_points(batch, self.schema, self.colbert_pooling)
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

    # -- after the last write
    def _stale_ids(self, doc_points: Mapping[str, set[str]]) -> list[str]:
        """Stored points of the given documents that the current run did not produce."""
        stale: list[str] = []
        keys = list(doc_points)
        for i in range(0, len(keys), 256):
            flt = doc_filter(keys[i : i + 256])
            for r in self.store.iter_points(self.collection, filter=flt, with_payload=[DOC_ID]):
                doc = r.payload.get(DOC_ID)
                wanted = doc_points.get(doc) if isinstance(doc, str) else None
                if wanted is not None and r.id not in wanted:
                    stale.append(r.id)
        return stale

    def prune(self, doc_points: Mapping[str, set[str]]) -> int:
        """Delete points of these documents that are not in their current set (changed or removed chunks)."""
        if not doc_points:
            return 0
        self.flush()
        stale = self.call(self._retry, lambda: self._stale_ids(doc_points), "scroll")
        for i in range(0, len(stale), 1000):
            part = stale[i : i + 1000]
            self.call(self._retry, lambda p=part: self.store.delete(self.collection, p), "delete")
        if stale:
            logger.info("pruned %d outdated chunks", len(stale))
        return len(stale)


def ensure_payload_indexes(store: BGEM3Store, collection: str, metadata_fields: dict[str, IndexKind]) -> None:
    """Payload indexes for doc_id, source and the metadata keys seen, so filters need no full scan."""
    have = store.payload_indexes(collection)
    for field_name, kind in wanted_indexes(metadata_fields).items():
        if field_name not in have:
            store.create_payload_index(collection, field_name, kind)


def optimize_with_progress(store: BGEM3Store, collection: str, show: bool | None) -> float:
    """Run the engine's optimizer (blocking) with a ticking progress line; returns the seconds it took."""
    from tqdm.auto import tqdm

    enabled = show if show is not None else sys.stderr.isatty()
    done = threading.Event()
    started = time.perf_counter()
    with tqdm(desc=f"optimizing {collection}", bar_format="{desc}: {elapsed}", disable=not enabled) as bar:

        def tick() -> None:
            while not done.wait(0.5):
                bar.refresh()

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            store.optimize(collection)
        finally:
            done.set()
            ticker.join()
    seconds = time.perf_counter() - started
    logger.info("optimized %s in %.1fs", collection, seconds)
    return seconds
