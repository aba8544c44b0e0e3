"""`bgem3-qdrant mcp`: the store as MCP tools (find, explain, collections, store) for any LLM client."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from bgem3_embeddings.cli_support import DEFAULT_MMAP_THRESHOLD, MallocMmapThresholdOpt, fix_server_heap

from .common import (
    CollectionOpt,
    DeviceOpt,
    EncoderKeyOpt,
    EncoderUrlOpt,
    EngineOpt,
    KeyOpt,
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


def mcp(
    collection: CollectionOpt = "documents",
    model: ReadModelOpt = None,
    path: Annotated[
        str,
        typer.Option("--path", envvar="BGEM3_QDRANT_PATH",
                     help="Embedded store folder (used when no --url)."),  # fmt: skip
    ] = "./qdrant_data",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    store_engine: EngineOpt = "edge",
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
    encoder_url: EncoderUrlOpt = None,
    encoder_api_key: EncoderKeyOpt = None,
    reranker: RerankerOpt = None,
    rerank_candidates: RerankCandidatesOpt = None,
    transport: Annotated[
        str,
        typer.Option(envvar="BGEM3_MCP_TRANSPORT",
                     help="stdio (the client starts this command) or streamable-http (a server at /mcp)."),
    ] = "stdio",  # fmt: skip
    read_only: Annotated[
        bool,
        typer.Option("--read-only", envvar="BGEM3_MCP_READ_ONLY", help="No `store` tool: nothing written."),
    ] = False,
    host: Annotated[
        str, typer.Option(help="streamable-http: address to listen on; not loopback needs --mcp-api-key.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="streamable-http: TCP port (0: any free one).")
    ] = 8000,
    mcp_api_key: Annotated[
        str | None,
        typer.Option(envvar="BGEM3_MCP_API_KEY", show_default=False,
                     help="streamable-http: require 'Authorization: Bearer KEY'."),
    ] = None,  # fmt: skip
    allowed_hosts: Annotated[
        list[str] | None,
        typer.Option("--allowed-host", envvar="BGEM3_MCP_ALLOWED_HOSTS",
                     help="streamable-http: another name of this machine clients use in Host (repeatable)."),
    ] = None,  # fmt: skip
    insecure_no_auth: Annotated[
        bool, typer.Option("--insecure-no-auth", help="Allow a non-loopback --host without --mcp-api-key.")
    ] = False,
    malloc_mmap_threshold: MallocMmapThresholdOpt = DEFAULT_MMAP_THRESHOLD,
    verbose: VerboseOpt = False,
) -> None:
    """Serve the store to LLM clients over the Model Context Protocol (docs/mcp.md): find (hybrid, rerank,
    dense, sparse; metadata filters), explain, collections, store. stdout carries only protocol messages."""
    setup_logging(verbose)
    from bgem3_embeddings.http_guard import parse_host_list

    from ..encoder import connect_encoder, load_encoder
    from ..mcp_server.command import run_mcp
    from ..mcp_server.options import McpOptions
    from ..stores.open import resolve_target

    try:
        target = resolve_target(path=path, url=url, api_key=api_key, engine=checked_engine(store_engine))
        options = McpOptions(
            collection=collection,
            transport=transport,
            read_only=read_only,
            host=host,
            port=port,
            api_key=mcp_api_key,
            insecure_no_auth=insecure_no_auth,
            allowed_hosts=parse_host_list(allowed_hosts or [], "--allowed-host"),
            log_level="info" if verbose else "warning",
        )
    except ValueError as e:
        raise fail(e) from e
    check_reranker_option(reranker)  # before the model loads (on a thread, for mcp)
    # Without --model, the model the default collection records: read before the encoder is built.
    served = None if encoder_url else served_model(target, model, collection)

    def encoder() -> Any:
        # Once the store opened, before the model loads (its buffers are the large blocks). Over HTTP only:
        # a server that may run for weeks (stdio lives as long as its client's session).
        if transport != "stdio":
            fix_server_heap(malloc_mmap_threshold, "bgem3-qdrant mcp")
        if encoder_url:
            return connect_encoder(encoder_url, encoder_api_key)
        assert served is not None
        return load_encoder(served, precision=precision, device=device)

    def cross_encoder() -> Any:
        return load_reranker_option(reranker, precision, device)

    run_mcp(
        options,
        target,
        encoder,
        model=served,
        connect=bool(encoder_url),
        load_reranker=cross_encoder if reranker else None,
        rerank_candidates=rerank_candidates,
    )
