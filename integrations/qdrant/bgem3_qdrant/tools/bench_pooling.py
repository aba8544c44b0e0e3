"""What ColBERT pooling costs at ingest: pooling time per chunk beside the encoder's time for the same chunk.

    python -m bgem3_qdrant.tools.bench_pooling --model DIR [--chunks 8] [--tokens 512] [--factors 2,3,4]

Chunks of `tokens` tokens are cut from generated text with the model's own tokenizer (the chunker
ingest uses), encoded with `encode_corpus` (all three outputs, after a warm-up batch), then each chunk's
ColBERT rows are pooled by every factor; both are timed in this process, one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

from ..chunking import Chunker
from ..encoder import EncoderLike, encode_texts, load_encoder
from ..ingest.options import IngestOptions
from ..pooling import pool_rows
from .bench_store import cpu_model

WORDS = [
    "sourdough",
    "starter",
    "flour",
    "water",
    "bike",
    "lanes",
    "river",
    "district",
    "winter",
    "lights",
    "wind",
    "power",
    "solar",
    "storage",
    "grid",
    "espresso",
    "pressure",
    "crema",
    "volcano",
    "geyser",
    "valley",
    "search",
    "dense",
    "sparse",
    "token",
    "passage",
    "query",
    "vector",
    "index",
    "model",
    "retrieval",
    "ranking",
    "document",
    "chunk",
    "language",
    "paris",
    "berlin",
    "rome",
    "kamchatka",
    "north",
    "south",
    "energy",
]


def chunks_of(encoder: EncoderLike, n: int, tokens: int, seed: int = 0) -> list[str]:
    """`n` chunk texts of `tokens` tokens each (the last words of a chunk may make it a token shorter)."""
    rng = np.random.default_rng(seed)
    text = " ".join(rng.choice(WORDS, size=n * tokens * 2))
    chunks = Chunker(encoder.tokenizer, tokens, 0)(text)
    return [c.text for c in chunks[:n]]


def run_pooling_bench(
    encoder: EncoderLike, *, chunks: int = 8, tokens: int = 512, factors: tuple[int, ...] = (2, 3, 4),
    batch_size: int = 4, repeats: int = 5,
) -> dict[str, Any]:  # fmt: skip
    """Encode ms per chunk, then pool ms per chunk for each factor (median of `repeats`)."""
    texts = chunks_of(encoder, chunks, tokens)
    max_length = IngestOptions(chunk_size=tokens).max_length
    encode_texts(encoder, texts[:batch_size], query=False, max_length=max_length, batch_size=batch_size)
    t0 = time.perf_counter()
    out = encode_texts(encoder, texts, query=False, max_length=max_length, batch_size=batch_size)
    encode_ms = (time.perf_counter() - t0) * 1000 / len(texts)
    for f in factors:  # warm-up: scipy's import and first-call costs are not the pooling's
        pool_rows(out.colbert[0], f)
    result: dict[str, Any] = {
        "cpu": cpu_model(),
        "load": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "chunks": len(texts),
        "rows_per_chunk": float(np.mean([len(c) for c in out.colbert])),
        "dim": int(out.colbert[0].shape[1]),
        "encode_ms_per_chunk": encode_ms,
        "factors": {},
    }
    for f in factors:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            pooled = [pool_rows(c, f) for c in out.colbert]
            times.append((time.perf_counter() - t0) * 1000 / len(texts))
        ms = float(np.median(times))
        result["factors"][f] = {
            "pooled_rows_per_chunk": float(np.mean([len(p) for p in pooled])),
            "pool_ms_per_chunk": ms,
            "pool_over_encode": ms / encode_ms,
        }
    return result


def format_pooling_report(r: dict[str, Any]) -> str:
    lines = [
        f"pooling cost: {r['chunks']} chunks of {r['rows_per_chunk']:.0f} ColBERT rows x {r['dim']}; "
        f"CPU {r['cpu']}; load {r['load']}",
        f"encode (all three outputs): {r['encode_ms_per_chunk']:.1f} ms per chunk",
        f"{'factor':<8}{'rows':>8}{'pool ms/chunk':>15}{'pool / encode':>15}",
    ]
    for f, v in r["factors"].items():
        lines.append(
            f"{f:<8}{v['pooled_rows_per_chunk']:>8.0f}{v['pool_ms_per_chunk']:>15.2f}{v['pool_over_encode']:>15.2%}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="Hub id or checkpoint folder.")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--factors", default="2,3,4")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--precision", default="float32")
    ap.add_argument("--json", action="store_true", help="Print every figure as JSON.")
    args = ap.parse_args(argv)
    encoder = load_encoder(args.model, precision=args.precision, device="cpu")
    factors = tuple(int(f) for f in args.factors.split(","))
    r = run_pooling_bench(
        encoder, chunks=args.chunks, tokens=args.tokens, factors=factors, batch_size=args.batch_size
    )
    sys.stdout.write((json.dumps(r) if args.json else format_pooling_report(r)) + "\n")


if __name__ == "__main__":
    main()
