"""The `bgem3 serve` command (registered in bgem3_embeddings/cli.py). Imports no web framework until run."""

from __future__ import annotations

import logging
from typing import Annotated, Any, cast

import typer

from bgem3_embeddings.checkpoint.files import DEFAULT_MODEL_ID
from bgem3_embeddings.checkpoint.tiny import Kind
from bgem3_embeddings.cli_options import DeviceOpt, PrecisionOpt
from bgem3_embeddings.cli_support import (
    DEFAULT_MMAP_THRESHOLD,
    CommandError,
    MallocMmapThresholdOpt,
    check_inputs,
    checkpoint_problem,
    expected_errors,
    fix_server_heap,
    require_modules,
    start_tensorflow_quietly,
)
from bgem3_embeddings.install_hint import pip_install
from bgem3_embeddings.serve.settings import (
    DEFAULT_CYCLE_TOKENS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_INPUTS,
    DEFAULT_MAX_MATRIX_CELLS,
    DEFAULT_MAX_QUEUED_TEXTS,
    DEFAULT_REGATHER_SHARE,
    HOSTS_ENV,
    ServeSettings,
    exposure_problem,
)

logger = logging.getLogger(__name__)
SERVE_MODULES = ("fastapi", "uvicorn", "prometheus_client")
INSTALL_HINT = pip_install("bgem3-embeddings[serve]")


def check_serve_extra() -> None:
    """A one-line error naming the pip command when the `serve` extra is not installed."""
    require_modules(SERVE_MODULES, "the server (the serve extra)", INSTALL_HINT)


def _load(model: str, **kwargs: Any) -> Any:
    start_tensorflow_quietly()
    from bgem3_embeddings.encoder import BGEM3Encoder

    try:
        kwargs["precision"] = _serve_precision(kwargs["precision"], kwargs["device"])
        return BGEM3Encoder(model, show_progress=False, **kwargs)
    except expected_errors():
        raise
    except (ValueError, FileNotFoundError, TypeError) as err:
        raise typer.BadParameter(str(err), param_hint="--model/--precision/--compute-dtype/--device") from err


def _load_reranker(reranker: str, precision: str, device: str, max_length: int) -> Any:
    """The `--reranker` model on --device, at --precision ('auto': the reranker's own choice, as the
    library makes it: the server's int8 choice for the encoder is not available to the reranker)."""
    start_tensorflow_quietly()
    from bgem3_embeddings import BGEM3Reranker

    try:
        return BGEM3Reranker(
            reranker, precision=precision, device=device, max_length=max_length, show_progress=False
        )
    except expected_errors():
        raise
    except (ValueError, FileNotFoundError, TypeError) as err:
        raise typer.BadParameter(str(err), param_hint="--reranker/--precision/--device") from err


def _serve_precision(precision: str, device: str) -> str:
    """--precision as the server resolves it ('auto': resolve_serve_precision, its reason said once)."""
    from bgem3_embeddings.devices import resolve_serve_precision

    resolved, reason = resolve_serve_precision(precision, device)
    if reason is not None:
        typer.echo(f"bgem3 serve: --precision auto: {resolved} ({reason})", err=True)
    return resolved


def _check_model(model: str, kind: Kind = "encoder") -> None:
    """Resolve the checkpoint in this process (fast, no weights read) so --workers fails in one line."""
    from bgem3_embeddings.checkpoint.files import resolve_checkpoint
    from bgem3_embeddings.config import BGEM3Config

    BGEM3Config.from_json_file(resolve_checkpoint(model, kind=kind).config)


def serve(
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help=f"Hub id or local checkpoint folder [default: {DEFAULT_MODEL_ID}, unless --reranker is "
            "given alone].",
            envvar="BGEM3_MODEL",
            show_default=False,
        ),
    ] = None,
    reranker: Annotated[
        str | None,
        typer.Option(
            "--reranker",
            metavar="MODEL",
            envvar="BGEM3_RERANKER_MODEL",
            show_default=False,
            help="Also serve this cross-encoder (BAAI/bge-reranker-v2-m3, or a folder) on /rerank, "
            "/v1/rerank and /v2/rerank; alone (no --model): the reranker only.",
        ),
    ] = None,
    rerank_max_length: Annotated[
        int, typer.Option(min=2, help="Tokens of a (query, text) pair the reranker scores (FlagReranker's).")
    ] = 512,
    host: Annotated[
        str, typer.Option(help="Address to listen on; not loopback needs --api-key.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port.")] = 8000,
    precision: PrecisionOpt = "auto",
    compute_dtype: Annotated[str, typer.Option(help="auto | float32 | the precision")] = "auto",
    device: DeviceOpt = "auto",
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="BGEM3_API_KEY",
            show_default=False,
            help="Require 'Authorization: Bearer KEY' (not /health).",
        ),
    ] = None,
    insecure_no_auth: Annotated[
        bool, typer.Option("--insecure-no-auth", help="Allow a non-loopback --host without --api-key.")
    ] = False,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option("--cors-origin", help="Allow this browser origin (repeatable; default none)."),
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            metavar="NAME",
            envvar=HOSTS_ENV,
            show_default=False,
            help="Also serve requests whose Host is NAME when no --api-key is set (repeatable; the variable "
            "takes names separated by commas; '*' any). Default: this machine's names only.",
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(min=1, help="Processes, each with its own model (docs/serve-operations.md#scale-out)."),
    ] = 1,
    model_name: Annotated[
        str | None, typer.Option(help="Model id clients see in /v1/models (default: --model).")
    ] = None,
    max_inputs: Annotated[int, typer.Option(min=1, help="Inputs per request.")] = DEFAULT_MAX_INPUTS,
    max_chars: Annotated[int, typer.Option(min=1, help="Characters per input.")] = DEFAULT_MAX_CHARS,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="Request body size.")] = DEFAULT_MAX_BODY_BYTES,
    max_matrix_cells: Annotated[
        int, typer.Option(min=1, help="ColBERT matrix cells one explain request may ask for.")
    ] = DEFAULT_MAX_MATRIX_CELLS,
    max_queued_texts: Annotated[
        int, typer.Option(min=1, help="Texts waiting for the encoder before 503.")
    ] = DEFAULT_MAX_QUEUED_TEXTS,
    cycle_tokens: Annotated[
        int, typer.Option(min=1, help="Tokens gathered from waiting requests per encoder call.")
    ] = DEFAULT_CYCLE_TOKENS,
    batch_size: Annotated[int, typer.Option(min=1, help="Texts per forward pass.")] = 256,
    max_tokens_per_batch: Annotated[int, typer.Option(min=1, help="Padded tokens per forward pass.")] = 8192,
    batch_wait_ms: Annotated[
        float, typer.Option(min=0, help="Wait this long for more requests before an encoder call.")
    ] = 0.0,
    regather_share: Annotated[
        float,
        typer.Option(
            min=0,
            max=1,
            help="After a call that answered several requests, wait up to this share of its time "
            "(at most 0.1 s) for them to come back; 0: never.",
        ),
    ] = DEFAULT_REGATHER_SHARE,
    malloc_mmap_threshold: MallocMmapThresholdOpt = DEFAULT_MMAP_THRESHOLD,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level: info, warning, error.")] = "info",
) -> None:
    """Serve dense, sparse and ColBERT over HTTP: OpenAI /v1/embeddings, TEI /embed and /embed_sparse,
    /v1/bgem3/encode and /score, /health, /metrics; with --reranker, TEI /rerank and Cohere /v1/rerank,
    /v2/rerank (docs/serve.md)."""
    check_serve_extra()
    problem = exposure_problem(host, api_key, insecure_no_auth)
    if problem:
        raise CommandError(problem)
    if model is None and reranker is None:
        model = DEFAULT_MODEL_ID
    check_inputs(model)  # a missing checkpoint or file is said before TensorFlow starts
    reranker_problem = checkpoint_problem(reranker, "reranker") if reranker is not None else None
    if reranker_problem:
        raise CommandError(f"{reranker_problem} (--reranker); nothing was loaded")
    from bgem3_embeddings.http_guard import parse_host_list

    try:
        allowed_hosts = parse_host_list(allowed_host or ())
    except ValueError as err:
        raise CommandError(str(err)) from err
    try:
        settings = ServeSettings(
            model_name=model_name or model,
            reranker_name=reranker,
            api_key=api_key,
            cors_origins=tuple(cors_origin or ()),
            bound_host=host,
            allowed_hosts=allowed_hosts,
            max_inputs_per_request=max_inputs,
            max_chars_per_input=max_chars,
            max_body_bytes=max_body_bytes,
            max_colbert_matrix_cells=max_matrix_cells,
            max_queued_texts=max_queued_texts,
            cycle_tokens=cycle_tokens,
            batch_wait_ms=batch_wait_ms,
            regather_share=regather_share,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from err
    from bgem3_embeddings.serve.server import (
        bind_socket,
        display_url,
        serve_app,
        serve_workers,
        start_listening,
    )

    encoder_kwargs: dict[str, Any] = {
        "precision": precision,
        "compute_dtype": compute_dtype,
        "device": device,
        "batch_size": batch_size,
        "max_tokens_per_batch": max_tokens_per_batch,
    }
    sock = bind_socket(host, port)  # before the model loads: a port in use is said at once
    where = display_url(host, sock.getsockname()[1])  # the port the system chose for --port 0
    # Before the model loads (its buffers are the large blocks), and exported for --workers' processes.
    fix_server_heap(malloc_mmap_threshold, "bgem3 serve")
    loading = " and ".join(m for m in (model, reranker) if m)
    try:
        if workers > 1:
            from bgem3_embeddings.serve.app import worker_config

            for checked, kind in ((model, "encoder"), (reranker, "reranker")):
                if checked:
                    _check_model(checked, cast("Kind", kind))
            start_listening(sock)  # before the address is printed: a client reading it may connect at once
            typer.echo(f"bgem3 serve: {workers} workers, each loading {loading}, on {where}", err=True)
            config = worker_config(
                model, encoder_kwargs, settings, reranker, {"max_length": rerank_max_length}
            )
            serve_workers(config, sock, workers, log_level)
            return
        encoder = _load(model, **encoder_kwargs) if model else None
        loaded_reranker = None
        if reranker:
            loaded_reranker = _load_reranker(reranker, precision, device, rerank_max_length)
        from bgem3_embeddings.serve.app import create_app

        app = create_app(encoder, settings, loaded_reranker)
        start_listening(sock)
        shown = [f"{m} ({x.precision})" for m, x in ((model, encoder), (reranker, loaded_reranker)) if x]
        typer.echo(f"bgem3 serve: {' and '.join(shown)} on {where}", err=True)
        serve_app(app, sock, log_level)
    finally:
        sock.close()
