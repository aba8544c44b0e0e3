"""Encoded chunks from Parquet into a collection (`bgem3-qdrant load-parquet`): no encoder runs.

The Parquet is what `bgem3_qdrant.spark.write_parquet` writes (or a JVM job writing the same schema,
docs/spark.md): one row per chunk with its point id, text, payload (JSON, without the text) and the three
outputs. Rows are read in batches with pyarrow (no Spark needed), split as an ingest splits them
(plan.classify: new, payload changed, unchanged) and written by the same Writer, so a load is idempotent and
a stopped one resumes; the collection records the model as `ingest` does.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..encoder import EncodedTexts
from ..errors import BGEM3QdrantError
from ..identity import ensure_model, stored_pooling
from ..payload import MODEL, TEXT, IndexKind, note_metadata_fields
from ..pooling import check_pool_factor
from ..schema import CollectionSchema
from ..stores.base import BGEM3Store, ensure_collection
from .encoding import EncodedBatch
from .options import SPECIAL_TOKENS, IngestOptions, IngestSummary
from .plan import ChunkRecord, IngestPlan
from .remote import RemoteEncoding
from .writer import Writer, ensure_payload_indexes

logger = logging.getLogger(__name__)
REQUIRED_COLUMNS = ("id", "text", "payload", "dense", "sparse_indices", "sparse_values", "colbert")


class ParquetError(BGEM3QdrantError):
    """A Parquet input that is not encoded chunks of the model named (columns, width, model)."""


class _Model(RemoteEncoding):
    """The model named for a load: its tokenizer, hidden size and fingerprint, no encoder."""

    def submit(self, todo: Any, options: Any) -> Iterator[Any]:  # pragma: no cover - never encodes
        raise NotImplementedError

    def finish(self, options: Any, destination: Any) -> Iterator[Any]:  # pragma: no cover
        raise NotImplementedError


def _dataset(path: str | Path) -> Any:
    import pyarrow.dataset as ds

    try:
        return ds.dataset(str(path), format="parquet")
    except (OSError, ValueError) as e:
        raise ParquetError(f"cannot read Parquet at {path}: {e}") from None


def count_rows(path: str | Path) -> int:
    """Rows (chunks) of a Parquet file or folder, from its metadata."""
    return int(_dataset(path).count_rows())


def read_parquet_batches(
    path: str | Path, batch_size: int, hidden_size: int
) -> Iterator[tuple[list[ChunkRecord], EncodedTexts]]:
    """Chunk records and their vectors, `batch_size` rows at a time (a file or a folder of part files)."""
    dataset = _dataset(path)
    missing = [c for c in REQUIRED_COLUMNS if c not in dataset.schema.names]
    if missing:
        raise ParquetError(
            f"{path} has no column(s) {', '.join(missing)}: it must hold encoded chunks "
            "(docs/spark.md, Parquet schema)"
        )
    for batch in dataset.to_batches(columns=list(REQUIRED_COLUMNS), batch_size=batch_size):
        if batch.num_rows:
            yield _records(batch, hidden_size, path)


def _records(batch: Any, hidden: int, path: str | Path) -> tuple[list[ChunkRecord], EncodedTexts]:
    col = {name: batch.column(name) for name in REQUIRED_COLUMNS}
    n = batch.num_rows
    dense = np.asarray(col["dense"].flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
    if dense.size != n * hidden:
        raise ParquetError(f"{path}: dense vectors are not {hidden} floats each (the model's hidden size)")
    records = []
    for pid, text, payload in zip(
        col["id"].to_pylist(), col["text"].to_pylist(), col["payload"].to_pylist(), strict=True
    ):
        fields = json.loads(payload)
        tokens = int(fields.get("n_tokens", 0))
        records.append(ChunkRecord(str(pid), str(text), {TEXT: text, **fields}, tokens))
    colbert = []
    for rows in col["colbert"].to_pylist():
        c = np.asarray(rows, dtype=np.float32).reshape(-1, hidden)
        colbert.append(c)
    sparse = [
        (np.asarray(i, dtype=np.int64), np.asarray(w, dtype=np.float32))
        for i, w in zip(col["sparse_indices"].to_pylist(), col["sparse_values"].to_pylist(), strict=True)
    ]
    return records, EncodedTexts(dense=dense.reshape(n, hidden), sparse=sparse, colbert=colbert)


def _subset(vectors: EncodedTexts, keep: list[int]) -> EncodedTexts:
    return EncodedTexts(
        dense=vectors.dense[keep],
        sparse=[vectors.sparse[i] for i in keep],
        colbert=[vectors.colbert[i] for i in keep],
    )


def load_parquet(
    store: BGEM3Store,
    collection: str,
    path: str | Path,
    model: str,
    *,
    schema: CollectionSchema | None = None,
    options: IngestOptions | None = None,
) -> IngestSummary:
    """Write the encoded chunks of a Parquet file or folder into `collection` (created with `schema` when
    new), as `ingest` would have stored them with `model`. Chunks stored already are skipped."""
    opts = options or IngestOptions()
    started = time.perf_counter()
    info = _Model(model)
    schema = schema or CollectionSchema(size=info.hidden_size)
    ensure_collection(store, collection, schema)
    pooling = check_pool_factor(opts.colbert_pooling) if opts.colbert_pooling else None
    pooling = pooling or stored_pooling(store, collection)
    identity = info.identity()
    if identity is not None:
        identity = replace(identity, colbert_pooling=pooling)
    ensure_model(store, collection, identity, write=True)
    plan = IngestPlan(info.tokenizer, opts, model)
    writer = Writer(store, collection, schema, retries=opts.retries, colbert_pooling=pooling)
    summary = IngestSummary()
    fields: dict[str, IndexKind] = {}
    try:
        for records, vectors in read_parquet_batches(path, opts.batch_size, info.hidden_size):
            other = {r.payload.get(MODEL) for r in records} - {model}
            if other:
                raise ParquetError(
                    f"{path} holds chunks encoded with {sorted(map(str, other))[0]!r}, not --model {model!r}"
                )
            stored = writer.existing_async([r.id for r in records]).result()
            step = plan.classify(records, stored)
            summary.chunks += len(records)
            summary.unchanged += step.unchanged
            summary.payload_updated += len(step.relabel)
            writer.overwrite_payloads((r.id, r.payload) for r in step.relabel)
            first: dict[str, int] = {}
            for i, r in enumerate(records):
                first.setdefault(r.id, i)
            keep = [first[r.id] for r in step.todo]
            for r in records:
                note_metadata_fields(r.payload.get("metadata") or {}, fields)
            if keep:
                batch = EncodedBatch(
                    ids=[records[i].id for i in keep],
                    payloads=[records[i].payload for i in keep],
                    vectors=_subset(vectors, keep),
                    tokens=sum(records[i].n_tokens + SPECIAL_TOKENS for i in keep),
                )
                writer.upsert_async(batch)
                summary.encoded += len(batch)
                summary.tokens += batch.tokens
        writer.flush()
    finally:
        writer.close()
    ensure_payload_indexes(store, collection, fields)
    summary.seconds = time.perf_counter() - started
    logger.info("load-parquet %s: %s", collection, summary.format())
    return summary
