"""BGE-M3 on Spark DataFrames: the three outputs as columns, chunks with their point ids, Parquet for the JVM.

    from bgem3_qdrant.spark import chunks_dataframe, encode_dataframe, spark_session, write_parquet

    with spark_session("spark://10.0.0.5:7077", "embed") as spark:           # or any SparkSession
        df = encode_dataframe(spark.table("docs"), "BAAI/bge-m3", text_col="body")
        chunks = chunks_dataframe(spark, ["corpus/"], "BAAI/bge-m3")       # id, text, payload, tokens
        write_parquet(encode_dataframe(chunks, "BAAI/bge-m3"), "out/chunks.parquet")
    # then: bgem3-qdrant load-parquet out/chunks.parquet -c docs --model BAAI/bge-m3

`encode_dataframe` adds (docs/spark.md, "Parquet schema"):

    dense           array<float>          L2-normalised CLS vector (hidden size: 1024 for BGE-M3)
    sparse_indices  array<int>            token ids with a lexical weight > 0 (each once, its largest)
    sparse_values   array<float>          their weights
    colbert         array<array<float>>   one L2-normalised row per token after <s>

Each of the executors' Python workers loads the model once (kept while Spark reuses the worker), and gets
the rows as Arrow batches. Chunks made by `chunks_dataframe` carry the point ids `bgem3-qdrant ingest`
gives the same documents, so a collection loaded from their Parquet equals one ingested directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

import numpy as np

from .encoder import EncoderLike, encode_texts, load_encoder
from .ingest.options import IngestOptions
from .ingest.rows import to_row
from .ingest.spark_session import spark_session
from .ingest.worker import WorkerEncoders
from .sources import DEFAULT_INCLUDE, iter_documents

# The columns encode_dataframe adds, as Spark SQL types.
OUTPUT_COLUMNS = {
    "dense": "array<float>",
    "sparse_indices": "array<int>",
    "sparse_values": "array<float>",
    "colbert": "array<array<float>>",
}
# The columns of chunks_dataframe (payload: the chunk's payload without its text, as JSON).
CHUNK_SCHEMA = "id string, text string, payload string, tokens long"

# One encoder per Python worker process, kept across the tasks Spark runs in it.
_ENCODERS = WorkerEncoders()


def _encoder(model: str, encoder_kwargs: dict[str, Any]) -> EncoderLike:
    return _ENCODERS.get([model, encoder_kwargs], lambda: load_encoder(model, **encoder_kwargs))


def encode_frames(
    frames: Iterator[Any],
    *,
    model: str,
    text_col: str,
    query: bool,
    max_length: int | None,
    batch_size: int,
    encoder_kwargs: dict[str, Any],
) -> Iterator[Any]:
    """mapInPandas function run on the executors: each Arrow batch with the three outputs added."""
    encoder = _encoder(model, encoder_kwargs)
    for frame in frames:
        if frame.empty:
            yield frame.assign(**{c: [] for c in OUTPUT_COLUMNS})
            continue
        texts = [str(t) for t in frame[text_col]]
        v = encode_texts(encoder, texts, query=query, max_length=max_length, batch_size=batch_size)
        yield frame.assign(
            dense=list(v.dense),
            sparse_indices=[i.astype(np.int32) for i, _ in v.sparse],
            sparse_values=[w.astype(np.float32) for _, w in v.sparse],
            colbert=[list(c) for c in v.colbert],
        )


def encode_dataframe(
    df: Any,
    model: str,
    *,
    text_col: str = "text",
    query: bool = False,
    max_length: int | None = None,
    batch_size: int = 32,
    encoder_kwargs: dict[str, Any] | None = None,
) -> Any:
    """`df` with the columns of OUTPUT_COLUMNS added, encoded on the executors (lazy, as Spark is).

    `query`: encode as queries (else as passages); `max_length`: tokens per text (default the model's);
    `batch_size`: rows per encoder call (and per Arrow batch); `encoder_kwargs`: BGEM3Encoder's
    (precision, device). A column of those names already in `df` is refused.
    """
    from pyspark.sql.types import StructType

    if text_col not in df.columns:
        raise ValueError(f"no column {text_col!r} in the DataFrame (columns: {', '.join(df.columns)})")
    taken = sorted(set(df.columns) & set(OUTPUT_COLUMNS))
    if taken:
        raise ValueError(f"the DataFrame already has column(s) {', '.join(taken)}: rename or drop them first")
    spark = df.sparkSession
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(batch_size))
    fields = ", ".join(f"{name} {kind}" for name, kind in OUTPUT_COLUMNS.items())
    added = StructType.fromDDL(fields)
    assert isinstance(added, StructType)
    schema = StructType(df.schema.fields + added.fields)
    encode = partial(
        encode_frames,
        model=model,
        text_col=text_col,
        query=query,
        max_length=max_length,
        batch_size=batch_size,
        encoder_kwargs=dict(encoder_kwargs or {}),
    )
    return df.mapInPandas(encode, schema)


def chunk_rows(
    paths: Iterable[str], model: str, options: IngestOptions | None = None, **read: Any
) -> list[dict[str, Any]]:
    """The chunks `bgem3-qdrant ingest` makes of these files (same tokenizer, same point ids), as rows of
    CHUNK_SCHEMA. `read`: iter_documents' options (include, exclude, encoding, text_field)."""
    from .ingest.plan import IngestPlan
    from .ingest.remote import checkpoint_tokenizer

    options = options or IngestOptions()
    plan = IngestPlan(checkpoint_tokenizer(model)[0], options, model)
    read.setdefault("include", DEFAULT_INCLUDE)
    return [to_row(r) for r in plan.records(iter_documents(list(paths), **read))]


def chunks_dataframe(
    spark: Any, paths: Iterable[str], model: str, options: IngestOptions | None = None, **read: Any
) -> Any:
    """A DataFrame of the chunks of these files (chunk_rows), in four partitions per task slot."""
    rows = chunk_rows(paths, model, options, **read)
    records = [(r["id"], r["text"], r["payload"], int(r["tokens"])) for r in rows]
    slots = max(1, spark.sparkContext.defaultParallelism) * 4
    rdd = spark.sparkContext.parallelize(records, numSlices=max(1, min(len(records), slots)))
    return spark.createDataFrame(rdd, CHUNK_SCHEMA)


def write_parquet(df: Any, path: str, mode: str = "errorifexists") -> None:
    """Write an encoded DataFrame to Parquet (Spark's writer: a folder of part files). `mode` as Spark's
    (errorifexists, overwrite, append)."""
    missing = [c for c in ("id", "text", "payload", *OUTPUT_COLUMNS) if c not in df.columns]
    if missing:
        raise ValueError(
            f"not an encoded chunk DataFrame: no column(s) {', '.join(missing)} "
            "(chunks_dataframe, then encode_dataframe)"
        )
    df.write.mode(mode).parquet(path)


__all__ = [
    "CHUNK_SCHEMA",
    "OUTPUT_COLUMNS",
    "chunk_rows",
    "chunks_dataframe",
    "encode_dataframe",
    "spark_session",
    "write_parquet",
]
