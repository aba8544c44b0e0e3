"""`bgem3-qdrant collections`: the collections of a store, with their chunks, model and storage."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from .common import EngineOpt, KeyOpt, PathOpt, UrlOpt, VerboseOpt, setup_logging, store_target


def collections(
    path: PathOpt = "./qdrant_data",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    store_engine: EngineOpt = "edge",
    json_out: Annotated[
        bool,
        typer.Option("--json", help='One JSON object: {"store", "collections": [...]} (the MCP tool\'s).'),
    ] = False,
    verbose: VerboseOpt = False,
) -> None:
    """List the store's collections: chunks, the model that wrote each, ColBERT storage, size on disk."""
    setup_logging(verbose)
    from ..inventory import describe_store
    from ..stores.open import open_store

    target = store_target(path, url, api_key, store_engine)
    with open_store(target) as store:
        where = store.describe()
        found = describe_store(store)
    if json_out:
        typer.echo(json.dumps({"store": where, "collections": found}, ensure_ascii=False))
        return
    if not found:
        typer.echo(f"the {where} holds no collection yet; `bgem3-qdrant ingest PATH -c NAME` creates one")
        return
    from ..wording import counted

    typer.echo(f"{where}: {counted(len(found), 'collection')}")
    for c in found:
        typer.echo(describe_line(c))


def describe_line(c: dict[str, Any]) -> str:
    """`kb: 79 chunks, model BAAI/bge-m3 (float32), ColBERT float16, unpooled, no copy in RAM, 3.1 MiB`."""
    from ..wording import counted, size_in_bytes

    if c["problem"] is not None:
        return f"  {c['name']}: cannot be read: {c['problem']}"
    model = c["model"] or "model not recorded"
    precision = f" ({c['precision']})" if c["precision"] else ""
    disk = f", {size_in_bytes(c['disk_bytes'])} on disk" if c["disk_bytes"] is not None else ""
    keys = f"; metadata keys: {', '.join(c['metadata_keys'])}" if c["metadata_keys"] else ""
    chunks = counted(c["chunks"], "chunk")
    return f"  {c['name']}: {chunks}, model {model}{precision}, ColBERT {c['storage']}{disk}{keys}"
