"""`create_app(encoder, settings)`: the ASGI app, built per call (no global state), so tests, `bgem3 serve`
and each worker of `--workers N` build their own.

Layers, outermost first: request metrics, CORS (only when origins are given), the Host / Origin / JSON
guard (bgem3_embeddings/http_guard.py), the API key, the body size limit, then FastAPI's routes (one
module per wire format). Errors of every layer are JSON in the shape the route's clients expect
(`errors.py`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse

from bgem3_embeddings._version import __version__
from bgem3_embeddings.http_guard import HttpGuard
from bgem3_embeddings.serve.batcher import Batcher
from bgem3_embeddings.serve.errors import ApiError, api_error_response, error_response
from bgem3_embeddings.serve.limits import BearerAuth, BodyLimit
from bgem3_embeddings.serve.metrics import RequestMetrics, ServeMetrics
from bgem3_embeddings.serve.rerank_service import RerankService, reranker_call
from bgem3_embeddings.serve.routes_bgem3 import router as bgem3_router
from bgem3_embeddings.serve.routes_explain import router as explain_router
from bgem3_embeddings.serve.routes_openai import router as openai_router
from bgem3_embeddings.serve.routes_ops import router as ops_router
from bgem3_embeddings.serve.routes_rerank import router as rerank_router
from bgem3_embeddings.serve.routes_tei import router as tei_router
from bgem3_embeddings.serve.service import EmbeddingService
from bgem3_embeddings.serve.settings import ServeSettings

logger = logging.getLogger(__name__)

# How `bgem3 serve --workers N` hands the model and settings to each worker process.
CONFIG_ENV = "BGEM3_SERVE_CONFIG"
ROUTERS = (openai_router, tei_router, bgem3_router, explain_router, rerank_router, ops_router)


def _field(loc: Any) -> str:
    """A pydantic error location as the request field it names: ("body", "input", "list[str]", 0) -> input[0]
    (the union member tags pydantic inserts are left out)."""
    out = ""
    for part in loc:
        if part == "body" and not out:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif "[" in str(part) or str(part) in ("str", "int", "float", "bool") or "-" in str(part):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out


def _validation_response(request: Request, err: RequestValidationError) -> JSONResponse:
    """400 for a body that is not a JSON object, 422 naming the first wrong field otherwise."""
    errors = err.errors()
    path = request.url.path
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = errors[0].get("ctx", {}).get("error", "")
        return error_response(path, 400, f"the request body is not valid JSON: {detail}".rstrip(": "))
    if any(tuple(e.get("loc", ())) == ("body",) for e in errors):
        message = "the request body must be a JSON object (Content-Type: application/json)"
        return error_response(path, 400, message)
    first = _field(errors[0].get("loc", ())) if errors else ""
    # One message per field (a union reports each member's complaint about the same field).
    messages: dict[str, str] = {}
    for e in errors:
        messages.setdefault(_field(e.get("loc", ())) or "body", e.get("msg", "invalid"))
    text = "; ".join(f"`{where}`: {msg}" for where, msg in list(messages.items())[:3])
    return error_response(path, 422, text or "invalid request", first or None)


def create_app(
    encoder: Any | None, settings: ServeSettings | None = None, reranker: Any | None = None
) -> FastAPI:
    """The server around one loaded encoder (a `BGEM3Encoder`, or anything with its API), a reranker (a
    `BGEM3Reranker`: the rerank routes), or both in one process. Each model has its own batcher.

    The lifespan starts the batchers' worker threads and warms the models up before the first request is
    answered; on shutdown (after uvicorn has finished the requests in flight) it stops the workers.
    """
    if encoder is None and reranker is None:
        raise ValueError("create_app needs an encoder, a reranker or both")
    settings = settings or ServeSettings()
    metrics = ServeMetrics(
        known_routes=tuple(getattr(r, "path", "") for router in ROUTERS for r in router.routes)
    )
    service = None
    if encoder is not None:
        service = EmbeddingService(encoder, settings, Batcher(encoder, settings, metrics))
    rerank = None
    if reranker is not None:
        rerank_batcher = Batcher(reranker, settings, metrics.rerank, call=reranker_call(reranker))
        rerank = RerankService(reranker, settings, rerank_batcher, settings.reranker_name)
    services: list[EmbeddingService | RerankService] = [s for s in (service, rerank) if s is not None]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for each in services:
            await run_in_threadpool(each.warm_up)
            each.batcher.start()
            each.ready = True
            model = each.encoder if isinstance(each, EmbeddingService) else each.reranker
            logger.info("serving %s (%s)", each.model_name, getattr(model, "precision", "?"))
        try:
            yield
        finally:
            for each in services:
                each.ready = False
            for each in services:
                await run_in_threadpool(each.batcher.stop)

    app = FastAPI(
        title="bgem3-embeddings",
        version=__version__,
        description="BGE-M3 dense, sparse and ColBERT outputs (docs/serve.md).",
        lifespan=lifespan,
    )
    app.state.service = service  # None: a reranker only (the embedding routes answer 404)
    app.state.rerank = rerank  # None: no reranker (the rerank routes answer 404)
    app.state.metrics = metrics
    app.state.settings = settings
    for router in ROUTERS:
        app.include_router(router)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError) -> JSONResponse:
        return api_error_response(request.url.path, err)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        return _validation_response(request, err)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException) -> JSONResponse:
        return error_response(
            request.url.path, err.status_code, str(err.detail), headers=dict(err.headers or {})
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception) -> JSONResponse:
        logger.exception("unexpected error on %s", request.url.path)
        return error_response(request.url.path, 500, f"internal error: {type(err).__name__}: {err}")

    # add_middleware wraps what is already there: the last added runs first.
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    if settings.api_key:
        app.add_middleware(BearerAuth, api_key=settings.api_key)
    # Inside CORS: a refusal an allowed browser app receives carries the CORS headers, so it can read why.
    app.add_middleware(HttpGuard, rules=settings.guard_rules(), error=error_response)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(RequestMetrics, metrics=metrics)
    return app


def worker_config(
    model: str | None,
    encoder_kwargs: dict[str, Any],
    settings: ServeSettings,
    reranker: str | None = None,
    reranker_kwargs: dict[str, Any] | None = None,
) -> str:
    """The CONFIG_ENV value `create_app_from_env` reads in each worker (`model` None: a reranker only)."""
    return json.dumps(
        {
            "model": model,
            "encoder_kwargs": encoder_kwargs,
            "settings": settings.to_json(),
            "reranker": reranker,
            "reranker_kwargs": reranker_kwargs or {},
        }
    )


def create_app_from_env() -> FastAPI:
    """The app factory of `--workers N` (`uvicorn --factory`): each worker process loads its own model."""
    from bgem3_embeddings.cli_support import start_tensorflow_quietly

    config = json.loads(os.environ[CONFIG_ENV])
    start_tensorflow_quietly()
    from bgem3_embeddings.devices import resolve_serve_precision
    from bgem3_embeddings.encoder import BGEM3Encoder

    given = dict(config["encoder_kwargs"])
    encoder = None
    if config.get("model"):
        kwargs = dict(given)
        kwargs["precision"], reason = resolve_serve_precision(kwargs["precision"], kwargs["device"])
        if reason is not None:
            logger.warning("--precision auto: %s (%s)", kwargs["precision"], reason)
        encoder = BGEM3Encoder(config["model"], **kwargs)
    reranker = None
    if config.get("reranker"):
        from bgem3_embeddings import BGEM3Reranker

        # --precision as given ('auto': the reranker's own choice, as `bgem3 serve` makes it in one process)
        rerank_kwargs = {"precision": given["precision"], "device": given["device"], "show_progress": False}
        rerank_kwargs.update(config["reranker_kwargs"])
        reranker = BGEM3Reranker(config["reranker"], **rerank_kwargs)
    return create_app(encoder, ServeSettings.from_json(config["settings"]), reranker)
