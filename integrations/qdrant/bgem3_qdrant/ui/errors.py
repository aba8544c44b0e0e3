"""The page API's expected failures: one line for the person, and the HTTP status that goes with it."""

from __future__ import annotations

from bgem3_embeddings.cli_support import CommandError

from ..errors import (
    BGEM3QdrantError,
    CollectionNotFoundError,
    SchemaMismatchError,
    StoreDamagedError,
    StoreUnavailableError,
)
from ..identity import ModelMismatchError

# The option that sets the page's API key (`--api-key` is the Qdrant server's in bgem3-qdrant).
UI_KEY_OPTION = "--ui-api-key"
# The Host names the page is served under besides this machine's (http_guard's DNS-rebinding check).
UI_HOSTS_ENV = "BGEM3_UI_ALLOWED_HOSTS"
UI_HOSTS_OPTION = f"--allowed-host NAME (or {UI_HOSTS_ENV})"

class PageError(BGEM3QdrantError):
    """A request the page API refuses: `status` (4xx) and a message that says what to change."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# Most specific first: ModelMismatchError and the others are BGEM3QdrantErrors too.
_STATUS: tuple[tuple[type[Exception], int], ...] = (
    (CollectionNotFoundError, 404),
    (ModelMismatchError, 409),
    (SchemaMismatchError, 409),
    (StoreUnavailableError, 409),  # another process holds the store: the next request tries again
    (StoreDamagedError, 409),
    (BGEM3QdrantError, 400),
    (CommandError, 502),  # the encoder server (--encoder-url) refused or could not be reached
)


def status_of(err: Exception) -> int | None:
    """The status an expected failure is answered with; None for anything else (a bug: 500)."""
    if isinstance(err, PageError):
        return err.status
    for kind, status in _STATUS:
        if isinstance(err, kind):
            return status
    return None


def one_line(message: str) -> str:
    """A message as one line (the page shows it in a banner; the API sends it as is)."""
    return " ".join(message.split())
