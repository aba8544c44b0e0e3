"""Ingestion: sources -> chunks -> plan -> encoding -> writer -> store, one module per step.

    plan.py      documents -> chunk records with point ids; what the store already holds
    encoding.py  the encoding step's interface; plain.py (this process) and ray.py (Ray Data) implement it
    writer.py    encoded batches -> points on one writer thread; pruning, payload indexes, optimizer

`Ingestor` runs them in that order; both engines share everything but where encoding runs.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from functools import partial
from typing import Any

from ..chunking import Chunker
from ..errors import SourceError
from ..identity import ensure_model, stored_pooling
from ..pooling import check_pool_factor
from ..schema import CollectionSchema
from ..sources import DEFAULT_INCLUDE, Document, SourceStats, iter_documents
from ..stores.base import BGEM3Store, ensure_collection
from ..stores.open import as_store
from ..wording import counted
from .encoding import Destination, EncodedBatch, EncodeResult, Encoding
from .options import ENGINES, SPECIAL_TOKENS, Engine, IngestOptions, IngestSummary
from .plain import PlainEncoding
from .plan import ChunkRecord, IngestPlan
from .writer import Writer, ensure_payload_indexes, optimize_with_progress

logger = logging.getLogger(__name__)


def _progress_shown(show: bool | None) -> bool:
    return show if show is not None else sys.stderr.isatty()


def _progress_bar(show: bool | None, total: int | None = None) -> Any:
    """Chunks done of `total` (with an ETA) when the total is known."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total, unit="chunk", desc="ingest", disable=not _progress_shown(show), dynamic_ncols=True
    )


class Ingestor:
    """Python API of `bgem3-qdrant ingest`.

    `encoder` is a loaded BGEM3Encoder (encoding in this process) or an `Encoding` (e.g. `RayEncoding`
    for a Ray Data actor pool); `store` a BGEM3Store (`open_store`) or a QdrantClient.

    >>> ing = Ingestor(store, "docs", encoder)           # doctest: +SKIP
    >>> summary = ing.ingest_paths(["corpus/"])          # doctest: +SKIP
    """

    def __init__(
        self,
        store: Any,
        collection: str,
        encoder: Any,
        schema: CollectionSchema | None = None,
        options: IngestOptions | None = None,
        model_id: str | None = None,
    ) -> None:
        self.store: BGEM3Store = as_store(store)
        self.collection = collection
        self.encoding: Encoding = encoder if isinstance(encoder, Encoding) else PlainEncoding(encoder)
        self.schema = schema or CollectionSchema(size=self.encoding.hidden_size)
        if self.schema.size != self.encoding.hidden_size:
            raise ValueError(
                f"schema size {self.schema.size} != encoder hidden size {self.encoding.hidden_size}"
            )
        self.options = options or IngestOptions()
        self.model_id = model_id or self.encoding.model_id

    def colbert_pooling(self) -> int:
        """The factor this run pools documents by: the option, else the collection's recorded one (1 for
        a new or unpooled collection). A factor other than the collection's is refused on ingest."""
        if self.options.colbert_pooling is not None:
            return check_pool_factor(self.options.colbert_pooling)
        if not self.store.collection_exists(self.collection):
            return 1
        return stored_pooling(self.store, self.collection)

    def ingest_paths(
        self,
        paths: Iterable[str | os.PathLike[str]],
        *,
        include: Iterable[str] = DEFAULT_INCLUDE,
        exclude: Iterable[str] = (),
        encoding: str = "utf-8",
        text_field: str = "text",
    ) -> IngestSummary:
        """Ingest files, directories (recursive, glob filters) and JSONL files."""
        stats = SourceStats()
        on_invalid: Callable[[SourceError], None] | None = None
        if self.options.skip_invalid:

            def on_invalid(e: SourceError) -> None:
                # Logged (shown with -v) as it happens; the summary lists each one (the CLI prints them once).
                logger.info("skipped: %s", e)

        paths = list(paths)
        read = partial(
            iter_documents, paths, include=include, exclude=exclude, encoding=encoding, text_field=text_field
        )
        total = self._count_chunks(read) if _progress_shown(self.options.show_progress) else None
        return self.ingest_documents(read(on_invalid=on_invalid, stats=stats), stats=stats, total=total)

    def _count_chunks(self, read: Callable[..., Iterable[Document]]) -> int | None:
        """Chunks the input will give (a tokenizer-only pass: the progress bar's total and ETA); None
        when the input stops with an error, which the real pass then reports."""
        chunker = Chunker(self.encoding.tokenizer, self.options.chunk_size, self.options.chunk_overlap)
        try:
            return sum(len(chunker(doc.text)) for doc in read(on_invalid=lambda e: None, stats=SourceStats()))
        except SourceError:
            return None

    def ingest_documents(
        self, docs: Iterable[Document], *, stats: SourceStats | None = None, total: int | None = None
    ) -> IngestSummary:
        """Ingest Document objects (the Python-API entry point for text you already have). `total`: the
        chunks they give, if known (progress bar).

        An existing collection is checked (schema, model) before anything is read; a new one is created
        when the first chunk is ready to be encoded, so an input with nothing to store (no document, only
        empty ones, or an error in its first file) creates no empty collection."""
        opts = self.options
        summary = IngestSummary()
        started = time.perf_counter()
        pooling = self.colbert_pooling()
        identity = self.encoding.identity()
        if identity is not None:  # payloads name the model as model_id says
            identity = replace(identity, model=self.model_id, colbert_pooling=pooling)

        def open_collection() -> None:
            ensure_collection(self.store, self.collection, self.schema)
            ensure_model(self.store, self.collection, identity, write=True)

        new = not self.store.collection_exists(self.collection)
        if not new:
            open_collection()
        plan = IngestPlan(self.encoding.tokenizer, opts, self.model_id)
        writer = Writer(
            self.store,
            self.collection,
            self.schema,
            retries=opts.retries,
            max_pending=opts.max_pending_writes,
            colbert_pooling=pooling,
        )
        bar = _progress_bar(opts.show_progress, total)
        error: SourceError | None = None
        try:
            error = self._run(plan, writer, summary, bar, docs, open_collection if new else None)
            writer.flush()
            summary.empty = plan.empty
            if stats is not None:
                summary.files, summary.documents = stats.files, stats.documents
                summary.invalid = list(stats.invalid)
            else:
                summary.documents = len(plan.doc_points) + plan.empty
            if error is None and opts.prune and self.store.collection_exists(self.collection):
                summary.pruned = writer.prune(plan.doc_points)
        finally:
            bar.close()
            writer.close()
        if error is not None:
            summary.seconds = time.perf_counter() - started
            # One message for the caller to show: the cause, and that nothing written is lost.
            kept = (
                f"stopped there; what was written before it is kept ({counted(summary.encoded, 'chunk')}: "
                "a re-run skips it)"
                if summary.encoded
                else "stopped there, nothing was written"
            )
            raise SourceError(error.path, f"{error.reason}; {kept}", error.line, error.way_out) from error
        if not self.store.collection_exists(self.collection):  # nothing to store: none was created
            summary.seconds = time.perf_counter() - started
            return summary
        ensure_payload_indexes(self.store, self.collection, plan.metadata_fields)
        if summary.encoded >= opts.optimize_after:
            optimize_with_progress(self.store, self.collection, opts.show_progress)
        summary.seconds = time.perf_counter() - started
        logger.info("ingest %s: %s", self.collection, summary.format())
        return summary

    def _run(
        self,
        plan: IngestPlan,
        writer: Writer,
        summary: IngestSummary,
        bar: Any,
        docs: Iterable[Document],
        before_first: Callable[[], None] | None = None,
    ) -> SourceError | None:
        """Plan, encode and queue writes batch by batch. The writer thread checks the next batch and writes
        the previous one while encoding runs, so encoding is the only thing on the critical path.
        `before_first` runs once the first batch is read, before it is looked up (creating the collection).
        Returns the input error that stopped reading (everything read before it is written)."""
        batches = plan.batches(docs)
        error: SourceError | None = None

        def next_batch() -> list[ChunkRecord] | None:
            nonlocal error
            try:
                return next(batches, None)
            except SourceError as e:
                error = e
                return None

        def ids(batch: list[ChunkRecord]) -> list[str]:
            return [r.id for r in batch]

        batch = next_batch()
        if batch and before_first is not None:
            before_first()
        stored = writer.existing_async(ids(batch)) if batch else None
        while batch is not None and stored is not None:
            step = plan.classify(batch, stored.result())
            summary.chunks += len(batch)
            summary.unchanged += step.unchanged
            summary.payload_updated += len(step.relabel)
            writer.overwrite_payloads((r.id, r.payload) for r in step.relabel)
            bar.update(len(batch) - len(step.todo))
            results = self._timed(summary, self.encoding.submit(step.todo, self.options))
            nxt = next_batch()
            # Queue the next existence check before this write, so it is not stuck behind it.
            stored = writer.existing_async(ids(nxt)) if nxt else None
            self._store(results, writer, summary, bar)
            batch = nxt
        destination = Destination(self.store, self.collection, self.schema, writer.colbert_pooling)
        for result in self._stream(summary, self.encoding.finish(self.options, destination)):
            self._store([result], writer, summary, bar)
        return error

    @staticmethod
    def _timed(summary: IngestSummary, results: Iterator[EncodeResult]) -> list[EncodeResult]:
        t0 = time.perf_counter()
        out = list(results)
        summary.encode_seconds += time.perf_counter() - t0
        return out

    @staticmethod
    def _stream(summary: IngestSummary, results: Iterator[EncodeResult]) -> Iterator[EncodeResult]:
        while True:
            t0 = time.perf_counter()
            result = next(results, None)
            summary.encode_seconds += time.perf_counter() - t0
            if result is None:
                return
            yield result

    @staticmethod
    def _store(results: list[EncodeResult], writer: Writer, summary: IngestSummary, bar: Any) -> None:
        for result in results:
            if isinstance(result, EncodedBatch):
                writer.upsert_async(result)
                count = len(result)
            else:  # written by the engine itself
                count = result.count
            summary.encoded += count
            summary.tokens += result.tokens
            bar.update(count)
            elapsed = bar.format_dict.get("elapsed") or 0.0
            if summary.tokens and elapsed > 0:
                bar.set_postfix(tok_s=f"{summary.tokens / elapsed:.0f}", refresh=False)


__all__ = [
    "ENGINES",
    "SPECIAL_TOKENS",
    "Encoding",
    "Engine",
    "IngestOptions",
    "IngestSummary",
    "Ingestor",
    "PlainEncoding",
]
