"""Opening a store: Qdrant Edge at a path by default, a server when a URL is given, local mode on request."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from qdrant_client import QdrantClient

from .errors import BGEM3QdrantError, StoreUnavailableError
from .retry import call_with_retries
from .stores.base import BGEM3Store

StoreEngine = Literal["edge", "local"]
STORE_ENGINES: tuple[str, ...] = ("edge", "local")

logger = logging.getLogger(__name__)

DEFAULT_PATH = "./qdrant_data"


@dataclass(frozen=True)
class StoreTarget:
    """Where the data lives: `url` (a server) wins over `path` (the embedded store).

    `engine` picks the embedded engine for a path: "edge" (Qdrant Edge, the default) or "local"
    (qdrant-client's local mode, for stores of earlier releases and comparisons).
    """

    path: str = DEFAULT_PATH
    url: str | None = None
    api_key: str | None = None
    timeout: int = 120
    prefer_grpc: bool = False
    engine: StoreEngine = "edge"

    @property
    def is_local(self) -> bool:
        return self.url is None

    def describe(self) -> str:
        if self.url:
            return self.url
        return f"{'Qdrant Edge' if self.engine == 'edge' else 'local-mode'} store at {self.path}"


def resolve_target(
    path: str | None = None,
    url: str | None = None,
    api_key: str | None = None,
    timeout: int = 120,
    prefer_grpc: bool = False,
    engine: StoreEngine = "edge",
) -> StoreTarget:
    """Explicit arguments first, then QDRANT_URL / QDRANT_API_KEY, then the embedded store."""
    url = url or os.environ.get("QDRANT_URL") or None
    api_key = api_key or os.environ.get("QDRANT_API_KEY") or None
    if engine not in STORE_ENGINES:
        raise ValueError(f"store engine must be edge or local, not {engine!r}")
    return StoreTarget(
        path=path or DEFAULT_PATH,
        url=url,
        api_key=api_key,
        timeout=timeout,
        prefer_grpc=prefer_grpc,
        engine=engine,
    )


def open_client(target: StoreTarget) -> BGEM3Store:
    """The store at `target` (a BGEM3Store): Qdrant Edge for a path, qdrant-client for a URL.

    Raises StoreUnavailableError with a clear message when it cannot be used (server unreachable,
    store open in another process), LegacyStoreError for a local-mode store that needs migrating.
    """
    from .stores.client_store import ClientStore

    if target.is_local and target.engine == "edge" and target.path != ":memory:":
        from .stores.edge import EdgeStore

        return EdgeStore(target.path)
    return ClientStore(open_qdrant_client(target), description=target.describe())


def open_qdrant_client(target: StoreTarget) -> QdrantClient:
    """A connected QdrantClient (server, or local mode for a path / ":memory:")."""
    if target.is_local:
        from .stores.layout import busy_message, detect

        if target.path != ":memory:" and detect(target.path) == "edge":
            raise BGEM3QdrantError(
                f"{target.path} is a Qdrant Edge store; open it with the default engine "
                "(without --store-engine local)"
            )
        try:
            # One thread (the store's writer) uses the client at a time, but not always the thread
            # that opened it: sqlite's same-thread check would refuse that.
            if target.path == ":memory:":
                return QdrantClient(location=":memory:", force_disable_check_same_thread=True)
            return QdrantClient(path=target.path, force_disable_check_same_thread=True)
        except RuntimeError as e:
            if "already accessed" in str(e):
                raise StoreUnavailableError(busy_message(Path(target.path))) from e
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
