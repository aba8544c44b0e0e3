"""`bgem3 serve`: the three BGE-M3 outputs over HTTP (OpenAI, text-embeddings-inference and FlagEmbedding
wire formats), one model in memory, requests of concurrent clients batched together.

    from bgem3_embeddings import BGEM3Encoder
    from bgem3_embeddings.serve import ServeSettings, create_app

    app = create_app(BGEM3Encoder("BAAI/bge-m3"), ServeSettings())   # an ASGI app: uvicorn.run(app)

Needs the `serve` extra (from the clone: `pip install -e ".[serve]"`: FastAPI, uvicorn, prometheus-client).
The modules, in the order a request flows through them: `settings` (limits, auth, batching options),
`limits` (body size, API key), `schemas` (request bodies), `service` (tokenize, check, queue),
`batcher` (one worker thread encoding the queued texts of every client together), `wire` (numbers on the
wire: float lists, base64), `routes_*` (one module per wire format), `metrics`, `app` (`create_app`),
`server` (uvicorn, signals, workers), `cli` (`bgem3 serve`), `bench` (`bgem3 bench-serve`).
The HTTP client is `bgem3_embeddings.remote.RemoteEncoder`. Docs: docs/serve.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bgem3_embeddings.serve.app import create_app
    from bgem3_embeddings.serve.settings import ServeSettings

__all__ = ["ServeSettings", "create_app"]

# Imported on first use: the settings need no web framework, and the app pulls in FastAPI.
_WHERE = {"create_app": "app", "ServeSettings": "settings"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"bgem3_embeddings.serve.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'bgem3_embeddings.serve' has no attribute {name!r}")
