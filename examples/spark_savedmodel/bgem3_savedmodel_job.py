"""BGE-M3 in a Spark job without this library: `bgem3 export`'s SavedModel and tokenizer on the executors.

    bgem3 export out/bge-m3-savedmodel --format saved_model --model BAAI/bge-m3
    python examples/spark_savedmodel/bgem3_savedmodel_job.py --export out/bge-m3-savedmodel \
        --input texts.jsonl --output vectors.parquet --master spark://10.0.0.5:7077

The executors need pyspark's Python side, pandas, pyarrow, numpy, `tokenizers` and `tensorflow` (no
bgem3_embeddings, no bgem3_qdrant, no torch), and the export folder at the same path (a shared file system,
or ship it with --files / spark.files). Each Python worker loads the SavedModel and the tokenizer once and
gets the rows as Arrow batches; the output has the input's columns plus (docs/spark.md, Parquet schema):

    dense           array<float>          the CLS vector, L2-normalised
    sparse_indices  array<int>            token ids with a lexical weight > 0 (each once, its largest)
    sparse_values   array<float>          their weights
    colbert         array<array<float>>   one L2-normalised row per token after <s>

which is what FlagEmbedding's BGEM3FlagModel.encode returns (dense_vecs, lexical_weights, colbert_vecs).
--input: JSON lines with a "text" field (--text-field), or Parquet (a .parquet path).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from typing import Any

OUTPUT_DDL = (
    "dense array<float>, sparse_indices array<int>, sparse_values array<float>, colbert array<array<float>>"
)
PAD_ID = 1  # XLM-RoBERTa's <pad>; export_manifest.json lists the special ids
SPECIAL_IDS = (0, 1, 2, 3)  # <s> <pad> </s> <unk>: no lexical weight (FlagEmbedding drops them)

# Per Python worker: the export folder's model and tokenizer. This file is shipped to the executors as a
# module (addPyFile) and the function below pickled by reference to it, so the cache lives as long as
# Spark reuses the worker (a function of a __main__ script would be pickled with a fresh copy each task).
_LOADED: dict[str, Any] = {}


def _load(export: str, max_length: int) -> tuple[Any, Any]:
    if export not in _LOADED:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(os.path.join(export, "tokenizer", "tokenizer.json"))
        tokenizer.enable_truncation(max_length)
        tokenizer.no_padding()
        _LOADED[export] = (tf.saved_model.load(export).signatures["serving_default"], tokenizer)
    loaded: tuple[Any, Any] = _LOADED[export]
    return loaded


def encode_batches(frames: Iterator[Any], export: str, text_field: str, max_length: int) -> Iterator[Any]:
    """mapInPandas function: each Arrow batch of texts with the four output columns added."""
    import numpy as np
    import tensorflow as tf

    fn, tokenizer = _load(export, max_length)
    for frame in frames:
        ids = [e.ids for e in tokenizer.encode_batch([str(t) for t in frame[text_field]])]
        width = max((len(row) for row in ids), default=0)
        batch = np.full((len(ids), width), PAD_ID, np.int32)
        mask = np.zeros((len(ids), width), np.int32)
        for i, row in enumerate(ids):
            batch[i, : len(row)], mask[i, : len(row)] = row, 1
        dense, indices, values, colbert = [], [], [], []
        if ids:
            out = fn(input_ids=tf.constant(batch), attention_mask=tf.constant(mask))
            d, sw, cv = (out[k].numpy() for k in ("dense_vecs", "sparse_weights", "colbert_vecs"))
        for i, row in enumerate(ids):
            weights = sw[i]
            lexical: dict[int, float] = {}
            for token, w in zip(row, weights[: len(row)], strict=True):
                if w > 0 and token not in SPECIAL_IDS:
                    lexical[token] = max(lexical.get(token, 0.0), float(w))
            dense.append(d[i])
            indices.append(np.asarray(list(lexical), np.int32))
            values.append(np.asarray(list(lexical.values()), np.float32))
            colbert.append(list(cv[i, : len(row) - 1]))
        yield frame.assign(dense=dense, sparse_indices=indices, sparse_values=values, colbert=colbert)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--export", required=True, help="a `bgem3 export --format saved_model` folder")
    parser.add_argument("--input", required=True, help="JSON lines with a text field, or .parquet")
    parser.add_argument("--output", required=True, help="Parquet folder to write (must not exist)")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--max-length", type=int, default=8192, help="tokens per text, <s> and </s> included")
    parser.add_argument("--batch-size", type=int, default=16, help="texts per model call (Arrow batch)")
    args = parser.parse_args(argv)
    export = os.path.abspath(args.export)
    if not os.path.isfile(os.path.join(export, "saved_model.pb")):
        print(f"error: {export} is not a SavedModel (bgem3 export --format saved_model)", file=sys.stderr)
        return 1

    from functools import partial

    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # the workers' Python: this one by default
    builder = SparkSession.builder.master(args.master).appName("bge-m3 savedmodel")
    if args.master.startswith("local") or "127.0.0.1" in args.master or "localhost" in args.master:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # stay on loopback
        for key in ("spark.driver.host", "spark.driver.bindAddress"):
            builder = builder.config(key, "127.0.0.1")
    spark = (
        builder.config("spark.sql.execution.arrow.maxRecordsPerBatch", str(args.batch_size))
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        reader = spark.read.parquet if args.input.endswith(".parquet") else spark.read.json
        df = reader(os.path.abspath(args.input))
        added = StructType.fromDDL(OUTPUT_DDL)
        assert isinstance(added, StructType)
        schema = StructType(df.schema.fields + added.fields)
        spark.sparkContext.addPyFile(os.path.abspath(__file__))
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bgem3_savedmodel_job as job  # this file as a module the executors import too

        encode = partial(
            job.encode_batches, export=export, text_field=args.text_field, max_length=args.max_length
        )
        df.mapInPandas(encode, schema).write.parquet(os.path.abspath(args.output))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
