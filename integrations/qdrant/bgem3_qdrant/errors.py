"""Exceptions with messages meant to be shown to a user as they are, and the messages said in several places.

Every message a user reads more than once (a missing collection, a busy store, a store of an earlier
release) is built here, so a change of wording happens in one place.
"""

from __future__ import annotations

import os


class BGEM3QdrantError(Exception):
    """Base class: every error this package raises on purpose."""


class SchemaMismatchError(BGEM3QdrantError):
    """An existing collection does not have the vectors this package writes (nothing was changed)."""


class CollectionNotFoundError(BGEM3QdrantError):
    """Searching a collection that does not exist (`existing`: the collections that do, when known)."""

    def __init__(self, name: str, where: str | None = None, existing: list[str] | None = None) -> None:
        self.name = name
        self.existing = existing
        super().__init__(collection_missing_message(name, where, existing))


class StoreUnavailableError(BGEM3QdrantError):
    """The Qdrant server cannot be reached, or the embedded store is locked by another process."""


class StoreDamagedError(BGEM3QdrantError):
    """The engine failed reading or writing a collection's files (an error or a Rust panic)."""

    def __init__(self, collection: str, where: str, cause: str, check_command: str) -> None:
        self.collection = collection
        self.cause = cause
        super().__init__(store_damaged_message(collection, where, cause, check_command))


class LegacyStoreError(BGEM3QdrantError):
    """The folder holds a store written by qdrant-client's local mode (an earlier layout)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        super().__init__(
            f"{path} holds a store written by qdrant-client's local mode; the embedded engine is now "
            f"Qdrant Edge. Run `bgem3-qdrant migrate {path}` once (the old files are kept as a backup), "
            "or open it as it is with --store-engine local."
        )


class SourceError(BGEM3QdrantError):
    """A bad input file or record; the message names the file (and line for JSONL), then the way out
    (`way_out`: the option that goes past it, when one does)."""

    def __init__(self, path: str, message: str, line: int | None = None, way_out: str | None = None) -> None:
        self.path = path
        self.line = line
        self.reason = message
        self.way_out = way_out
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}" + (f"; {way_out}" if way_out else ""))


def collection_missing_message(name: str, where: str | None = None, existing: list[str] | None = None) -> str:
    """`collection 'kb' does not exist [in WHERE][, which holds 'a', 'b']; ...` (search, the retrievers, the
    CLI): the collections that exist are named, so that a typo is seen as one."""
    place = f" in {where}" if where else ""
    create = f"create it with `bgem3-qdrant ingest PATH --collection {name}`"
    if existing is None:
        return f"collection {name!r} does not exist{place}; {create}"
    if not existing:
        return f"collection {name!r} does not exist{place}, which holds no collection yet; {create}"
    held = ", ".join(map(repr, existing))
    return f"collection {name!r} does not exist{place}, which holds {held}; use one of them (-c), or {create}"


def store_busy_message(path: str | os.PathLike[str]) -> str:
    """The one line for an embedded store that another process holds open."""
    return (
        f"the store at {path} is open in another process; only one process at a time can open an "
        "embedded store. Close the other one, or run a Qdrant server and pass --url."
    )


def store_damaged_message(collection: str, where: str, cause: str, check_command: str) -> str:
    """The one line for a collection whose files the engine cannot read (open, search, ingest, check)."""
    return (
        f"collection {collection!r} of the {where} is damaged ({cause}); run `{check_command}` to find "
        f"the damaged points, then `{check_command} --repair`"
    )


def check_command(collection: str, store_option: str) -> str:
    """`bgem3-qdrant check -c NAME --path P` (or --url U): the command that examines a collection."""
    return f"bgem3-qdrant check -c {collection} {store_option}"
