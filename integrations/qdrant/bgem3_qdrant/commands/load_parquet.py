"""`bgem3-qdrant load-parquet`: encoded chunks from Parquet (a Spark or JVM job's output) into Qdrant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .common import (
    CollectionOpt,
    EngineOpt,
    KeyOpt,
    ModelOpt,
    PathOpt,
    UrlOpt,
    VerboseOpt,
    checked_engine,
    fail,
    setup_logging,
)


def load_parquet(
    parquet: Annotated[Path, typer.Argument(help="A Parquet file or a folder of part files.")],
    collection: CollectionOpt = "documents",
    model: ModelOpt = "BAAI/bge-m3",
    path: PathOpt = "./qdrant_data",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    store_engine: EngineOpt = "edge",
    batch_size: Annotated[int, typer.Option(help="Rows per upsert.")] = 256,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Store encoded chunks from Parquet (docs/spark.md) as `ingest` stores them: same ids, no encoder;
    chunks already stored are skipped. --model names the model they were encoded with."""
    setup_logging(verbose)
    from bgem3_embeddings.cli_support import check_inputs

    from ..ingest.options import IngestOptions, new_collection_storage
    from ..ingest.parquet import ParquetError, _Model, count_rows, load_parquet
    from ..schema import CollectionSchema
    from ..stores.open import open_store, resolve_target

    if not parquet.exists():
        raise fail(ParquetError(f"no Parquet at {parquet}"))
    try:
        target = resolve_target(path=path, url=url, api_key=api_key, engine=checked_engine(store_engine))
    except ValueError as e:
        raise fail(e) from e
    check_inputs(model, [])
    rows = count_rows(parquet)
    store = open_store(target)
    try:
        options = IngestOptions(batch_size=batch_size, show_progress=False)
        schema = None
        if not store.collection_exists(collection):
            storage, _ = new_collection_storage(expected_chunks=rows)
            options.colbert_pooling = storage.pooling
            schema = CollectionSchema(
                size=_Model(model).hidden_size,
                colbert_dtype=storage.dtype,  # type: ignore[arg-type]
                colbert_quantization=storage.quantization,  # type: ignore[arg-type]
                colbert_copy_on_disk=storage.copy_on_disk,
            )
        summary = load_parquet(store, collection, parquet, model, schema=schema, options=options)
    finally:
        store.close()
    if json_out:
        typer.echo(json.dumps({**summary.__dict__, "tokens_per_second": summary.tokens_per_second}))
    else:
        typer.echo(f"{collection!r} ({target.describe()}): {summary.format()}")
