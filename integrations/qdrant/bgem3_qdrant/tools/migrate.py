"""`bgem3-qdrant migrate PATH`: move a qdrant-client local-mode store (earlier releases) to Qdrant Edge.

Nothing is lost: every collection is copied point by point (ids, payloads, all three vectors), the
copy is checked (same ids, same count) before anything is moved, and the old files stay in
PATH/local-mode-backup/ (delete it once you are happy). Until the last step the old store is untouched,
and an interrupted migration can be run again.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import BGEM3QdrantError
from ..ingest.writer import ensure_payload_indexes
from ..payload import METADATA, IndexKind, note_metadata_fields
from ..schema import ColbertDtype
from ..stores.base import BGEM3Store, StoredPoint
from ..stores.client_store import ClientStore
from ..stores.edge import EdgeStore
from ..stores.layout import MARKER, detect
from ..stores.open import open_qdrant_client, resolve_target
from ..wording import counted

logger = logging.getLogger(__name__)
BACKUP = "local-mode-backup"


@dataclass
class MigrationReport:
    """What was copied: points per collection, and where the old files went."""

    collections: dict[str, int] = field(default_factory=dict)
    backup: str = ""
    seconds: float = 0.0

    def format(self) -> str:
        parts = [f"{name}: {counted(n, 'point')}" for name, n in self.collections.items()]
        parts = parts or ["no collections"]
        return (
            f"migrated to Qdrant Edge ({', '.join(parts)}) in {self.seconds:.1f}s; "
            f"old files kept in {self.backup}"
        )


def migrate_local_store(
    path: str | Path,
    *,
    colbert_dtype: ColbertDtype = "float32",
    page: int = 256,
    progress: Callable[[str, int, int], None] | None = None,
) -> MigrationReport:
    """Copy every collection of the local-mode store at `path` into an Edge store at the same path.

    `colbert_dtype` float32 (default) keeps the ColBERT vectors bit for bit; float16 / uint8 shrink them.
    `progress(collection, done, total)` is called after each page.
    """
    root = Path(path)
    kind = detect(root)
    if kind == "edge":
        raise BGEM3QdrantError(f"{root} is already a Qdrant Edge store; nothing to migrate")
    if kind != "local":
        raise BGEM3QdrantError(f"{root} holds no qdrant-client local-mode store (no meta.json + collection/)")
    started = time.perf_counter()
    staging = root.with_name(f".{root.name}.edge-migrating")
    if staging.exists():  # left by an interrupted run: the old store is still complete, start again
        shutil.rmtree(staging)
    report = MigrationReport()
    old = ClientStore(open_qdrant_client(resolve_target(path=str(root), engine="local")))
    try:
        with EdgeStore(staging) as new:
            for name in old.list_collections():
                schema = replace(old.stored_schema(name), colbert_dtype=colbert_dtype)
                new.create_collection(name, schema)
                total = old.count(name)
                done = 0
                fields: dict[str, IndexKind] = {}
                for batch in _pages(old, name, page):
                    new.upsert(name, batch)
                    for p in batch:
                        note_metadata_fields(p.payload.get(METADATA) or {}, fields)
                    done += len(batch)
                    if progress is not None:
                        progress(name, done, total)
                _verify(old, new, name)
                ensure_payload_indexes(new, name, fields)
                new.optimize(name)
                report.collections[name] = done
    finally:
        old.close()
    # The copy is complete and checked: put it in place, then move the old files aside.
    backup = root / BACKUP
    if backup.exists():
        backup = root / f"{BACKUP}-{int(time.time())}"
    backup.mkdir()
    for item in ("collections", MARKER):
        (staging / item).replace(root / item)
    for item in ("meta.json", "collection", ".lock"):
        if (root / item).exists():
            (root / item).replace(backup / item)
    shutil.rmtree(staging, ignore_errors=True)
    report.backup = str(backup)
    report.seconds = time.perf_counter() - started
    logger.info(report.format())
    return report


def _pages(store: BGEM3Store, name: str, page: int) -> Iterator[list[StoredPoint]]:
    batch: list[StoredPoint] = []
    for p in store.iter_points(name, with_payload=True, with_vectors=True, page=page):
        batch.append(p)
        if len(batch) == page:
            yield batch
            batch = []
    if batch:
        yield batch


def _verify(old: BGEM3Store, new: BGEM3Store, name: str) -> None:
    """Same ids in both stores, or an error (before anything is moved)."""
    a = {p.id for p in old.iter_points(name, with_payload=False)}
    b = {p.id for p in new.iter_points(name, with_payload=False)}
    if a != b:
        raise BGEM3QdrantError(
            f"migration check failed for {name!r}: {len(a - b)} points missing, {len(b - a)} unexpected; "
            "the old store is unchanged"
        )
