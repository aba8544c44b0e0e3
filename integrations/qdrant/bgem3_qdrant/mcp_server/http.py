"""Streamable HTTP: the SDK's ASGI app behind the rules of `bgem3 serve`.

Loopback by default; any other address needs a bearer key (`--mcp-api-key`) or `--insecure-no-auth`
(checked at start-up: `command.check_options`). `Host` and `Origin` are checked by
`bgem3_embeddings.http_guard` (one definition of the rule for every local server): without a key, only
a name of this machine is a valid Host (DNS rebinding), and a browser request from another origin is
refused, as the MCP specification requires of a streamable HTTP server. The SDK's own Host/Origin
check is turned off so that the rule is not defined twice; its Content-Type check stays.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import typer

from bgem3_embeddings.http_guard import ASGIApp, GuardRules, HttpGuard, Receive, Scope, Send

from .options import KEY_OPTION, McpOptions

MCP_PATH = "/mcp"
HOST_OPTION = "--allowed-host NAME (or BGEM3_MCP_ALLOWED_HOSTS)"
# JSON-RPC's "invalid request": what an MCP client reads from a refused HTTP request.
INVALID_REQUEST = -32600


def jsonrpc_error(path: str, status: int, message: str, param: str | None = None) -> ASGIApp:
    """A refusal as an MCP client reads it: a JSON-RPC error object with the one-line message."""
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": message}})
    data = body.encode("utf-8")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    return app


def guard_rules(options: McpOptions) -> GuardRules:
    """`bgem3 serve`'s rules for this server: the Host checked unless a key guards it, no CORS origin."""
    return GuardRules(
        bound_host=options.host,
        extra_hosts=options.allowed_hosts,
        check_host=options.api_key is None,
        host_option=HOST_OPTION,
        origin_option=None,
    )


def create_http_app(server: Any, options: McpOptions) -> ASGIApp:
    """The SDK's streamable HTTP app at /mcp, inside the bearer key (if any) and the Host/Origin guard."""
    from mcp.server.transport_security import TransportSecuritySettings

    from bgem3_embeddings.serve.limits import BearerAuth

    app: ASGIApp = server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        host=options.host,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    if options.api_key:
        app = BearerAuth(app, options.api_key, key_option=KEY_OPTION.split(" ")[0])
    return HttpGuard(app, guard_rules(options), error=jsonrpc_error)


def serve_http(server: Any, options: McpOptions, sock: socket.socket) -> None:
    """Print the address, serve on the bound socket until SIGTERM / Ctrl-C."""
    from bgem3_embeddings.serve.server import serve_app

    # Listening before the address is printed: a client that connects on reading it waits in the backlog
    # while uvicorn starts, instead of being refused.
    sock.listen(2048)
    host = f"[{options.host}]" if ":" in options.host else options.host
    address = f"http://{host}:{sock.getsockname()[1]}{MCP_PATH}"
    typer.echo(f"bgem3-qdrant mcp: {address} (streamable HTTP); Ctrl-C stops it")
    serve_app(create_http_app(server, options), sock, options.log_level)
