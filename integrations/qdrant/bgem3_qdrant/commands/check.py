"""`bgem3-qdrant check`: verify every point of a collection; --repair replaces the damaged ones."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import BGEM3QdrantError
from .common import (
    CollectionOpt,
    DeviceOpt,
    EngineOpt,
    KeyOpt,
    PathOpt,
    PrecisionOpt,
    ProgressOpt,
    UrlOpt,
    VerboseOpt,
    checked_engine,
    fail,
    setup_logging,
)

# `check` exits with this when it found damage (and did not repair all of it); 1 is an error.
EXIT_DAMAGED = 3


def check(
    collection: CollectionOpt = "documents",
    path: PathOpt = "./qdrant_data",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    store_engine: EngineOpt = "edge",
    repair: Annotated[
        bool,
        typer.Option(
            "--repair", help="Replace damaged points: re-encode their recorded text, re-read their sources."
        ),
    ] = False,
    model: Annotated[
        str | None,
        typer.Option(
            "--model", "-m", envvar="BGEM3_MODEL", help="Model for --repair (default: the one recorded)."
        ),
    ] = None,
    chunk_size: Annotated[int, typer.Option(help="--repair: tokens per chunk of re-read sources.")] = 512,
    chunk_overlap: Annotated[int, typer.Option(help="--repair: overlap of re-read sources.")] = 64,
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
    progress: ProgressOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Verify every point of a collection (vectors, norms, row counts, payload, count); exit 3 on damage.

    --repair replaces the damaged points and checks again.
    """
    setup_logging(verbose)
    from ..errors import StoreDamagedError
    from ..stores.open import open_store, resolve_target

    try:
        target = resolve_target(path=path, url=url, api_key=api_key, engine=checked_engine(store_engine))
    except ValueError as e:
        raise fail(e) from e
    if not target.is_server and target.engine == "edge" and not Path(path).exists():
        raise fail(BGEM3QdrantError(f"no store at {path} (--path): give the folder of an existing store"))
    store = open_store(target)
    try:
        if not store.collection_exists(collection):
            raise fail(store.missing(collection))
        try:
            store.probe(collection)  # an engine abort ends a child process, not this one
            report = _checked(store, collection, progress)
            repaired = None
            if repair and not report.ok:
                repaired = _repair(store, collection, report, model, precision, device, chunk_size,
                                   chunk_overlap, progress)
                report = _checked(store, collection, progress)
        except StoreDamagedError as e:
            raise fail(
                BGEM3QdrantError(
                    f"collection {collection!r} of the {store.describe()} cannot be read at all ({e.cause}); "
                    "check cannot tell its points apart: re-ingest its documents into a new collection "
                    "(--collection) or a new store (--path)"
                )
            ) from e
    finally:
        store.close()
    if json_out:
        out = report.to_dict()
        if repaired is not None:
            out["repair"] = repaired.__dict__
        typer.echo(json.dumps(out))
    else:
        if repaired is not None:
            typer.echo(repaired.format())
        typer.echo(report.format())
        if not report.ok and not repair:
            typer.echo("to replace the damaged points, run the same command with --repair")
    if not report.ok or (repaired is not None and not repaired.complete):
        raise typer.Exit(EXIT_DAMAGED)


def _checked(store: Any, collection: str, progress: bool | None) -> Any:
    """check_collection with a progress bar over the engine's count."""
    from tqdm.auto import tqdm

    from ..check import check_collection

    show = progress if progress is not None else sys.stderr.isatty()
    with tqdm(total=store.count(collection), desc="check", unit="point", disable=not show) as bar:
        return check_collection(store, collection, progress=bar.update)


def _repair(
    store: Any,
    collection: str,
    report: Any,
    model: str | None,
    precision: str,
    device: str,
    chunk_size: int,
    chunk_overlap: int,
    progress: bool | None,
) -> Any:
    from ..chunking import check_sizes
    from ..encoder import load_encoder
    from ..ingest import IngestOptions
    from ..repair import repair_collection

    name = model or (report.identity.model if report.identity else None)
    if not name:
        raise fail(
            BGEM3QdrantError(
                f"collection {collection!r} records no model (--model): give the model that wrote it"
            )
        )
    try:
        check_sizes(chunk_size, chunk_overlap)
    except ValueError as e:
        raise fail(e) from e
    encoder = load_encoder(name, precision=precision, device=device)
    opts = IngestOptions(chunk_size=chunk_size, chunk_overlap=chunk_overlap, show_progress=progress)
    return repair_collection(store, collection, report, encoder, options=opts)
