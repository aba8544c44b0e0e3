"""Keep a local HTTP server for this machine's own clients: the `Host`, `Origin` and `Content-Type` rules.

A server on 127.0.0.1 is reachable from every web page the user's browser opens. Two attacks follow, and
this module refuses both before any route runs (a pure ASGI wrapper: no web framework, no TensorFlow):

- DNS rebinding: a page on `attacker.example` re-points its name to 127.0.0.1 and reads the answers as
  same-origin ones (Ollama's CVE-2024-28224). The browser still sends `Host: attacker.example`, so the
  Host is checked: when no API key is set, only a name of this machine is accepted — `localhost`, a
  loopback IP (`127.0.0.1`, `[::1]`), the bound address, the address the connection reached, and the names
  the user adds (`*` accepts any) — with or without a port, in any case, with or without a trailing dot.
  A request with no Host at all (HTTP/1.0) is no browser's and passes. With a key, the Host is not checked:
  a rebinding page does not know the key, and a proxy may use any name.
- Cross-site requests: a page elsewhere can POST a form or a `fetch` with `Content-Type: text/plain`
  (or none) without a CORS preflight, and the server would run it. So a POST, PUT, PATCH or DELETE must
  say `Content-Type: application/json` (or `application/*+json`), and a request with an `Origin` is served
  only when that origin is the server's own (the origin's host and port are the request's Host; the scheme
  is not compared, so a TLS proxy in front changes nothing), is one of `cors_origins`, or names one of the
  names the user added. `Origin: null` (a sandboxed frame, a local file) is refused. Clients that are not
  browsers send no Origin and pass.

Each refusal is a 4xx with a one-line message that names the option to change (403 for Host and Origin,
415 for the content type), shaped by `error` (default: `{"error": {"message", "type", "param", "code"}}`,
OpenAI's shape, which `bgem3 serve` and the page use).

    rules = GuardRules(bound_host="127.0.0.1", extra_hosts=parse_host_list(["my-box.lan"]),
                       check_host=api_key is None, host_option="--allowed-host NAME (or BGEM3_ALLOWED_HOSTS)")
    app = HttpGuard(app, rules)           # outside the routes, inside CORS (so a refusal carries its headers)
    refusal(rules, scope)                 # the (status, message, param) a request gets, or None

Used by `bgem3 serve` (serve/app.py), `bgem3-qdrant ui` (ui/app.py) and the MCP server over HTTP.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
# (path, status, one-line message, param) -> an ASGI app that sends the error response
ErrorFactory = Callable[[str, int, str, str | None], ASGIApp]

ANY_HOST = "*"
LOCAL_NAMES = frozenset({"localhost"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
# A host name or IP literal as a user may give it: letters, digits, '-', '_', '.', ':' (IPv6), brackets.
_NAME = re.compile(r"^(\*|\[[0-9a-f:.%a-z]+\]|[a-z0-9_.:-]+)$")


def normalize_name(name: str) -> str:
    """A host name or IP as compared here: lower case, no trailing dot, no IPv6 brackets, IPs canonical
    (`[::0001]` -> `::1`, `::ffff:127.0.0.1` -> `127.0.0.1`)."""
    name = name.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    ip = _ip(name)
    return str(ip) if ip is not None else name


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def split_host(value: str, scheme: str = "http") -> tuple[str, int | None] | None:
    """A `Host` header (or an origin's host part) as (normalized name, port); the scheme's default port is
    None, as browsers leave it out. None when it is no host at all (spaces, a path, a user name)."""
    value = value.strip().lower()
    if not value or any(c in value for c in "/@?# \t\\"):
        return None
    port: str | None = None
    if value.startswith("["):  # [::1] or [::1]:8000
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[: end + 1], value[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                return None
            port = rest[1:]
    elif value.count(":") == 1:
        name, port = value.split(":")
    else:  # a name, an IPv4 address, or a bare IPv6 address (not valid in a Host, read leniently)
        name = value
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        return None
    number = int(port) if port else None
    if number is not None and number == _DEFAULT_PORTS.get(scheme):
        number = None
    name = normalize_name(name)
    return (name, number) if name else None


def parse_host_list(values: Iterable[str], option: str = "--allowed-host") -> tuple[str, ...]:
    """The names a user adds (an option given several times, an environment variable with commas or spaces),
    normalized; a ValueError naming `option` for a value that is no host name (a URL, a path)."""
    names: list[str] = []
    for value in values:
        for part in re.split(r"[,\s]+", value):
            if not part:
                continue
            name = normalize_name(part)
            if not _NAME.match(name) or "://" in part or (":" in name and _ip(name) is None):
                raise ValueError(
                    f"{part!r} is not a host name ({option}): give a name or an IP address, such as "
                    "my-box.lan or 192.168.1.5, without scheme, port or path"
                )
            if name not in names:
                names.append(name)
    return tuple(names)


def is_json(content_type: str | None) -> bool:
    """Whether a Content-Type header says JSON: application/json or application/<something>+json."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


@dataclass(frozen=True)
class GuardRules:
    """What one server accepts (see the module's docstring for the rules).

    bound_host: the address the server listens on (`--host`): a Host naming it is this machine.
    extra_hosts: names the user added (`parse_host_list`); `*` turns the Host check off.
    check_host: the DNS-rebinding check; off when an API key guards the server.
    cors_origins: browser origins allowed besides the server's own (`bgem3 serve --cors-origin`).
    json_only: a POST, PUT, PATCH or DELETE must carry a JSON Content-Type.
    host_option / origin_option: the options the refusals name (origin_option None: the server has none,
        so a cross-site request is refused with no way to allow it).
    """

    bound_host: str = "127.0.0.1"
    extra_hosts: tuple[str, ...] = ()
    check_host: bool = True
    cors_origins: tuple[str, ...] = ()
    json_only: bool = True
    host_option: str = "--allowed-host NAME"
    origin_option: str | None = None
    _names: frozenset[str] = field(init=False, repr=False, compare=False)
    _origins: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_hosts", tuple(normalize_name(n) for n in self.extra_hosts))
        object.__setattr__(self, "cors_origins", tuple(self.cors_origins))
        names = set(LOCAL_NAMES) | set(self.extra_hosts)
        if self.bound_host:
            names.add(normalize_name(self.bound_host))
        object.__setattr__(self, "_names", frozenset(names))
        origins = frozenset(o.strip().lower().rstrip("/") for o in self.cors_origins)
        object.__setattr__(self, "_origins", origins)

    def host_allowed(self, host: str | None, server_address: str | None = None) -> bool:
        """Whether a request with this Host header may be served (the Host check alone)."""
        if not self.check_host or ANY_HOST in self.extra_hosts or host is None:
            return True
        parsed = split_host(host)
        if parsed is None:
            return False
        name = parsed[0]
        if name in self._names or (server_address and name == normalize_name(server_address)):
            return True
        ip = _ip(name)
        return ip is not None and ip.is_loopback

    def origin_allowed(self, origin: str, host: str | None, scheme: str = "http") -> bool:
        """Whether a request with this Origin may be served: the server's own, a CORS one, an added name."""
        origin = origin.strip().lower()
        if origin.rstrip("/") in self._origins:
            return True
        parts = urlsplit(origin)
        if origin == "null" or parts.scheme not in ("http", "https") or parts.path not in ("", "/"):
            return False
        theirs = split_host(parts.netloc, parts.scheme)
        if theirs is None:
            return False
        if theirs[0] in self.extra_hosts:
            return True
        ours = split_host(host, scheme) if host else None
        return ours is not None and theirs == ours


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if bytes(key).lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _shown(value: str) -> str:
    """A header value as a refusal quotes it: printable, short."""
    clean = "".join(c if c.isprintable() else "?" for c in value)
    return json.dumps(clean[:80] + ("..." if len(clean) > 80 else ""))


def refusal(rules: GuardRules, scope: Scope) -> tuple[int, str, str] | None:
    """Why this request is refused, as (status, one-line message, the header at fault); None: served."""
    host = _header(scope, b"host")
    server = scope.get("server")
    server_address = str(server[0]) if server else None
    if not rules.host_allowed(host, server_address):
        return (
            403,
            f"Host {_shown(host or '')} does not name this server (a DNS-rebinding guard): if it names this "
            f"machine, add it with {rules.host_option}",
            "host",
        )
    origin = _header(scope, b"origin")
    if origin is not None:
        scheme = str(scope.get("scheme") or "http")
        scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)
        if not rules.origin_allowed(origin, host, scheme):
            own = f"{scheme}://{host}" if host else "unknown: the request has no Host"
            allow = (
                f"; to let a browser app on that origin call this server, start it with {rules.origin_option}"
                if rules.origin_option
                else ""
            )
            message = f"cross-site request refused: Origin {_shown(origin)} is not this server's own ({own})"
            return 403, message + allow, "origin"
    method = str(scope.get("method", "GET")).upper()
    if scope.get("type") == "http" and rules.json_only and method in BODY_METHODS:
        content_type = _header(scope, b"content-type")
        if not is_json(content_type):
            got = _shown(content_type) if content_type else "none"
            return (
                415,
                f"{method} needs Content-Type: application/json (got {got}); forms and text bodies, which "
                "other sites can send, are refused",
                "content_type",
            )
    return None


def json_error(path: str, status: int, message: str, param: str | None = None) -> ASGIApp:
    """The default refusal: `{"error": {"message", "type", "param", "code"}}` as JSON."""
    kind = "permission_error" if status == 403 else "invalid_request_error"
    body = json.dumps({"error": {"message": message, "type": kind, "param": param, "code": param}}).encode()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


class HttpGuard:
    """The ASGI wrapper that applies `rules` to every HTTP request and WebSocket handshake."""

    def __init__(self, app: ASGIApp, rules: GuardRules, error: ErrorFactory = json_error) -> None:
        self.app = app
        self.rules = rules
        self.error = error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refused = refusal(self.rules, scope)
        if refused is None:
            await self.app(scope, receive, send)
            return
        status, message, param = refused
        logger.info("refused %s %s: %s", scope.get("method", "WEBSOCKET"), scope.get("path", ""), message)
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
            return
        await self.error(str(scope.get("path", "")), status, message, param)(scope, receive, send)
