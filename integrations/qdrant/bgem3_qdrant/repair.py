"""`bgem3-qdrant check --repair`: replace the damaged points a check found.

A damaged point whose payload is intact is re-encoded from the text it records: that text is exactly
what ingestion encoded, and its id and payload stay as they were, so the repaired collection answers
every search as a clean ingest of the same documents does. A point whose payload is damaged is removed,
and its document re-ingested from the source file the payload names when that file can still be read
(with the chunk options given, as `ingest` would); otherwise the document is named for the user to
re-ingest. An embedded (Edge) collection is rebuilt into fresh files, since damaged files may refuse
updates (a truncated vector file does); a server's collection is repaired in place.

    >>> report = check_collection(store, "docs")                  # doctest: +SKIP
    >>> repair_collection(store, "docs", report, encoder).format()  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from .check import CheckReport, PointDamage, read_points
from .encoder import EncoderLike, encode_texts
from .identity import ensure_model, identity_of
from .ingest import IngestOptions, Ingestor
from .payload import TEXT
from .pooling import pool_rows
from .stores.base import BGEM3Store, StoredPoint

logger = logging.getLogger(__name__)
# Points encoded / copied per step.
BATCH = 64


@dataclass
class RepairReport:
    """What `repair_collection` did."""

    removed: int = 0  # damaged points taken out
    reencoded: int = 0  # of them, re-encoded from their recorded text
    reingested: list[str] = field(default_factory=list)  # source files read again
    lost: list[str] = field(default_factory=list)  # documents that could not be re-read
    set_aside: str | None = None  # where the damaged files went (embedded store)

    @property
    def complete(self) -> bool:
        return not self.lost

    def format(self) -> str:
        line = (
            f"repaired: {self.removed} damaged points removed, {self.reencoded} re-encoded from their "
            f"recorded text, {len(self.reingested)} source files re-ingested"
        )
        if self.set_aside:
            line += f"; the damaged files are kept in {self.set_aside} (delete it once you are satisfied)"
        lines = [line]
        if self.lost:
            lines.append(
                f"{len(self.lost)} document(s) could not be re-read (payload damaged and no readable source "
                "file); re-ingest them: " + ", ".join(self.lost)
            )
        return "\n".join(lines)


def _reencodable(d: PointDamage) -> bool:
    """The payload is intact (its text hashes to the id), so the text is what was encoded."""
    return "payload" not in d.problems and isinstance((d.payload or {}).get(TEXT), str)


def _reencoded(
    encoder: EncoderLike, store: BGEM3Store, name: str, damaged: list[PointDamage], pooling: int
) -> Iterator[StoredPoint]:
    """The damaged points again, from their recorded text, ColBERT rows pooled as the collection's."""
    schema = store.stored_schema(name)
    for start in range(0, len(damaged), BATCH):
        part = damaged[start : start + BATCH]
        out = encode_texts(encoder, [str((d.payload or {})[TEXT]) for d in part], query=False)
        for i, d in enumerate(part):
            vectors = {
                schema.dense_name: out.dense[i],
                schema.sparse_name: out.sparse[i],
                schema.colbert_name: pool_rows(out.colbert[i], pooling),
            }
            yield StoredPoint(d.id, dict(d.payload or {}), vectors)


def _intact(store: BGEM3Store, name: str, damaged_ids: set[str]) -> Iterator[StoredPoint]:
    """Every undamaged point with its payload and vectors, as stored."""
    for pid, _, got in read_points(store, name):
        if pid not in damaged_ids and not isinstance(got, str):
            yield got


def repair_collection(
    store: BGEM3Store,
    name: str,
    report: CheckReport,
    encoder: EncoderLike,
    *,
    options: IngestOptions | None = None,
) -> RepairReport:
    """Replace the points `report` found damaged (see the module docstring).

    `encoder` must be the model that wrote the collection (refused otherwise, as ingest refuses); a
    collection recording ColBERT pooling gets re-encoded rows pooled by its factor.
    """
    result = RepairReport()
    if not report.damaged and report.points == report.counted:
        return result
    running = identity_of(encoder)
    if running is not None and report.identity is not None:
        running = replace(running, model=report.identity.model)
    ensure_model(store, name, running, write=False)
    fixable = [d for d in report.damaged if _reencodable(d)]
    rest = [d for d in report.damaged if not _reencodable(d)]
    damaged_ids = {d.id for d in report.damaged}
    pooling = report.identity.colbert_pooling if report.identity else 1
    result.removed, result.reencoded = len(report.damaged), len(fixable)
    if store.can_rebuild:
        # Every readable point is rewritten, so a count mismatch (ids the engine counts but cannot list)
        # is repaired too.
        def points() -> Iterator[StoredPoint]:
            yield from _intact(store, name, damaged_ids)
            yield from _reencoded(encoder, store, name, fixable, pooling)

        result.set_aside = store.rebuild(name, points())
    else:
        store.delete(name, sorted(damaged_ids))
        replaced = list(_reencoded(encoder, store, name, fixable, pooling))
        for start in range(0, len(replaced), BATCH):
            store.upsert(name, replaced[start : start + BATCH])
    sources = sorted({d.source for d in rest if d.source and Path(d.source).is_file()})
    result.lost = sorted(
        {d.doc_id or d.source or d.id for d in rest if not (d.source and d.source in sources)}
    )
    if sources:
        model_id = report.identity.model if report.identity else None
        ing = Ingestor(store, name, encoder, schema=report.schema, options=options, model_id=model_id)
        ing.ingest_paths([Path(s) for s in sources])
        result.reingested = sources
    logger.info("repaired %s: %s", name, result.format())
    return result


__all__ = ["RepairReport", "repair_collection"]
