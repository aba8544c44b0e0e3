"""What `bgem3-qdrant mcp` runs: check everything that can be checked, then serve the tools.

Start-up problems (the `mcp` extra missing, no store, a bad option, a checkpoint without its files, an
encoder server that does not answer) are one line on stderr and exit 1, before any model loads. Over
stdio, fd 1 belongs to the protocol once the options are checked (`ProtocolStdout`), before anything that
could print is imported. The store is
opened by the first tool call that needs it (`StoreSession`), so a store another process holds is a tool
error that the next call retries, not a server that cannot start.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bgem3_embeddings.cli_support import check_inputs, require_modules

from ..errors import BGEM3QdrantError
from ..stores.open import StoreTarget
from .options import INSTALL, INSTRUCTIONS, KEY_OPTION, TRANSPORTS, McpOptions


def check_options(options: McpOptions, target: StoreTarget, model: str | None) -> None:
    """Refuse in one line, before anything loads, what cannot work. `model` None: --encoder-url encodes."""
    require_modules(["mcp"], "bgem3-qdrant mcp", INSTALL)
    if options.transport not in TRANSPORTS:
        raise BGEM3QdrantError(
            f"--transport {options.transport!r} is not one of {', '.join(TRANSPORTS)}"
        )
    if not options.collection.strip():
        raise BGEM3QdrantError("--collection is empty: give the collection the tools use by default")
    if options.transport == "streamable-http":
        from bgem3_embeddings.serve.cli import check_serve_extra
        from bgem3_embeddings.serve.settings import exposure_problem

        check_serve_extra()  # uvicorn and the server's ASGI wrappers (the serve extra)
        problem = exposure_problem(options.host, options.api_key, options.insecure_no_auth, KEY_OPTION)
        if problem:
            raise BGEM3QdrantError(problem)
        if options.api_key is not None and not options.api_key.strip():
            raise BGEM3QdrantError("--mcp-api-key is empty: give a key, or leave the option out")
    if not target.is_server and target.engine == "edge" and not Path(target.path).exists():
        raise BGEM3QdrantError(
            f"no store at {target.path} (--path); create it with `bgem3-qdrant ingest PATH --path "
            f"{target.path}`, or make the folder (mkdir) for an empty store the `store` tool fills"
        )
    if model is not None:
        check_inputs(model)  # the checkpoint's files, before the model loads


def run_mcp(
    options: McpOptions,
    target: StoreTarget,
    make_encoder: Callable[[], Any],
    *,
    model: str | None,
    connect: bool,
    load_reranker: Callable[[], Any] | None = None,
    rerank_candidates: int | None = None,
) -> None:
    """Serve until the client closes stdin (stdio) or SIGTERM (HTTP).

    `load_reranker()` (`--reranker`), built on the same thread after the encoder: `find` orders the mode's
    top `rerank_candidates` by that cross-encoder.

    `make_encoder()` builds the encoder on a thread. `connect` (an encoder server: a quick request whose
    failure is a start-up error): served once it answered; else the server answers `tools/list` at once.
    `model` is the name recorded with what `store` writes (None: the encoder's own `model_id`).
    """
    check_options(options, target, None if connect else model)  # prints nothing: fails on stderr
    wire = None
    if options.transport == "stdio":
        from .wire import ProtocolStdout

        wire = ProtocolStdout()  # before anything that could print loads
    from ..ingest import IngestOptions
    from ..ui.session import StoreSession
    from .server import build_server, load_in_background, serve_stdio
    from .tools import McpTools

    sock = None
    if wire is None:  # bound before the model loads: a port in use is said at once
        from bgem3_embeddings.serve.server import bind_socket

        sock = bind_socket(options.host, options.port)

    def build_tools(encoder: Any, reranker: Any = None) -> McpTools:
        return McpTools(
            StoreSession(target, encoder, reranker=reranker, rerank_candidates=rerank_candidates),
            default_collection=options.collection,
            model_id=model or str(getattr(encoder, "model_id", "unknown")),
            read_only=options.read_only,
            ingest_options=IngestOptions(show_progress=False),
        )

    # The encoder is built on a thread while the SDK is imported; an encoder server is waited for before
    # serving (a quick request whose failure is a start-up error), a model is not (tool calls wait for it).
    tools = load_in_background(
        lambda: build_tools(make_encoder(), load_reranker() if load_reranker is not None else None),
        log_failure=not connect,
    )
    server = build_server(
        tools, default_collection=options.collection, read_only=options.read_only, instructions=INSTRUCTIONS
    )
    failed = tools.exception() if connect else None
    if failed is not None:
        raise failed
    try:
        if sock is not None:
            from .http import serve_http

            try:
                serve_http(server, options, sock)
            finally:
                sock.close()
        elif wire is not None:
            serve_stdio(server, wire)
    finally:
        if tools.done() and tools.exception() is None:
            tools.result().session.close()
