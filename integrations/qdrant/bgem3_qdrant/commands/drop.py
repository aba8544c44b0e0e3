"""`bgem3-qdrant drop -c NAME`: delete a collection and every point of it, after asking (or --yes)."""

from __future__ import annotations

from typing import Annotated

import click
import typer

from ..errors import BGEM3QdrantError
from .common import (
    EngineOpt,
    KeyOpt,
    PathOpt,
    UrlOpt,
    VerboseOpt,
    fail,
    setup_logging,
    store_target,
)


def drop(
    collection: Annotated[
        str,
        typer.Option("--collection", "-c", envvar="BGEM3_QDRANT_COLLECTION", help="Collection to delete.",
                     show_default=False),
    ],
    path: PathOpt = "./qdrant_data",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    store_engine: EngineOpt = "edge",
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete without asking.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Delete a collection (its points, vectors and model record); asks first unless --yes."""
    setup_logging(verbose)
    from ..inventory import describe_collection
    from ..stores.open import open_store
    from ..wording import counted

    target = store_target(path, url, api_key, store_engine)
    # Opening it takes the store's lock: a store another process holds is refused here, in one line.
    with open_store(target) as store:
        if not store.collection_exists(collection):
            raise fail(store.missing(collection))
        info = describe_collection(store, collection)
        what = repr(collection)
        if info["problem"] is None:
            what += f" ({counted(info['chunks'], 'chunk')})"
        where = store.describe()
        if not yes:
            try:
                sure = typer.confirm(f"delete collection {what} of the {where}?", default=False, err=True)
            except (click.exceptions.Abort, typer.Abort):  # no answer (stdin closed): never delete on a guess
                raise fail(
                    BGEM3QdrantError(f"drop asks before it deletes {what}: answer y, or pass --yes")
                ) from None
            if not sure:  # a declined prompt is the user's answer, not a failure
                typer.echo(f"kept {collection!r}: nothing was deleted")
                return
        store.delete_collection(collection)
    typer.echo(f"deleted collection {what} of the {where}")
