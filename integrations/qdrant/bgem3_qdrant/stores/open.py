"""Opening a store: Qdrant Edge at a path by default, a server when a URL is given, local mode on request.

`open_store(target)` is the one way in; `as_store(obj)` also accepts a `QdrantClient` someone opened.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from ..errors import BGEM3QdrantError, StoreUnavailableError, store_busy_message
from ..retry import call_with_retries
from ..schema import check_choice
from .base import BGEM3Store
from .edge import EdgeStore
from .layout import detect

if TYPE_CHECKING:
    from qdrant_client import QdrantClient

# The engine for a folder store: Qdrant Edge (the default) or qdrant-client's local mode (an older layout).
StoreEngine = Literal["edge", "local"]
STORE_ENGINES: tuple[str, ...] = get_args(StoreEngine)
DEFAULT_PATH = "./qdrant_data"

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreTarget:
    """Where the data lives: `url` (a server) wins over `path` (a folder store in this process).

    `engine` picks the engine for a folder: "edge" (Qdrant Edge, the default) or "local"
    (qdrant-client's local mode, for stores of the older layout and comparisons).
    """

    path: str = DEFAULT_PATH
    url: str | None = None
    api_key: str | None = None
    timeout: int = 120
    prefer_grpc: bool = False
    engine: StoreEngine = "edge"

    @property
    def is_server(self) -> bool:
        """True when the data lives in a Qdrant server (several processes may write)."""
        return self.url is not None

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
    """Explicit arguments first, then QDRANT_URL / QDRANT_API_KEY, then the folder store."""
    url = url or os.environ.get("QDRANT_URL") or None
    api_key = api_key or os.environ.get("QDRANT_API_KEY") or None
    check_choice("--store-engine", engine, STORE_ENGINES)
    return StoreTarget(
        path=path or DEFAULT_PATH,
        url=url,
        api_key=api_key,
        timeout=timeout,
        prefer_grpc=prefer_grpc,
        engine=engine,
    )


def open_store(target: StoreTarget) -> BGEM3Store:
    """The store at `target`: Qdrant Edge for a path, qdrant-client for a URL (or local mode on request).

    Raises StoreUnavailableError with a clear message when it cannot be used (server unreachable,
    store open in another process), LegacyStoreError for a local-mode store that needs migrating.
    """
    if not target.is_server and target.engine == "edge" and target.path != ":memory:":
        return EdgeStore(target.path)
    # qdrant-client is imported where it is used: a second of start-up an Edge store does not need.
    from .client_store import ClientStore

    return ClientStore(open_qdrant_client(target), description=target.describe())


def as_store(obj: Any) -> BGEM3Store:
    """A BGEM3Store as is; a QdrantClient (server or local mode) wrapped in one."""
    if isinstance(obj, BGEM3Store):
        return obj
    from qdrant_client import QdrantClient

    from .client_store import ClientStore

    if isinstance(obj, QdrantClient):
        return ClientStore(obj)
    raise TypeError(
        f"expected a store from bgem3_qdrant.open_store or a QdrantClient, got {type(obj).__name__}"
    )


def open_qdrant_client(target: StoreTarget) -> QdrantClient:
    """A connected QdrantClient (server, or local mode for a path / ":memory:")."""
    from qdrant_client import QdrantClient

    if not target.is_server:
        if target.path != ":memory:" and detect(target.path) == "edge":
            raise BGEM3QdrantError(
                f"{target.path} is a Qdrant Edge store; open it with the default engine "
                "(without --store-engine local)"
            )
        try:
            # One thread (the writer) uses the client at a time, but not always the thread that opened
            # it: sqlite's same-thread check would refuse that.
            if target.path == ":memory:":
                return QdrantClient(location=":memory:", force_disable_check_same_thread=True)
            return QdrantClient(path=target.path, force_disable_check_same_thread=True)
        except RuntimeError as e:
            if "already accessed" in str(e):
                raise StoreUnavailableError(store_busy_message(Path(target.path))) from e
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
