"""ASGI wrappers that answer before any route runs: the request body's size and the API key.

Starlette reads a body whole, whatever its size; `BodyLimit` refuses one past `max_body_bytes` by its
Content-Length, or while reading it when it is sent in chunks, so an oversized body never sits in memory.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from bgem3_embeddings.serve.errors import error_response

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Routes open without a key: a load balancer's health probe carries none.
OPEN_PATHS = frozenset({"/health"})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


class BodyLimit:
    """Refuse request bodies larger than `max_bytes` with 413 (the limit named: max_body_bytes)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self, scope: Scope) -> Any:
        return error_response(
            scope["path"],
            413,
            f"the request body is larger than max_body_bytes ({self.max_bytes} bytes): send fewer or "
            "shorter inputs per request",
            "max_body_bytes",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._too_large(scope)(scope, receive, send)
            return
        # Read the body here, counting, and hand it to the app as one message; later receive() calls go
        # to the server (so the app still hears of a client that disconnects while it waits).
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away mid-body
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(scope)(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class BearerAuth:
    """Require `Authorization: Bearer <key>` on every route but OPEN_PATHS (401 otherwise)."""

    def __init__(self, app: ASGIApp, api_key: str, key_option: str = "--api-key") -> None:
        self.app = app
        self.key = api_key.encode("utf-8")
        self.key_option = key_option  # the command's option that set the key, named in the 401

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        header = _header(scope, b"authorization") or ""
        scheme, _, token = header.partition(" ")
        # compare_digest: the time taken does not tell how much of a guessed key was right.
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode("utf-8"), self.key):
            reason = "missing" if not header else "wrong"
            response = error_response(
                scope["path"],
                401,
                f"API key {reason}: send the server's {self.key_option} as 'Authorization: Bearer KEY'",
                "api_key",
                {"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
