"""Opening Qdrant: the embedded store (local mode at a path) by default, a server when a URL is given."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from qdrant_client import QdrantClient

from .errors import StoreUnavailableError
from .retry import call_with_retries

logger = logging.getLogger(__name__)

DEFAULT_PATH = "./qdrant_data"


@dataclass(frozen=True)
class StoreTarget:
    """Where the data lives: `url` (a server) wins over `path` (the embedded store)."""

    path: str = DEFAULT_PATH
    url: str | None = None
    api_key: str | None = None
    timeout: int = 120
    prefer_grpc: bool = False

    @property
    def is_local(self) -> bool:
        return self.url is None

    def describe(self) -> str:
        return self.url if self.url else f"embedded store at {self.path}"


def resolve_target(
    path: str | None = None,
    url: str | None = None,
    api_key: str | None = None,
    timeout: int = 120,
    prefer_grpc: bool = False,
) -> StoreTarget:
    """Explicit arguments first, then QDRANT_URL / QDRANT_API_KEY, then the embedded store."""
    url = url or os.environ.get("QDRANT_URL") or None
    api_key = api_key or os.environ.get("QDRANT_API_KEY") or None
    return StoreTarget(
        path=path or DEFAULT_PATH, url=url, api_key=api_key, timeout=timeout, prefer_grpc=prefer_grpc
    )


def open_client(target: StoreTarget) -> QdrantClient:
    """A connected client. Raises StoreUnavailableError with a clear message when it cannot be used."""
    if target.is_local:
        try:
            # One thread (the store's writer) uses the client at a time, but not always the thread
            # that opened it: sqlite's same-thread check would refuse that.
            if target.path == ":memory:":
                return QdrantClient(location=":memory:", force_disable_check_same_thread=True)
            return QdrantClient(path=target.path, force_disable_check_same_thread=True)
        except RuntimeError as e:
            if "already accessed" in str(e):
                raise StoreUnavailableError(
                    f"the embedded store at {target.path} is open in another process; only one process "
                    "at a time can use it. Close the other one, or run a Qdrant server and pass --url."
                ) from e
            raise
    client = QdrantClient(
        url=target.url,
        api_key=target.api_key,
        timeout=target.timeout,
        prefer_grpc=target.prefer_grpc,
        check_compatibility=False,
    )
    try:
        call_with_retries(client.get_collections, attempts=3, base_delay=0.5, what="connect")
    except Exception as e:
        client.close()
        raise StoreUnavailableError(
            f"cannot reach Qdrant at {target.url}: {e}. Check --url / QDRANT_URL (and QDRANT_API_KEY) "
            "and that the server is running; nothing was written."
        ) from e
    return client


def is_local_client(client: QdrantClient) -> bool:
    """True for qdrant-client's local mode (a path or ":memory:"), which runs in this process."""
    opts = client.init_options
    return opts.get("path") is not None or opts.get("location") == ":memory:"


def tune_local_storage(client: QdrantClient, collection: str) -> bool:
    """Switch the embedded store's sqlite file for `collection` to WAL with synchronous=NORMAL.

    Local mode commits every point separately; with the default journal each commit waits for an
    fsync (about 20 ms on this project's test machines), which made storing slower than encoding with
    small models. In WAL mode with synchronous=NORMAL a commit survives the process being killed; only
    an OS crash or power loss can drop the last commits, and a re-run re-encodes exactly those.
    This reaches into qdrant-client's local-mode internals, so any failure just keeps the defaults.
    """
    if not is_local_client(client):
        return False
    try:
        storage = client._client.collections[collection].storage  # type: ignore[attr-defined]
        if storage is None:  # ":memory:" has no file
            return False
        con = storage.storage
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")
        return True
    except Exception as e:  # internals differ across qdrant-client versions
        logger.debug("could not tune local storage of %s: %s", collection, e)
        return False
