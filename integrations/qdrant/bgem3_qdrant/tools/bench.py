"""Throughput check: encoder-only tokens/s vs end-to-end ingestion into a fresh embedded store."""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from ..chunking import Chunker
from ..encoder import EncoderLike, encode_texts
from ..ingest import SPECIAL_TOKENS, IngestOptions, Ingestor, IngestSummary
from ..sources import Document, iter_documents
from ..stores.open import open_store, resolve_target


def _encoder_only(encoder: EncoderLike, texts: list[str], opts: IngestOptions) -> float:
    """Seconds to encode all texts (dense + sparse + ColBERT) in ingestion-sized batches."""
    t0 = time.perf_counter()
    for i in range(0, len(texts), opts.batch_size):
        encode_texts(
            encoder,
            texts[i : i + opts.batch_size],
            query=False,
            max_length=opts.max_length,
            batch_size=opts.encoder_batch_size,
        )
    return time.perf_counter() - t0


def _end_to_end(
    encoder: EncoderLike, docs: list[Document], opts: IngestOptions, model_id: str | None
) -> tuple[IngestSummary, str]:
    """Ingest `docs` into a fresh folder store (the default engine); the run's summary and the engine."""
    with tempfile.TemporaryDirectory(prefix="bgem3-qdrant-bench-") as tmp:
        store = open_store(resolve_target(path=tmp))
        try:
            ingestor = Ingestor(store, "bench", encoder, options=opts, model_id=model_id)
            summary = ingestor.ingest_documents(docs)
            return summary, store.label
        finally:
            store.close()


def run_bench(
    encoder: EncoderLike,
    paths: Iterable[str | os.PathLike[str]],
    *,
    chunk_size: int = 512,
    chunk_overlap: int = 64,
    batch_size: int = 32,
    repeat: int = 1,
    rounds: int = 3,
    model_id: str | None = None,
) -> dict[str, Any]:
    """Encoder-only vs end-to-end tokens/s on the same chunks, in alternating rounds.

    Each round encodes the corpus alone, then ingests it end to end into a fresh embedded store
    (reading, chunking, skip-check, encoding, writing, pruning). Back-to-back pairs and the median
    ratio keep the comparison fair on a machine whose load changes. `repeat` > 1 ingests that many
    distinct copies of the corpus (different ids).
    """
    opts = IngestOptions(
        chunk_size=chunk_size, chunk_overlap=chunk_overlap, batch_size=batch_size, show_progress=False
    )
    base = list(iter_documents(paths))
    docs = [replace(d, doc_id=f"{d.doc_id}#{k}") for k in range(repeat) for d in base]
    chunker = Chunker(encoder.tokenizer, chunk_size, chunk_overlap)
    chunks = [c for d in docs for c in chunker(d.text)]
    texts = [c.text for c in chunks]
    tokens = sum(c.n_tokens + SPECIAL_TOKENS for c in chunks)

    _encoder_only(encoder, texts[: batch_size * 2], opts)  # warm-up: graph tracing, allocator
    enc_rates, e2e_rates, ratios = [], [], []
    for _ in range(max(1, rounds)):
        enc_rate = tokens / _encoder_only(encoder, texts, opts)
        summary, store_label = _end_to_end(encoder, docs, opts, model_id)
        e2e_rate = summary.tokens / summary.seconds
        enc_rates.append(enc_rate)
        e2e_rates.append(e2e_rate)
        ratios.append(e2e_rate / enc_rate)
    return {
        "model": model_id or getattr(encoder, "model_id", None),
        "hidden_size": int(encoder.hidden_size),
        "documents": len(docs),
        "chunks": len(chunks),
        "tokens": tokens,
        "rounds": len(ratios),
        "encoder_only_tokens_per_s": round(statistics.median(enc_rates), 1),
        "end_to_end_tokens_per_s": round(statistics.median(e2e_rates), 1),
        "end_to_end_over_encoder_only": round(statistics.median(ratios), 3),
        "ratio_per_round": [round(r, 3) for r in ratios],
        "store": store_label,
        "batch_size": batch_size,
        "chunk_size": chunk_size,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }
