"""The Spark engine: chunks encoded on Spark executors (one encoder per Python worker), written by the driver.

The driver plans as the other engines do (remote.py: the same chunks and point ids) and writes every point
through the ingestor's writer, as the Ray engine does for an embedded store. The chunks to encode go to the
executors in waves: each wave is one Spark job of a few partitions per task slot, each partition a whole
number of batches (more of them in a large run); `mapInPandas` hands a worker's Python the partition as
Arrow batches of `batch_size` rows, the encoder (built once per Python worker and kept while Spark reuses
the worker) encodes each, and the vectors come back to the driver as Arrow, to be written while the next
wave runs. A wave written is kept: a run stopped midway skips those chunks when run again (their ids are
stored). A worker lost mid-job costs the tasks it held, which Spark runs again on the workers left; ids are
fixed by the plan, so a chunk encoded twice is still stored once.

    >>> encoding = SparkEncoding("BAAI/bge-m3", master="spark://10.0.0.5:7077")   # doctest: +SKIP
    >>> Ingestor(store, "kb", encoding).ingest_paths(["corpus/"])                # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from functools import partial
from typing import Any

import numpy as np

from .encoding import Destination, EncodeResult
from .options import IngestOptions
from .remote import RemoteEncoding
from .rows import ROW_COLUMNS, unpack
from .spark_session import spark_session
from .worker import WorkerEncoder, WorkerEncoders

logger = logging.getLogger(__name__)
# Partitions per task slot in a wave: enough for Spark to even out the slots, few enough that a wave's
# results (all three outputs) stay small on the driver.
PARTITIONS_PER_SLOT = 4
# A task costs Spark about as much as encoding a batch with a small model (docs/spark.md, Measured), so a
# large run puts several batches in a partition, at most this many, while keeping at least MIN_WAVES waves
# (each written when done: what a stopped run keeps).
MAX_BATCHES_PER_PARTITION = 16
MIN_WAVES = 4
# The columns the executors return (rows.pack's, with the dense vector as an array): Arrow types.
ENCODED_SCHEMA = (
    "id string, text string, payload string, tokens long, dense array<float>, "
    "sparse_idx binary, sparse_val binary, colbert binary"
)
INPUT_SCHEMA = "id string, text string, payload string, tokens long"


class SparkEncoder(WorkerEncoder):
    """The workers' encoder callable (the same encoding and checkpoint check as Ray's), named for Spark."""

    @staticmethod
    def where() -> str:
        return f"Spark executor on {socket.gethostname()} (Python worker pid {os.getpid()})"


# One encoder per Python worker process, kept across the tasks Spark runs in it (spark.python.worker.reuse).
_ENCODERS = WorkerEncoders()


def _worker_encoder(
    model: str, options: IngestOptions, encoder_kwargs: dict[str, Any], fingerprint: str | None
) -> SparkEncoder:
    key = [model, encoder_kwargs, fingerprint]
    encoder = _ENCODERS.get(key, lambda: SparkEncoder(model, options, encoder_kwargs, fingerprint))
    encoder.options = options
    return encoder


def encode_frames(
    frames: Iterator[Any],
    *,
    model: str,
    options: IngestOptions,
    encoder_kwargs: dict[str, Any],
    fingerprint: str | None,
) -> Iterator[Any]:
    """mapInPandas function run on the executors: chunk rows in, the rows with their vectors out."""
    import pandas as pd

    encoder = _worker_encoder(model, options, encoder_kwargs, fingerprint)
    for frame in frames:
        if frame.empty:
            continue
        cols: dict[str, Any] = encoder({c: frame[c].to_numpy() for c in ROW_COLUMNS})
        cols["dense"] = list(cols["dense"])  # one array<float> per row
        yield pd.DataFrame(cols)


def waves(rows: list[dict[str, Any]], batch_size: int, slots: int) -> Iterator[list[list[dict[str, Any]]]]:
    """The rows as waves of partitions: each partition whole batches (as many as keep MIN_WAVES waves, at
    most MAX_BATCHES_PER_PARTITION), PARTITIONS_PER_SLOT per slot a wave; the last ones smaller."""
    per_wave = max(1, slots) * PARTITIONS_PER_SLOT
    batches = -(-len(rows) // batch_size)
    size = batch_size * max(1, min(MAX_BATCHES_PER_PARTITION, batches // (per_wave * MIN_WAVES)))
    parts = [rows[i : i + size] for i in range(0, len(rows), size)]
    for i in range(0, len(parts), per_wave):
        yield parts[i : i + per_wave]


class SparkEncoding(RemoteEncoding):
    """Encoding on Spark executors: `master` (None: `local[*]`, or `local[concurrency]`), `concurrency`
    the task slots used at once (on a cluster: spark.cores.max; default all it gives). `encoder_kwargs`
    go to each worker's BGEM3Encoder; `conf`: more Spark settings."""

    def __init__(
        self,
        model: str,
        *,
        master: str | None = None,
        concurrency: int | None = None,
        encoder_kwargs: dict[str, Any] | None = None,
        conf: dict[str, str] | None = None,
    ) -> None:
        super().__init__(model, encoder_kwargs)
        self.master = master
        self.concurrency = concurrency
        self.conf = dict(conf or {})

    def finish(self, options: IngestOptions, destination: Destination) -> Iterator[EncodeResult]:
        rows = self.take_rows()
        if not rows:
            return
        verbose = logger.isEnabledFor(logging.INFO)  # -v
        conf = {
            # One Arrow batch per encoder batch, as the other engines call the encoder.
            "spark.sql.execution.arrow.maxRecordsPerBatch": str(options.batch_size),
            **self.conf,
        }
        identity = self.identity()
        encode = partial(
            encode_frames,
            model=self.model_id,
            options=options,
            encoder_kwargs=self.encoder_kwargs,
            fingerprint=None if identity is None else identity.fingerprint,
        )
        with spark_session(
            self.master, "bgem3-qdrant ingest", concurrency=self.concurrency, conf=conf, verbose=verbose
        ) as spark:
            slots = spark.sparkContext.defaultParallelism
            logger.info("encoding %d chunks on Spark, %d task slots", len(rows), slots)
            for wave in waves(rows, options.batch_size, slots):
                yield from self._run_wave(spark, wave, encode)

    @staticmethod
    def _run_wave(spark: Any, wave: list[list[dict[str, Any]]], encode: Any) -> Iterator[EncodeResult]:
        """One Spark job: the wave's partitions encoded on the executors, back as Arrow, one batch each."""
        records = [(r["id"], r["text"], r["payload"], int(r["tokens"])) for part in wave for r in part]
        rdd = spark.sparkContext.parallelize(records, numSlices=len(wave))
        frame = spark.createDataFrame(rdd, INPUT_SCHEMA).mapInPandas(encode, ENCODED_SCHEMA)
        for batch in frame.toArrow().to_batches():
            if batch.num_rows:
                yield unpack(_columns(batch))


def _columns(batch: Any) -> dict[str, np.ndarray]:
    """An Arrow record batch of ENCODED_SCHEMA as the numpy columns `rows.unpack` reads."""
    dense = batch.column("dense")
    cols = {
        name: np.asarray(batch.column(name).to_pylist(), dtype=object)
        for name in ("id", "text", "payload", "sparse_idx", "sparse_val", "colbert")
    }
    cols["tokens"] = batch.column("tokens").to_numpy()
    cols["dense"] = np.asarray(dense.flatten().to_numpy(), dtype=np.float32).reshape(len(dense), -1)
    return cols


__all__ = ["SparkEncoding", "encode_frames"]
