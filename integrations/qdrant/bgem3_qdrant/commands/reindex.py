"""`bgem3-qdrant reindex -c OLD --model DIR --into NEW`: a collection re-encoded by another model."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from bgem3_embeddings.cli_support import check_inputs

from .common import (
    CollectionOpt,
    DeviceOpt,
    EngineOpt,
    KeyOpt,
    ModelOpt,
    PathOpt,
    PrecisionOpt,
    ProgressOpt,
    UrlOpt,
    VerboseOpt,
    setup_logging,
    store_target,
)


def reindex(
    into: Annotated[
        str, typer.Option("--into", help="The new collection (created; the old one is only read).")
    ],
    model: ModelOpt = "BAAI/bge-m3",
    collection: CollectionOpt = "documents",
    path: PathOpt = "./qdrant_data",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    store_engine: EngineOpt = "edge",
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue an interrupted reindex into --into (it exists).")
    ] = False,
    batch_size: Annotated[int, typer.Option(min=1, help="Chunks per encode + upsert batch.")] = 32,
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
    progress: ProgressOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Re-encode a collection's stored texts with another model (e.g. a fine-tuned one of the same
    tokenizer) into a new collection: same ids, payloads and storage; no source files needed."""
    setup_logging(verbose)
    from ..encoder import load_encoder
    from ..stores.open import open_store
    from ..tuning.reindex import check_model, check_reindex, reindex_collection

    target = store_target(path, url, api_key, store_engine)
    check_inputs(model)  # the checkpoint's files, before the store opens
    with open_store(target) as store:
        # Everything that needs no weights first: a bad --into, a missing collection, another tokenizer
        # (each a one-line BGEM3QdrantError, which run_cli prints).
        check_reindex(store, collection, into, resume=resume)
        check_model(store, collection, model)
        encoder = load_encoder(model, precision=precision, device=device)
        summary = reindex_collection(
            store, collection, encoder, into, model_id=model, resume=resume, batch_size=batch_size,
            show_progress=progress,
        )  # fmt: skip
    if json_out:
        typer.echo(json.dumps({**summary.__dict__}))
    else:
        typer.echo(summary.format())
