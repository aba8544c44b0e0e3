"""`bgem3-qdrant ingest`: chunk, encode and store documents."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from bgem3_embeddings.cli_support import check_inputs

from ..ingest.options import ENGINES
from ..schema import COLBERT_DTYPES, COLBERT_QUANTIZATIONS, SPARSE_MODIFIERS, check_choice
from .common import (
    CollectionOpt,
    DeviceOpt,
    EncoderKeyOpt,
    EncoderUrlOpt,
    EngineOpt,
    KeyOpt,
    ModelOpt,
    PathOpt,
    PoolingOpt,
    PrecisionOpt,
    ProgressOpt,
    UrlOpt,
    VerboseOpt,
    checked_engine,
    fail,
    setup_logging,
)


def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Files (.txt, .md, .jsonl) and directories.")],
    collection: CollectionOpt = "documents",
    model: ModelOpt = "BAAI/bge-m3",
    path: PathOpt = "./qdrant_data",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    store_engine: EngineOpt = "edge",
    include: Annotated[
        list[str] | None,
        typer.Option(
            "--glob", "-g", help="File globs inside directories (repeatable; default *.txt *.md *.jsonl)."
        ),
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", help="Globs to leave out (repeatable).")
    ] = None,
    chunk_size: Annotated[int, typer.Option(help="Tokens per chunk (special tokens excluded).")] = 512,
    chunk_overlap: Annotated[int, typer.Option(help="Tokens shared by consecutive chunks.")] = 64,
    batch_size: Annotated[int, typer.Option(help="Chunks per encode + upsert batch.")] = 32,
    skip_invalid: Annotated[
        bool,
        typer.Option(
            "--skip-invalid",
            help="Skip malformed JSONL lines and unreadable files (reported) instead of stopping.",
        ),
    ] = False,
    prune: Annotated[
        bool, typer.Option(help="Remove stored chunks of re-ingested documents that changed.")
    ] = True,
    encoding: Annotated[str, typer.Option(help="Text encoding of the input files.")] = "utf-8",
    text_field: Annotated[str, typer.Option(help="JSONL field holding the text.")] = "text",
    sparse_modifier: Annotated[str, typer.Option(help="none (reference lexical score) or idf.")] = "none",
    colbert_dtype: Annotated[
        str | None,
        typer.Option(
            help="ColBERT rows of a new collection: float32 (exact), float16, uint8 (8-bit) or turbo4 "
            "(4-bit). Default: the recommended storage (docs/qdrant.md).",
            show_default=False,
        ),
    ] = None,
    colbert_quantization: Annotated[
        str | None,
        typer.Option(
            help="A new collection's ColBERT copy kept in RAM: none, int8 or binary (reranks score it, "
            "then rescore the best on the rows on disk). Default: the recommended storage.",
            show_default=False,
        ),
    ] = None,
    colbert_copy_on_disk: Annotated[
        bool | None,
        typer.Option(
            "--colbert-copy-on-disk/--colbert-copy-in-ram",
            help="Where a new collection's ColBERT copy lives: on disk, read as reranks need it (opens at "
            "once), or in RAM, read at open (the first reranks read less). Default: the recommended storage.",
            show_default=False,
        ),
    ] = None,
    colbert_on_disk: Annotated[bool, typer.Option(help="Keep ColBERT vectors on disk.")] = True,
    dense_on_disk: Annotated[bool, typer.Option(help="Keep dense vectors on disk (server).")] = False,
    colbert_pooling: PoolingOpt = None,
    engine: Annotated[
        str,
        typer.Option(help="plain (this process), ray (Ray Data actor pool) or spark (Spark executors)."),
    ] = "plain",
    concurrency: Annotated[
        int | None,
        typer.Option(
            help="Ray: encoder actors (default 2). Spark: tasks at once (local[N]; on a cluster "
            "spark.cores.max; default all cores).",
            show_default=False,
        ),
    ] = None,
    writers: Annotated[int, typer.Option(help="Ray with a server: parallel writer actors.")] = 2,
    ray_address: Annotated[
        str | None, typer.Option(help="Ray: cluster address (default: start/attach locally).")
    ] = None,
    spark_master: Annotated[
        str | None,
        typer.Option(help="Spark: master URL, e.g. spark://host:7077 (default: local[*], this machine)."),
    ] = None,
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
    encoder_url: EncoderUrlOpt = None,
    encoder_api_key: EncoderKeyOpt = None,
    progress: ProgressOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Chunk, encode (dense + sparse + ColBERT) and store documents; re-runs skip unchanged chunks."""
    setup_logging(verbose)
    from ..chunking import check_sizes
    from ..encoder import connect_encoder, load_encoder
    from ..ingest import IngestOptions, Ingestor
    from ..ingest.options import (
        check_copy_on_disk,
        estimate_chunks,
        new_collection_storage,
        storage_message,
    )
    from ..pooling import check_pool_factor
    from ..schema import ColbertStorage, CollectionSchema
    from ..sources import DEFAULT_INCLUDE, expand_paths
    from ..stores.open import open_store, resolve_target

    try:
        check_choice("--engine", engine, ENGINES)
        if encoder_url and engine != "plain":
            raise ValueError("--encoder-url encodes through one server: use it with --engine plain")
        if spark_master and engine != "spark":
            raise ValueError("--spark-master names where Spark runs: use it with --engine spark")
        check_choice("--sparse-modifier", sparse_modifier, SPARSE_MODIFIERS)
        if colbert_dtype is not None:
            check_choice("--colbert-dtype", colbert_dtype, COLBERT_DTYPES)
        if colbert_quantization is not None:
            check_choice("--colbert-quantization", colbert_quantization, COLBERT_QUANTIZATIONS)
        check_copy_on_disk(colbert_quantization, colbert_copy_on_disk)  # before the store opens
        opts = IngestOptions(
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            batch_size=batch_size,
            skip_invalid=skip_invalid,
            prune=prune,
            show_progress=progress,
            colbert_pooling=None if colbert_pooling is None else check_pool_factor(colbert_pooling),
        )
        check_sizes(chunk_size, chunk_overlap)
        target = resolve_target(path=path, url=url, api_key=api_key, engine=checked_engine(store_engine))
    except ValueError as e:
        raise fail(e) from e
    # Before anything loads: every missing path at once, the checkpoint's files, the engine's packages,
    # then a file to read.
    check_inputs(None if encoder_url else model, [str(p) for p in paths])
    if engine == "ray":
        from ..ingest.ray import import_ray

        import_ray()
    if engine == "spark":
        from ..ingest.spark_session import check_master, find_java, import_pyspark

        import_pyspark()
        find_java()
        check_master(spark_master or "")
    notes: list[str] = []
    expand_paths(paths, include or DEFAULT_INCLUDE, exclude or (), notes)  # SourceError: nothing to read
    for note in notes:
        typer.echo(f"warning: {note}", err=True)
    store = open_store(target)
    try:
        # A new collection takes the recommended ColBERT storage for each option left out (and says so);
        # an existing one keeps its own (its dtype and copy are fixed, its pooling recorded). Decided
        # before the model loads, so a contradiction among the options is said at once.
        storage_note = None
        storage = ColbertStorage()
        if not store.collection_exists(collection):
            expected = estimate_chunks(paths, chunk_size)
            try:
                storage, defaulted = new_collection_storage(
                    colbert_dtype,
                    opts.colbert_pooling,
                    colbert_quantization,
                    colbert_copy_on_disk,
                    expected_chunks=expected,
                )
            except ValueError as e:
                raise fail(e) from e
            opts.colbert_pooling = storage.pooling
            storage_note = storage_message(collection, storage, defaulted, expected)
        encoder: Any
        if engine == "ray":
            from ..ingest.ray import RayEncoding

            encoder = RayEncoding(
                model,
                concurrency=2 if concurrency is None else concurrency,
                writers=writers,
                target=target,
                ray_address=ray_address,
                encoder_kwargs={"precision": precision, "device": device},
            )
        elif engine == "spark":
            from ..ingest.spark import SparkEncoding

            encoder = SparkEncoding(
                model,
                master=spark_master,
                concurrency=concurrency,
                encoder_kwargs={"precision": precision, "device": device},
            )
        elif encoder_url:
            encoder = connect_encoder(encoder_url, encoder_api_key)
            model = encoder.model_id  # the server's model is the one recorded with the points
        else:
            encoder = load_encoder(model, precision=precision, device=device)
        schema = CollectionSchema(
            size=int(encoder.hidden_size),
            sparse_modifier=sparse_modifier,  # type: ignore[arg-type]
            colbert_on_disk=colbert_on_disk,
            dense_on_disk=dense_on_disk,
            colbert_dtype=storage.dtype,  # type: ignore[arg-type]
            colbert_quantization=storage.quantization,  # type: ignore[arg-type]
            colbert_copy_on_disk=storage.copy_on_disk,
        )
        ing = Ingestor(store, collection, encoder, schema=schema, options=opts, model_id=model)
        # A log line (shown with -v), so that an expected failure stays the only line on stderr.
        log = logging.getLogger(__name__)
        log.info("ingesting into %r (%s) with %s", collection, target.describe(), model)
        summary = ing.ingest_paths(
            paths,
            include=include or DEFAULT_INCLUDE,
            exclude=exclude or (),
            encoding=encoding,
            text_field=text_field,
        )
        created = store.collection_exists(collection)
    finally:
        store.close()
    if not created:  # every file read held nothing to store (empty, or skipped as invalid)
        for msg in summary.invalid:
            typer.echo(f"skipped: {msg}", err=True)
        why = f"nothing to store: {nothing_stored(summary)}; collection {collection!r} was not created"
        raise fail(ValueError(why))
    if json_out:
        extra = {"colbert_storage": storage_note} if storage_note else {}
        typer.echo(json.dumps({**summary.__dict__, "tokens_per_second": summary.tokens_per_second, **extra}))
    else:
        if storage_note:
            typer.echo(storage_note)
        for msg in summary.invalid:
            typer.echo(f"skipped: {msg}", err=True)
        typer.echo(f"{collection!r} ({target.describe()}): {summary.format()}")


def nothing_stored(summary: Any) -> str:
    """`1 file read, 2 documents: 2 empty` (what an ingest that stored nothing read)."""
    from ..wording import counted

    skipped = [f"{summary.empty} empty"] if summary.empty else []
    skipped += [f"{len(summary.invalid)} invalid (skipped)"] if summary.invalid else []
    read = f"{counted(summary.files, 'file')} read, {counted(summary.documents, 'document')}"
    return read + (f": {', '.join(skipped)}" if skipped else "")
