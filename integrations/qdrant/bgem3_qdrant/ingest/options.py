"""How an ingestion runs (IngestOptions) and what it did (IngestSummary)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from ..schema import COLBERT_DTYPES, COLBERT_QUANTIZATIONS, ColbertStorage, check_choice
from ..wording import counted

# Where encoding runs: in this process ("plain"), in a Ray Data actor pool ("ray") or on Spark executors
# ("spark").
Engine = Literal["plain", "ray", "spark"]
ENGINES: tuple[str, ...] = get_args(Engine)
# Special tokens <s> and </s> the encoder adds around every chunk.
SPECIAL_TOKENS = 2


# The ColBERT storage `bgem3-qdrant ingest` gives a new collection when no option names another, by the
# chunks its first run will write (docs/qdrant.md, "ColBERT storage"): below LARGE_COLLECTION the rows are
# kept as the model gives them, in float16 (scores within ~1e-3 of float32; a store that small is soon all
# in the page cache); from LARGE_COLLECTION on, 4-bit rows pooled by 2 with a binary copy that reranks
# score first (46 KiB per 128-token chunk instead of 262): 4-bit rows alone score ~10x slower than float16
# (Qdrant's TurboQuant scorer), the binary copy makes the rerank read and score only the best 30
# candidates' rows. The copy stays on disk, read as reranks need it: read into RAM at open, it made a
# 100,000-chunk collection take 30 s to open from a cold page cache.
SMALL_COLLECTION_STORAGE = ColbertStorage(dtype="float16", pooling=1, quantization="none")
LARGE_COLLECTION_STORAGE = ColbertStorage(dtype="turbo4", pooling=2, quantization="binary", copy_on_disk=True)
LARGE_COLLECTION = 10_000
# Text bytes per token the chunk count is estimated with (UTF-8 prose: about 4 per XLM-R token).
BYTES_PER_TOKEN = 4


def recommended_storage(expected_chunks: int | None) -> ColbertStorage:
    """The storage recommended for a collection of about `expected_chunks` chunks (None: unknown, small)."""
    if expected_chunks is not None and expected_chunks >= LARGE_COLLECTION:
        return LARGE_COLLECTION_STORAGE
    return SMALL_COLLECTION_STORAGE


def estimate_chunks(paths: Iterable[str | os.PathLike[str]], chunk_size: int) -> int:
    """Chunks the input paths give, estimated from the size of their files (none is read; globs are not
    applied, so a folder's other files count too; hidden ones do not)."""
    total = 0
    for raw in paths:
        root = Path(raw)
        files = root.rglob("*") if root.is_dir() else iter([root])
        for f in files:
            if any(part.startswith(".") for part in f.relative_to(root).parts):
                continue
            try:
                total += f.stat().st_size if f.is_file() else 0
            except OSError:
                continue
    return total // max(chunk_size * BYTES_PER_TOKEN, 1)


def check_copy_on_disk(quantization: str | None, copy_on_disk: bool | None) -> None:
    """ValueError when a copy on disk is asked for a storage that has no copy (quantization "none")."""
    if copy_on_disk and quantization == "none":
        raise ValueError("--colbert-copy-on-disk needs a copy: --colbert-quantization int8 or binary")


def new_collection_storage(
    dtype: str | None = None,
    pooling: int | None = None,
    quantization: str | None = None,
    copy_on_disk: bool | None = None,
    *,
    expected_chunks: int | None = None,
) -> tuple[ColbertStorage, list[str]]:
    """The ColBERT storage of a collection ingest creates: each of the four left out (None) takes the
    value of `recommended_storage(expected_chunks)`. Returns the storage and the options that took it."""
    rec = recommended_storage(expected_chunks)
    if dtype is not None:
        check_choice("--colbert-dtype", dtype, COLBERT_DTYPES)
    if quantization is not None:
        check_choice("--colbert-quantization", quantization, COLBERT_QUANTIZATIONS)
    defaulted = [
        opt
        for opt, value in (
            ("--colbert-dtype", dtype),
            ("--colbert-pooling", pooling),
            ("--colbert-quantization", quantization),
        )
        if value is None
    ]
    storage = ColbertStorage(
        dtype=rec.dtype if dtype is None else dtype,
        pooling=rec.pooling if pooling is None else pooling,
        quantization=rec.quantization if quantization is None else quantization,
    )
    check_copy_on_disk(storage.quantization, copy_on_disk)
    if storage.quantization != "none":  # where the copy lives means something only when there is one
        if copy_on_disk is None:
            copy_on_disk = rec.copy_on_disk  # False for a recommendation without a copy
            defaulted.append("--colbert-copy-on-disk")
        storage = ColbertStorage(storage.dtype, storage.pooling, storage.quantization, copy_on_disk)
    return storage, defaulted


def storage_message(
    collection: str, storage: ColbertStorage, defaulted: list[str], expected_chunks: int | None = None
) -> str:
    """The line ingest prints when it creates a collection: its ColBERT storage, and which of it is the
    recommended default. The chunk estimate (file sizes) only tells a small collection from a large one:
    a number is said only for a large one, where file sizes tell it best (many short JSONL records make
    more chunks than their bytes suggest)."""
    from ..schema import describe_quantization

    line = (
        f"new collection {collection!r}: ColBERT rows stored {storage.dtype}, "
        f"{f'pooled by {storage.pooling}' if storage.pooling > 1 else 'unpooled'}, "
        f"{describe_quantization(storage.quantization, storage.copy_on_disk)}"
    )
    if defaulted:
        if expected_chunks is None:
            size = ""
        elif expected_chunks < LARGE_COLLECTION:
            size = f" for under {LARGE_COLLECTION:,} chunks, as the input's size suggests"
        else:
            size = f" for {LARGE_COLLECTION:,} chunks or more: the input's size suggests about "
            size += f"{expected_chunks:,}"
        line += f" ({', '.join(defaulted)}: the recommended storage{size}; see docs/qdrant.md)"
    return line


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
    # ColBERT token pooling factor of the stored documents (pooling.py): 1 off, 2-4 pool; None: the
    # collection's own factor (1 for a new one), so adding to a pooled collection keeps it pooled.
    colbert_pooling: int | None = None

    @property
    def max_length(self) -> int:
        # Re-tokenising a chunk's text can differ from the slice by a token or two at the edges.
        return self.chunk_size + SPECIAL_TOKENS + 8

    @property
    def encoder_batch_size(self) -> int:
        return self.encode_batch_size or self.batch_size


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
            counted(self.files, "file"),
            counted(self.documents, "document"),
            counted(self.chunks, "chunk"),
            f"{self.encoded:,} encoded",
            f"{self.unchanged:,} unchanged",
        ]
        if self.payload_updated:
            parts.append(f"{counted(self.payload_updated, 'payload')} updated")
        if self.pruned:
            parts.append(f"{self.pruned} outdated removed")
        if self.empty:
            parts.append(f"{self.empty} empty skipped")
        if self.invalid:
            parts.append(f"{len(self.invalid)} invalid skipped")
        if not self.encoded:  # a re-run with nothing new: no throughput to report (issue 58)
            parts.append(f"nothing new to encode ({self.seconds:.1f}s)")
            return ", ".join(parts)
        rate = f"{self.tokens_per_second:.0f} tokens/s"
        parts.append(f"{counted(self.tokens, 'token')} in {self.seconds:.1f}s = {rate}")
        return ", ".join(parts)
