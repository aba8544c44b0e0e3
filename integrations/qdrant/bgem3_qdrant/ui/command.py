"""What `bgem3-qdrant ui` runs: check the options, bind the port, load the encoder, listen, print the address,
serve.

The binding rules are `bgem3 serve`'s (loopback only unless a key is set, or --insecure-no-auth), and so
is the server runner (uvicorn on a socket bound before the model loads and listening before the address is
printed, so a script that opens it at once is not refused; graceful SIGTERM). The store is not
opened here: the first request opens it, so a store another process holds does not stop the page.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from ..errors import BGEM3QdrantError
from ..stores.open import StoreTarget
from .errors import UI_KEY_OPTION

KEY_OPTION = f"{UI_KEY_OPTION} KEY (or BGEM3_UI_API_KEY)"


@dataclass(frozen=True)
class UiOptions:
    """The command's options besides the store: where to listen, the page's key, the Host names added with
    --allowed-host (already checked by http_guard.parse_host_list), the eval folder."""

    host: str = "127.0.0.1"
    port: int = 8765
    api_key: str | None = None
    insecure_no_auth: bool = False
    allowed_hosts: tuple[str, ...] = ()
    eval_dir: Path | None = None
    log_level: str = "warning"


def check_options(options: UiOptions, target: StoreTarget) -> None:
    """Refuse in one line what cannot work: an exposed page without a key, no store, no eval folder."""
    from bgem3_embeddings.serve.cli import check_serve_extra
    from bgem3_embeddings.serve.settings import exposure_problem

    check_serve_extra()
    problem = exposure_problem(options.host, options.api_key, options.insecure_no_auth, KEY_OPTION)
    if problem:
        raise BGEM3QdrantError(problem)
    if options.api_key is not None and not options.api_key.strip():
        raise BGEM3QdrantError("--ui-api-key is empty: give a key, or leave the option out")
    if not target.is_server and target.engine == "edge" and not Path(target.path).exists():
        raise BGEM3QdrantError(
            f"no store at {target.path} (--path); create it with "
            f"`bgem3-qdrant ingest PATH --path {target.path}`"
        )
    if options.eval_dir is not None and not options.eval_dir.is_dir():
        raise BGEM3QdrantError(
            f"no folder {options.eval_dir} (--eval-dir): give the folder of the JSON files "
            "`bgem3-qdrant eval ... --json FILE` wrote"
        )


def run_ui(
    options: UiOptions,
    target: StoreTarget,
    load_encoder: Any,
    load_reranker: Any = None,
    rerank_candidates: int | None = None,
) -> None:
    """Serve the page until SIGTERM / Ctrl-C. `load_encoder()` builds the encoder (a model or a server);
    `load_reranker()` (`--reranker`) the cross-encoder whose column the page adds."""
    from bgem3_embeddings.serve.server import bind_socket, display_url, serve_app, start_listening

    from .app import create_ui_app
    from .evals import EvalFolder
    from .session import StoreSession

    check_options(options, target)
    sock = bind_socket(options.host, options.port)  # before the model loads: a port in use is said at once
    try:
        encoder = load_encoder()
        reranker = load_reranker() if load_reranker is not None else None
        session = StoreSession(target, encoder, reranker=reranker, rerank_candidates=rerank_candidates)
        app = create_ui_app(
            session,
            EvalFolder(options.eval_dir),
            api_key=options.api_key,
            bound_host=options.host,
            allowed_hosts=options.allowed_hosts,
        )
        start_listening(sock)  # before the address is printed: a script may open it the moment it reads it
        typer.echo(
            f"bgem3-qdrant ui: {display_url(options.host, sock.getsockname()[1])}/ ({target.describe()}, "
            f"{getattr(encoder, 'model_id', 'model')}); Ctrl-C stops it"
        )
        try:
            serve_app(app, sock, options.log_level)
        finally:
            session.close()
    finally:
        sock.close()
