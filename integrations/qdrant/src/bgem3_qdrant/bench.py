"""Throughput check: encoder-only tokens/s vs end-to-end ingestion into a fresh embedded store."""

from __future__ import annotations

import os
import platform
import tempfile
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from .chunking import Chunker
from .client import open_client, resolve_target
from .encoder import EncoderLike
from .ingest import SPECIAL_TOKENS, IngestOptions, Ingestor
from .sources import iter_documents


def _encoder_only(encoder: EncoderLike, texts: list[str], opts: IngestOptions) -> float:
    """Seconds to encode all texts (dense + sparse + ColBERT) in ingestion-sized batches."""
    t0 = time.perf_counter()
    for i in range(0, len(texts), opts.batch_size):
        encoder.encode_corpus(
            texts[i : i + opts.batch_size],
            batch_size=opts.encode_batch_size or opts.batch_size,
            max_length=opts.max_length,
            return_dense=True,
            return_sparse=True,
            return_colbert_vecs=True,
        )
    return time.perf_counter() - t0


def run_bench(
    encoder: EncoderLike,
    paths: Iterable[str | os.PathLike[str]],
    *,
    chunk_size: int = 512,
    chunk_overlap: int = 64,
    batch_size: int = 32,
    repeat: int = 1,
    model_id: str | None = None,
) -> dict[str, Any]:
    """Encode the corpus alone (twice, before and after), then ingest it end to end; compare tokens/s.

    `repeat` > 1 ingests that many distinct copies of the corpus (ids differ) for a longer run.
    """
    opts = IngestOptions(
        chunk_size=chunk_size,
        chunk_overlap=chunk_overlap,
        batch_size=batch_size,
        prune=True,
        show_progress=False,
    )
    base = list(iter_documents(paths))
    docs = [replace(d, doc_id=f"{d.doc_id}#{k}") for k in range(repeat) for d in base]
    chunker = Chunker(encoder.tokenizer, chunk_size, chunk_overlap)
    chunks = [c for d in docs for c in chunker(d.text)]
    texts = [c.text for c in chunks]
    tokens = sum(c.n_tokens + SPECIAL_TOKENS for c in chunks)

    _encoder_only(encoder, texts[: batch_size * 2], opts)  # warm-up: graph tracing, allocator
    enc_before = _encoder_only(encoder, texts, opts)
    with tempfile.TemporaryDirectory(prefix="bgem3-qdrant-bench-") as tmp:
        client = open_client(resolve_target(path=tmp))
        try:
            ing = Ingestor(client, "bench", encoder, options=opts, model_id=model_id)
            summary = ing.ingest_documents(docs)
        finally:
            client.close()
    enc_after = _encoder_only(encoder, texts, opts)
    enc_s = (enc_before + enc_after) / 2
    enc_tps = tokens / enc_s
    e2e_tps = summary.tokens / summary.seconds
    return {
        "model": model_id or getattr(encoder, "model_id", None),
        "hidden_size": int(encoder.hidden_size),
        "documents": len(docs),
        "chunks": len(chunks),
        "tokens": tokens,
        "encoder_only_seconds": round(enc_s, 3),
        "encoder_only_tokens_per_s": round(enc_tps, 1),
        "end_to_end_seconds": round(summary.seconds, 3),
        "end_to_end_tokens_per_s": round(e2e_tps, 1),
        "end_to_end_over_encoder_only": round(e2e_tps / enc_tps, 3),
        "store": "embedded (qdrant-client local mode)",
        "batch_size": batch_size,
        "chunk_size": chunk_size,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }
