"""http_guard's rules, request by request: the Host check against DNS rebinding, the Origin check against
cross-site requests, JSON-only bodies, and the one-line refusals (the commands are tested as processes in
tests/test_serve_host_origin.py and integrations/qdrant/tests/test_qdrant_ui_guard.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from bgem3_embeddings.http_guard import (
    GuardRules,
    HttpGuard,
    Message,
    parse_host_list,
    refusal,
    split_host,
)

LOCAL = GuardRules(bound_host="127.0.0.1", host_option="--allowed-host NAME (or BGEM3_ALLOWED_HOSTS)")


def scope(
    host: str | None = "127.0.0.1:8000",
    method: str = "GET",
    origin: str | None = None,
    content_type: str | None = None,
    server: tuple[str, int] | None = ("127.0.0.1", 8000),
    kind: str = "http",
) -> dict[str, Any]:
    headers = [(b"host", host.encode())] if host is not None else []
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    if content_type is not None:
        headers.append((b"content-type", content_type.encode()))
    return {"type": kind, "method": method, "path": "/api/search", "scheme": "http", "headers": headers,
            "server": server}  # fmt: skip


@pytest.mark.parametrize(
    "host",
    ["localhost", "localhost:8000", "LOCALHOST:8000", "localhost.:8000", "127.0.0.1", "127.0.0.1:8000",
     "127.1.2.3:8000", "[::1]", "[::1]:8000", "[0:0:0:0:0:0:0:1]:8000", "[::ffff:127.0.0.1]:8000"],
)  # fmt: skip
def test_names_of_this_machine_pass(host: str) -> None:
    assert refusal(LOCAL, scope(host)) is None


@pytest.mark.parametrize(
    "host",
    ["attacker.example", "attacker.example:8000", "localhost.attacker.example", "127.0.0.1.nip.io:8000",
     "192.168.1.5:8000", "", "local host", "user@localhost", "localhost:99999", "[::1"],
)  # fmt: skip
def test_other_hosts_are_refused_naming_the_option(host: str) -> None:
    refused = refusal(LOCAL, scope(host))
    assert refused is not None
    status, message, param = refused
    assert status == 403 and param == "host" and "\n" not in message
    assert "--allowed-host NAME (or BGEM3_ALLOWED_HOSTS)" in message and "DNS-rebinding" in message


def test_a_request_without_host_passes() -> None:
    """HTTP/1.0 sends no Host; a browser always does."""
    assert refusal(LOCAL, scope(None)) is None


def test_the_bound_address_and_the_reached_address_are_this_machine() -> None:
    lan = GuardRules(bound_host="192.168.1.5")
    assert refusal(lan, scope("192.168.1.5:8000", server=("192.168.1.5", 8000))) is None
    anywhere = GuardRules(bound_host="0.0.0.0")
    assert refusal(anywhere, scope("10.0.0.7:8000", server=("10.0.0.7", 8000))) is None
    assert refusal(anywhere, scope("10.0.0.8:8000", server=("10.0.0.7", 8000))) is not None
    assert refusal(anywhere, scope("box.example:8000", server=("10.0.0.7", 8000))) is not None
    v6 = GuardRules(bound_host="::1")
    assert refusal(v6, scope("[::1]:8000", server=("::1", 8000))) is None


def test_added_names_pass_and_star_turns_the_check_off() -> None:
    added = GuardRules(extra_hosts=parse_host_list(["My-Box.lan.", "other.lan,third.lan"]))
    for host in ("my-box.lan", "MY-BOX.LAN:8000", "other.lan", "third.lan:1"):
        assert refusal(added, scope(host)) is None, host
    assert refusal(added, scope("fourth.lan")) is not None
    assert refusal(GuardRules(extra_hosts=("*",)), scope("anything.example")) is None


def test_with_a_key_the_host_is_not_checked() -> None:
    keyed = GuardRules(check_host=False)
    assert refusal(keyed, scope("attacker.example:8000")) is None


def test_parse_host_list_refuses_urls_ports_and_paths() -> None:
    assert parse_host_list(["a.lan b.lan", "a.lan", "[::1]", "*"]) == ("a.lan", "b.lan", "::1", "*")
    for bad in ("http://a.lan", "a.lan:8000", "a.lan/x", "a lan?"):
        with pytest.raises(ValueError, match=r"\(--allowed-host\)"):
            parse_host_list([bad])


@pytest.mark.parametrize(
    ("host", "origin"),
    [("127.0.0.1:8000", "http://127.0.0.1:8000"), ("localhost:8000", "http://localhost:8000"),
     ("LocalHost:8000", "http://localhost:8000/"), ("[::1]:8000", "http://[::1]:8000"),
     ("127.0.0.1", "http://127.0.0.1"), ("127.0.0.1:80", "http://127.0.0.1"),
     ("127.0.0.1", "https://127.0.0.1")],  # a TLS proxy in front: the scheme is not compared
)  # fmt: skip
def test_the_pages_own_origin_passes(host: str, origin: str) -> None:
    assert refusal(LOCAL, scope(host, "POST", origin, "application/json")) is None


@pytest.mark.parametrize(
    ("host", "origin"),
    [("127.0.0.1:8000", "http://attacker.example"), ("127.0.0.1:8000", "http://127.0.0.1:8001"),
     ("127.0.0.1:8000", "http://localhost:8000"), ("127.0.0.1:8000", "null"),
     ("127.0.0.1:8000", "file://"), ("127.0.0.1:8000", "http://127.0.0.1:8000/page"), (None, "http://x")],
)  # fmt: skip
def test_other_origins_are_refused(host: str | None, origin: str) -> None:
    refused = refusal(LOCAL, scope(host, "POST", origin, "application/json"))
    assert refused is not None and refused[0] == 403 and refused[2] == "origin", refused
    assert "cross-site request refused" in refused[1] and "\n" not in refused[1]


def test_cors_origins_and_added_names_pass_and_the_option_is_named() -> None:
    cors = GuardRules(cors_origins=("https://app.example",), extra_hosts=("my-box.lan",),
                      origin_option="--cors-origin ORIGIN")  # fmt: skip
    assert refusal(cors, scope("127.0.0.1:8000", "POST", "https://app.example", "application/json")) is None
    assert (
        refusal(cors, scope("127.0.0.1:8000", "POST", "https://my-box.lan:8443", "application/json")) is None
    )
    refused = refusal(cors, scope("127.0.0.1:8000", "GET", "https://evil.example"))
    assert refused is not None and "--cors-origin ORIGIN" in refused[1]
    # With a key the Origin is still checked (a browser app elsewhere needs --cors-origin to read anything).
    keyed = GuardRules(check_host=False)
    assert refusal(keyed, scope("127.0.0.1:8000", "POST", "http://evil.example", "application/json"))


NOT_JSON = [None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x"]  # fmt: skip


@pytest.mark.parametrize("content_type", NOT_JSON)
def test_a_body_that_is_not_json_is_refused(content_type: str | None) -> None:
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        refused = refusal(LOCAL, scope(method=method, content_type=content_type))
        assert refused is not None and refused[0] == 415 and refused[2] == "content_type"
        assert "Content-Type: application/json" in refused[1] and "\n" not in refused[1]


def test_json_bodies_and_bodyless_methods_pass() -> None:
    for content_type in (
        "application/json",
        "Application/JSON; charset=utf-8",
        "application/merge-patch+json",
    ):
        assert refusal(LOCAL, scope(method="POST", content_type=content_type)) is None
    for method in ("GET", "HEAD", "OPTIONS"):
        assert refusal(LOCAL, scope(method=method)) is None
    assert refusal(GuardRules(json_only=False), scope(method="POST", content_type="text/plain")) is None


def test_split_host() -> None:
    assert split_host("Example.COM.:8080") == ("example.com", 8080)
    assert split_host("[::1]:443", "https") == ("::1", None)
    assert split_host("localhost:80") == ("localhost", None)
    assert split_host("a/b") is None and split_host("[::1]x") is None and split_host("h:0") is None


def _run(app: Any, request_scope: dict[str, Any]) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(app(request_scope, receive, send))
    return sent


def test_the_middleware_answers_one_json_line_and_passes_the_rest() -> None:
    reached: list[str] = []

    async def inner(s: Any, receive: Any, send: Any) -> None:
        reached.append(s["type"])

    guard = HttpGuard(inner, LOCAL)
    sent = _run(guard, scope("attacker.example:8000"))
    assert sent[0]["status"] == 403 and (b"content-type", b"application/json") in sent[0]["headers"]
    body = json.loads(sent[1]["body"])
    assert body["error"]["param"] == "host" and "--allowed-host" in body["error"]["message"]
    assert not reached
    _run(guard, scope("localhost:8000"))
    _run(guard, {"type": "lifespan"})
    assert reached == ["http", "lifespan"]
    closed = _run(guard, scope("attacker.example", kind="websocket"))
    assert closed == [{"type": "websocket.close", "code": 1008, "reason": closed[0]["reason"]}]
