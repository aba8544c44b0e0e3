"""`bgem3-qdrant ui`: the local page (search in all four modes, explanations, eval charts)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from bgem3_embeddings.cli_support import DEFAULT_MMAP_THRESHOLD, MallocMmapThresholdOpt, fix_server_heap

from .common import (
    DeviceOpt,
    EncoderKeyOpt,
    EncoderUrlOpt,
    EngineOpt,
    KeyOpt,
    PathOpt,
    PrecisionOpt,
    ReadModelOpt,
    RerankCandidatesOpt,
    RerankerOpt,
    UrlOpt,
    VerboseOpt,
    check_reranker_option,
    checked_engine,
    fail,
    load_reranker_option,
    served_model,
    setup_logging,
)


def ui(
    model: ReadModelOpt = None,
    path: PathOpt = "./qdrant_data",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    store_engine: EngineOpt = "edge",
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
    encoder_url: EncoderUrlOpt = None,
    encoder_api_key: EncoderKeyOpt = None,
    reranker: RerankerOpt = None,
    rerank_candidates: RerankCandidatesOpt = None,
    eval_dir: Annotated[
        Path | None, typer.Option("--eval-dir", help="Folder of `eval --json` files to chart.")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on; not loopback needs --ui-api-key.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0: any free one).")] = 8765,
    ui_api_key: Annotated[
        str | None,
        typer.Option(envvar="BGEM3_UI_API_KEY", show_default=False,
                     help="Require this key for the page's API (the page asks for it once)."),
    ] = None,
    insecure_no_auth: Annotated[
        bool, typer.Option("--insecure-no-auth", help="Allow a non-loopback --host without --ui-api-key.")
    ] = False,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option("--allowed-host", metavar="NAME", envvar="BGEM3_UI_ALLOWED_HOSTS", show_default=False,
                     help="Also serve the page under this Host name when no --ui-api-key is set (repeatable; "
                     "the variable takes names separated by commas). Default: this machine's names only."),
    ] = None,  # fmt: skip
    malloc_mmap_threshold: MallocMmapThresholdOpt = DEFAULT_MMAP_THRESHOLD,
    verbose: VerboseOpt = False,
) -> None:
    """Serve a local page: search a store in all four modes side by side, open a hit to see why it came
    back (per-mode scores, sparse terms, ColBERT alignment), chart --eval-dir results (docs/explain.md)."""
    setup_logging(verbose)
    from bgem3_embeddings.http_guard import parse_host_list

    from ..encoder import connect_encoder, load_encoder
    from ..stores.open import resolve_target
    from ..ui.command import UiOptions, run_ui

    try:
        target = resolve_target(path=path, url=url, api_key=api_key, engine=checked_engine(store_engine))
        allowed_hosts = parse_host_list(allowed_host or ())
    except ValueError as e:
        raise fail(e) from e
    check_reranker_option(reranker)  # before the model loads
    # Without --model, the model the store's collections record: read before the encoder is built.
    served = None if encoder_url else served_model(target, model)
    options = UiOptions(host=host, port=port, api_key=ui_api_key, insecure_no_auth=insecure_no_auth,
                        allowed_hosts=allowed_hosts, eval_dir=eval_dir,
                        log_level="info" if verbose else "warning")  # fmt: skip

    def encoder() -> Any:
        # Once the store opened, before the model loads (its buffers are the large blocks).
        fix_server_heap(malloc_mmap_threshold, "bgem3-qdrant ui")
        if encoder_url:
            return connect_encoder(encoder_url, encoder_api_key)
        assert served is not None
        return load_encoder(served, precision=precision, device=device)

    def cross_encoder() -> Any:
        return load_reranker_option(reranker, precision, device)

    run_ui(options, target, encoder, cross_encoder if reranker else None, rerank_candidates)
