"""Exceptions with messages meant to be shown to a user as they are."""

from __future__ import annotations


class BGEM3QdrantError(Exception):
    """Base class: every error this package raises on purpose."""


class SchemaMismatchError(BGEM3QdrantError):
    """An existing collection does not have the vectors this package writes (nothing was changed)."""


class CollectionNotFoundError(BGEM3QdrantError):
    """Searching a collection that does not exist."""


class StoreUnavailableError(BGEM3QdrantError):
    """The Qdrant server cannot be reached, or the embedded store is locked by another process."""


class SourceError(BGEM3QdrantError):
    """A bad input file or record; the message names the file (and line for JSONL)."""

    def __init__(self, path: str, message: str, line: int | None = None) -> None:
        self.path = path
        self.line = line
        self.reason = message
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")
