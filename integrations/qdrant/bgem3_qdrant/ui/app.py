"""The page's web app: the static page, its JSON API, and headers that keep every request on this machine.

    GET  /                      the page (static/index.html)
    GET  /static/...            its CSS, ES modules and icon
    GET  /api/info              store, model, input limits
    GET  /api/collections       collections with their model, precision, pooling, chunk count
    POST /api/search            {collection, query, filters: ["key=value"], limit} -> hits of all four modes
    POST /api/explain           {collection, id, query, weights?} -> the explanation of one stored hit
    POST /api/explain-pair      {query, passage, weights?} -> the explanation of a typed pair
    GET  /api/evals             the eval JSON files of --eval-dir (malformed ones with their one line)
    GET  /api/evals/{name}      one file's figures for the charts

Errors are JSON `{"error": {"message": ...}}` (the shape `bgem3 serve` answers with) with a 4xx status and
a one-line message; the page shows the message and keeps working. With an API key, /api/* needs
`Authorization: Bearer KEY` (the page asks for it); the page's own files hold no data and stay open.

Other sites' pages are kept out by bgem3_embeddings/http_guard.py, before the key: without a key only a Host
naming this machine (or one added with --allowed-host) is served (DNS rebinding); a request whose Origin is
not the page's own is refused, and so is a POST that is not `application/json` (a cross-site form).
The page's files are served with fixed media types (`MEDIA_TYPES`), not the operating system's table.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import NotModifiedResponse, StaticFiles
from starlette.types import Scope as StarletteScope

from bgem3_embeddings.explain.decompose import colbert_vectors, prepare
from bgem3_embeddings.http_guard import GuardRules, HttpGuard
from bgem3_embeddings.json_pieces import dumps
from bgem3_embeddings.serve.errors import error_response
from bgem3_embeddings.serve.limits import ASGIApp, BearerAuth, BodyLimit, Message, Receive, Scope, Send
from bgem3_embeddings.serve.settings import DEFAULT_MAX_MATRIX_CELLS

from .errors import UI_HOSTS_OPTION, UI_KEY_OPTION, PageError, one_line, status_of
from .evals import EvalFolder
from .session import MAX_PASSAGE_CHARS, MAX_QUERY_CHARS, StoreSession, check_text

logger = logging.getLogger(__name__)

STATIC = Path(str(resources.files("bgem3_qdrant.ui") / "static"))
MAX_BODY_BYTES = 1024 * 1024  # a query and a passage of the page's limits fit many times over
# Nothing but this origin: no CDN, no font or image from elsewhere, no inline script, no framing.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "font-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# The media types of the page's files, fixed: Python's mimetypes reads the operating system's table (on
# Windows the registry, where a program may have mapped .js to text/plain), and a module script served as
# text/plain does not run (with nosniff), leaving a blank page.
MEDIA_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".svg": "image/svg+xml",
    ".json": "application/json",
}
SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
)


class SecurityHeaders:
    """Adds the Content-Security-Policy and its companions to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


class PageFiles(StaticFiles):
    """StaticFiles with the media types of MEDIA_TYPES (text types get `; charset=utf-8`)."""

    def file_response(
        self, full_path: Any, stat_result: Any, scope: StarletteScope, status_code: int = 200
    ) -> Response:
        media_type = MEDIA_TYPES.get(Path(str(full_path)).suffix.lower())
        if media_type is None:
            return super().file_response(full_path, stat_result, scope, status_code)
        response = FileResponse(
            full_path, status_code=status_code, stat_result=stat_result, media_type=media_type
        )
        if self.is_not_modified(response.headers, Headers(scope=scope)):
            return NotModifiedResponse(response.headers)
        return response


def _refusal(path: str, status: int, message: str, param: str | None) -> ASGIApp:
    """http_guard's refusal: the API's JSON error on /api/*, one line of text on the page's own files."""
    if path.startswith("/api/"):
        return error_response(path, status, message, param)
    return Response(message + "\n", status_code=status, media_type="text/plain")


class ApiKeyGate:
    """`bgem3 serve`'s BearerAuth on /api/* only: the page and its scripts load without the key."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.guarded = BearerAuth(app, api_key, key_option=UI_KEY_OPTION)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = self.guarded if str(scope.get("path", "")).startswith("/api/") else self.app
        await target(scope, receive, send)


def check_matrix_cells(encoder: Any, query: Any, passage: Any, limit: int) -> None:
    """PageError 413 when a typed pair's ColBERT matrix (every explanation on the page carries it, for the
    heatmap) would hold more than `limit` cells, said before the encoder runs (as bgem3 serve's
    max_colbert_matrix_cells)."""
    tokenizer = getattr(encoder, "tokenizer", None)
    query = check_text(query, "query", MAX_QUERY_CHARS)  # the length limits are said first
    passage = check_text(passage, "passage", MAX_PASSAGE_CHARS)
    if tokenizer is None:
        return
    q, (p,) = prepare(
        tokenizer, query, [passage], int(encoder.query_max_length), int(encoder.passage_max_length)
    )
    rows, columns = colbert_vectors(q), colbert_vectors(p)
    if rows * columns > limit:
        raise PageError(
            413,
            f"the pair's ColBERT matrix would have {rows * columns:,} cells ({rows} query x {columns} "
            f"passage tokens), over the page's limit of {limit:,} cells: shorten the passage or the query",
        )


def _error(request: Request, status: int, message: str) -> JSONResponse:
    return error_response(request.url.path, status, one_line(message))


async def _answer(request: Request, work: Callable[[], Any]) -> Response:
    """Run `work` and write its JSON off the event loop (an explanation's ColBERT matrix at the cell limit is
    about 20 MB of JSON: written on the loop, no other request is answered meanwhile); an expected failure
    becomes its 4xx and one line."""
    try:
        text = await run_in_threadpool(lambda: dumps(work()))
        return Response(text.encode("utf-8"), media_type="application/json")
    except Exception as err:
        status = status_of(err)
        if status is None:
            logger.exception("unexpected error on %s", request.url.path)
            return _error(request, 500, f"internal error: {type(err).__name__}: {err}")
        return _error(request, status, str(err))


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PageError(400, f"the request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise PageError(400, "the request body must be a JSON object")
    return body


def _str(body: dict[str, Any], key: str) -> Any:
    if key not in body:
        raise PageError(400, f"the request has no {key!r}")
    return body[key]


def _filters(body: dict[str, Any]) -> list[str]:
    value = body.get("filters") or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PageError(400, "filters must be a list of key=value strings")
    return [v for v in value if v.strip()]


def _limit(body: dict[str, Any]) -> int:
    value = body.get("limit", 10)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PageError(400, f"limit must be a whole number, got {json.dumps(value)[:40]}")
    return value


def create_ui_app(
    session: StoreSession,
    evals: EvalFolder,
    *,
    api_key: str | None = None,
    bound_host: str = "127.0.0.1",
    allowed_hosts: tuple[str, ...] = (),
    max_matrix_cells: int = DEFAULT_MAX_MATRIX_CELLS,
) -> ASGIApp:
    """The page's ASGI app around one session (store + encoder) and one eval folder (no global state).

    bound_host / allowed_hosts: the address listened on and the Host names added with --allowed-host; with
    no api_key only these and this machine's names are served (http_guard). max_matrix_cells: a typed
    pair whose ColBERT matrix would be larger is refused with 413."""

    async def index(request: Request) -> Response:
        return FileResponse(
            STATIC / "index.html", headers={"cache-control": "no-cache"}, media_type=MEDIA_TYPES[".html"]
        )

    async def info(request: Request) -> Response:
        return await _answer(request, lambda: {**session.info(), "eval_dir": evals.listing()["folder"]})

    async def collections(request: Request) -> Response:
        return await _answer(request, lambda: {"collections": session.collections()})

    async def post(request: Request, work: Callable[[dict[str, Any]], Any]) -> Response:
        try:
            body = await _body(request)
        except PageError as e:
            return _error(request, e.status, str(e))
        return await _answer(request, lambda: work(body))

    async def search(request: Request) -> Response:
        return await post(
            request,
            lambda b: session.search(_str(b, "collection"), _str(b, "query"), _filters(b), _limit(b)),
        )

    async def explain(request: Request) -> Response:
        return await post(
            request,
            lambda b: session.explain_hit(_str(b, "collection"), _str(b, "id"), _str(b, "query"),
                                          b.get("weights")),  # fmt: skip
        )

    def pair(body: dict[str, Any]) -> Any:
        query, passage = _str(body, "query"), _str(body, "passage")
        check_matrix_cells(session.encoder, query, passage, max_matrix_cells)
        return session.explain_pair(query, passage, body.get("weights"))

    async def explain_pair(request: Request) -> Response:
        return await post(request, pair)

    async def eval_list(request: Request) -> Response:
        return await _answer(request, evals.listing)

    async def eval_file(request: Request) -> Response:
        name = str(request.path_params["name"])
        return await _answer(request, lambda: evals.load(name))

    async def http_error(request: Request, err: Exception) -> Response:
        status = err.status_code if isinstance(err, HTTPException) else 500
        if request.url.path.startswith("/api/"):
            return _error(request, status, f"{request.method} {request.url.path}: {_reason(status)}")
        return Response(_reason(status), status_code=status, media_type="text/plain")

    app = Starlette(
        routes=[
            Route("/", index),
            Route("/api/info", info),
            Route("/api/collections", collections),
            Route("/api/search", search, methods=["POST"]),
            Route("/api/explain", explain, methods=["POST"]),
            Route("/api/explain-pair", explain_pair, methods=["POST"]),
            Route("/api/evals", eval_list),
            Route("/api/evals/{name}", eval_file),
            Mount("/static", PageFiles(directory=STATIC), name="static"),
        ],
        exception_handlers={HTTPException: http_error},
    )
    wrapped: ASGIApp = BodyLimit(app, MAX_BODY_BYTES)
    if api_key:
        wrapped = ApiKeyGate(wrapped, api_key)
    rules = GuardRules(
        bound_host=bound_host, extra_hosts=allowed_hosts, check_host=not api_key, host_option=UI_HOSTS_OPTION
    )
    return SecurityHeaders(HttpGuard(wrapped, rules, error=_refusal))


def _reason(status: int) -> str:
    return {404: "no such page or API route", 405: "method not allowed"}.get(status, f"HTTP {status}")
