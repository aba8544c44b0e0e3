"""Ingestion: documents -> chunks -> (skip what is stored) -> BGE-M3 vectors -> Qdrant points."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from qdrant_client import QdrantClient

from .chunking import Chunker
from .encoder import EncoderLike
from .errors import SourceError
from .ids import content_hash, point_id
from .schema import CollectionSchema, ensure_collection
from .sources import DEFAULT_INCLUDE, Document, SourceStats, iter_documents
from .store import EncodedBatch, Store, encode_batch
from .stores import BGEM3Store, as_store

logger = logging.getLogger(__name__)

Engine = Literal["plain", "ray"]
# Special tokens <s> and </s> the encoder adds around every chunk.
SPECIAL_TOKENS = 2


@dataclass
class IngestOptions:
    """How documents are cut, batched and written."""

    chunk_size: int = 512  # tokens per chunk, special tokens excluded
    chunk_overlap: int = 64
    batch_size: int = 32  # chunks per encode + upsert round
    encode_batch_size: int | None = None  # encoder's internal batch (default: batch_size)
    skip_invalid: bool = False  # skip malformed JSONL lines / unreadable files instead of stopping
    prune: bool = True  # delete stored chunks of re-ingested documents that no longer exist
    show_progress: bool | None = None  # None: only on a terminal
    retries: int = 5
    max_pending_writes: int = 2
    optimize_after: int = 1000  # run the engine's optimizer when a run wrote at least this many points

    @property
    def max_length(self) -> int:
        # Re-tokenising a chunk's text can differ from the slice by a token or two at the edges.
        return self.chunk_size + SPECIAL_TOKENS + 8


@dataclass
class IngestSummary:
    """What a run did. `tokens` counts the tokens encoded in this run (skipped chunks excluded)."""

    files: int = 0
    documents: int = 0
    chunks: int = 0
    encoded: int = 0
    unchanged: int = 0
    payload_updated: int = 0
    empty: int = 0
    invalid: list[str] = field(default_factory=list)
    pruned: int = 0
    tokens: int = 0
    seconds: float = 0.0
    encode_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def format(self) -> str:
        """One human-readable line (plus skipped-input details)."""
        parts = [
            f"{self.files} files",
            f"{self.documents} documents",
            f"{self.chunks} chunks",
            f"{self.encoded} encoded",
            f"{self.unchanged} unchanged",
        ]
        if self.payload_updated:
            parts.append(f"{self.payload_updated} payloads updated")
        if self.pruned:
            parts.append(f"{self.pruned} outdated removed")
        if self.empty:
            parts.append(f"{self.empty} empty skipped")
        if self.invalid:
            parts.append(f"{len(self.invalid)} invalid skipped")
        parts.append(f"{self.tokens} tokens in {self.seconds:.1f}s = {self.tokens_per_second:.0f} tokens/s")
        return ", ".join(parts)


@dataclass
class ChunkRecord:
    """A chunk about to be stored: its point id, text and payload."""

    id: str
    text: str
    payload: dict[str, Any]
    n_tokens: int


def chunk_records(
    docs: Iterable[Document],
    tokenizer: Any,
    opts: IngestOptions,
    model_id: str,
    summary: IngestSummary,
    doc_points: dict[str, set[str]],
    metadata_fields: dict[str, str] | None = None,
) -> Iterator[ChunkRecord]:
    """Chunk records of documents, in order; records each document's point ids in `doc_points` and
    the filterable metadata keys seen (key -> "keyword" / "integer") in `metadata_fields`."""
    chunker = Chunker(tokenizer, opts.chunk_size, opts.chunk_overlap)
    for doc in docs:
        chunks = chunker(doc.text)
        if not chunks:
            summary.empty += 1
            continue
        if metadata_fields is not None:
            note_metadata_fields(doc.metadata, metadata_fields)
        ids: set[str] = set()
        for ch in chunks:
            h = content_hash(ch.text)
            pid = point_id(doc.doc_id, ch.index, h)
            ids.add(pid)
            payload = {
                "text": ch.text,
                "source": doc.source,
                "doc_id": doc.doc_id,
                "chunk_index": ch.index,
                "chunk_count": len(chunks),
                "char_start": ch.start,
                "char_end": ch.end,
                "n_tokens": ch.n_tokens,
                "content_hash": h,
                "model": model_id,
                "metadata": doc.metadata,
            }
            yield ChunkRecord(pid, ch.text, payload, ch.n_tokens)
        # A later record with the same document id replaces the earlier one (the last one wins).
        doc_points[doc.doc_id] = ids


# Payload fields every filter of this package can use (prune and delete filter on doc_id).
INDEXED_FIELDS: dict[str, str] = {"doc_id": "keyword", "source": "keyword"}
MAX_METADATA_INDEXES = 16


def note_metadata_fields(metadata: dict[str, Any], seen: dict[str, str]) -> None:
    """Remember metadata keys with keyword or integer values (what `--filter key=value` matches)."""
    for key, value in metadata.items():
        if key in seen or len(seen) >= MAX_METADATA_INDEXES:
            continue
        if isinstance(value, str):
            seen[key] = "keyword"
        elif isinstance(value, int) and not isinstance(value, bool):
            seen[key] = "integer"


def ensure_payload_indexes(store: BGEM3Store, collection: str, metadata_fields: dict[str, str]) -> None:
    """Payload indexes for doc_id, source and the metadata keys seen, so filters need no full scan."""
    have = store.payload_indexes(collection)
    wanted = {**INDEXED_FIELDS, **{f"metadata.{k}": v for k, v in metadata_fields.items()}}
    for field_name, kind in wanted.items():
        if field_name not in have:
            store.create_payload_index(collection, field_name, kind)  # type: ignore[arg-type]


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


def batches_flushing_on_error(records: Iterable[ChunkRecord], size: int) -> Iterator[list[ChunkRecord]]:
    """Batches of `size`; if reading fails, the records read so far come out first, then the error."""
    buf: list[ChunkRecord] = []
    try:
        for r in records:
            buf.append(r)
            if len(buf) == size:
                yield buf
                buf = []
    except SourceError:
        if buf:
            yield buf
        raise
    if buf:
        yield buf


def split_batch(
    batch: list[ChunkRecord],
    existing: dict[str, dict[str, Any]],
    model_id: str,
) -> tuple[list[ChunkRecord], list[ChunkRecord], int]:
    """(to encode, payload-only updates, unchanged count) for a batch given what is stored.

    The id already encodes document, position and content, so a stored id means stored vectors are
    valid, unless another model wrote them.
    """
    todo: list[ChunkRecord] = []
    relabel: list[ChunkRecord] = []
    unchanged = 0
    seen: set[str] = set()
    for r in batch:
        if r.id in seen:  # the same chunk twice in one batch (duplicate documents)
            unchanged += 1
            continue
        seen.add(r.id)
        stored = existing.get(r.id)
        if stored is None or stored.get("model") != model_id:
            todo.append(r)
        elif stored != r.payload:
            relabel.append(r)
        else:
            unchanged += 1
    return todo, relabel, unchanged


def _progress(show: bool | None) -> Any:
    from tqdm.auto import tqdm

    enabled = show if show is not None else sys.stderr.isatty()
    return tqdm(unit="chunk", desc="ingest", disable=not enabled, dynamic_ncols=True)


class Ingestor:
    """Python API of `bgem3-qdrant ingest`.

    >>> ing = Ingestor(client, "docs", encoder)          # doctest: +SKIP
    >>> summary = ing.ingest_paths(["corpus/"])          # doctest: +SKIP
    """

    def __init__(
        self,
        client: BGEM3Store | QdrantClient,
        collection: str,
        encoder: EncoderLike,
        schema: CollectionSchema | None = None,
        options: IngestOptions | None = None,
        model_id: str | None = None,
    ) -> None:
        self.store = as_store(client)
        self.client = self.store  # the name of earlier releases
        self.collection = collection
        self.encoder = encoder
        self.schema = schema or CollectionSchema(size=int(encoder.hidden_size))
        if self.schema.size != int(encoder.hidden_size):
            raise ValueError(f"schema size {self.schema.size} != encoder hidden size {encoder.hidden_size}")
        self.options = options or IngestOptions()
        self.model_id = model_id or str(getattr(encoder, "model_id", "unknown"))

    def ingest_paths(
        self,
        paths: Iterable[str | os.PathLike[str]],
        *,
        include: Iterable[str] = DEFAULT_INCLUDE,
        exclude: Iterable[str] = (),
        encoding: str = "utf-8",
        text_field: str = "text",
        engine: Engine = "plain",
        **engine_kwargs: Any,
    ) -> IngestSummary:
        """Ingest files, directories (recursive, glob filters) and JSONL files."""
        stats = SourceStats()
        on_invalid: Callable[[SourceError], None] | None = None
        if self.options.skip_invalid:

            def on_invalid(e: SourceError) -> None:
                logger.warning("skipped: %s", e)

        docs = iter_documents(
            paths,
            include=include,
            exclude=exclude,
            encoding=encoding,
            text_field=text_field,
            on_invalid=on_invalid,
            stats=stats,
        )
        return self.ingest_documents(docs, stats=stats, engine=engine, **engine_kwargs)

    def ingest_documents(
        self,
        docs: Iterable[Document],
        *,
        stats: SourceStats | None = None,
        engine: Engine = "plain",
        **engine_kwargs: Any,
    ) -> IngestSummary:
        """Ingest Document objects (the Python-API entry point for text you already have)."""
        opts = self.options
        summary = IngestSummary()
        started = time.perf_counter()
        ensure_collection(self.store, self.collection, self.schema)
        store = Store(
            self.store,
            self.collection,
            self.schema,
            retries=opts.retries,
            max_pending=opts.max_pending_writes,
        )
        doc_points: dict[str, set[str]] = {}
        metadata_fields: dict[str, str] = {}
        records = chunk_records(
            docs, self.encoder.tokenizer, opts, self.model_id, summary, doc_points, metadata_fields
        )
        bar = _progress(opts.show_progress)
        error: SourceError | None = None
        try:
            if engine == "plain":
                self._run_plain(records, store, summary, bar)
            elif engine == "ray":
                from .ray_engine import run_ray

                run_ray(self, records, store, summary, bar, **engine_kwargs)
            else:
                raise ValueError(f"unknown engine {engine!r} (plain or ray)")
        except SourceError as e:
            error = e  # stop, but keep (and finish writing) everything read before the bad input
        finally:
            bar.close()
            try:
                store.flush()
            finally:
                store.close()
        if stats is not None:
            summary.files, summary.documents = stats.files, stats.documents
            summary.invalid = list(stats.invalid)
        else:
            summary.documents = len(doc_points) + summary.empty
        if error is not None:
            summary.seconds = time.perf_counter() - started
            # One message for the caller to show: the cause, and that nothing written is lost.
            kept = (
                f"stopped there; the {summary.encoded} chunks written before it are kept "
                "(a re-run skips them)"
            )
            raise SourceError(error.path, f"{error.reason}; {kept}", error.line) from error
        if opts.prune:
            prune_store = Store(self.store, self.collection, self.schema, retries=opts.retries)
            try:
                summary.pruned = prune_store.prune(doc_points)
            finally:
                prune_store.close()
        ensure_payload_indexes(self.store, self.collection, metadata_fields)
        if summary.encoded >= opts.optimize_after:
            optimize_with_progress(self.store, self.collection, opts.show_progress)
        summary.seconds = time.perf_counter() - started
        logger.info("ingest %s: %s", self.collection, summary.format())
        return summary

    def _account(
        self,
        summary: IngestSummary,
        batch: list[ChunkRecord],
        todo: list[ChunkRecord],
        relabel: list[ChunkRecord],
        unchanged: int,
        store: Store,
        bar: Any,
    ) -> None:
        summary.chunks += len(batch)
        summary.unchanged += unchanged
        summary.payload_updated += len(relabel)
        if relabel:
            store.overwrite_payloads((r.id, r.payload) for r in relabel)

    def encode(self, todo: list[ChunkRecord]) -> EncodedBatch:
        """Encode chunk records (dense + sparse + ColBERT in one pass)."""
        opts = self.options
        return encode_batch(
            self.encoder,
            [r.text for r in todo],
            [r.id for r in todo],
            [r.payload for r in todo],
            opts.max_length,
            opts.encode_batch_size or opts.batch_size,
        )

    def _run_plain(
        self, records: Iterable[ChunkRecord], store: Store, summary: IngestSummary, bar: Any
    ) -> None:
        """Encode in this process. The store thread checks the next batch and writes the previous one
        while this thread encodes, so encoding is the only thing on the critical path."""
        batches = batches_flushing_on_error(records, self.options.batch_size)
        pending_error: SourceError | None = None

        def next_batch() -> list[ChunkRecord] | None:
            nonlocal pending_error
            try:
                return next(batches, None)
            except SourceError as e:
                pending_error = e
                return None

        batch = next_batch()
        existing_f = store.existing_async([r.id for r in batch]) if batch else None
        while batch is not None and existing_f is not None:
            todo, relabel, unchanged = split_batch(batch, existing_f.result(), self.model_id)
            self._account(summary, batch, todo, relabel, unchanged, store, bar)
            encoded = None
            if todo:
                t0 = time.perf_counter()
                encoded = self.encode(todo)
                summary.encode_seconds += time.perf_counter() - t0
            nxt = next_batch()
            # Queue the next existence check before this write, so it is not stuck behind it.
            existing_f = store.existing_async([r.id for r in nxt]) if nxt else None
            if encoded is not None:
                store.upsert_async(encoded)
                summary.encoded += len(todo)
                summary.tokens += sum(r.n_tokens + SPECIAL_TOKENS for r in todo)
            bar.update(len(batch))
            if summary.tokens:
                bar.set_postfix(
                    tok_s=f"{summary.tokens / max(1e-9, bar.format_dict['elapsed']):.0f}", refresh=False
                )
            batch = nxt
        if pending_error is not None:
            raise pending_error
