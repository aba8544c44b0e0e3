"""`bgem3 serve` as a process against a page on another site: a forged Host (DNS rebinding), a cross-site
Origin, a text/plain or type-less body are refused in one line naming the option; this machine's names,
the stock openai client and a user-added name still work; with a key the Host is not checked. The address
is connected to the moment it is printed (tests/command_server.py: it listens before printing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.optional import require_module

require_module("fastapi", reason="the server needs the serve extra")

from tests.command_server import started_command  # noqa: E402
from tests.support import assert_clean_failure, run_module  # noqa: E402

SERVE = ["-m", "bgem3_embeddings.cli", "serve", "--port", "0", "--log-level", "warning"]
APP = "https://app.example"  # a browser app the user allowed with --cors-origin
EMBED = {"input": ["hello"]}


@pytest.fixture(scope="module")
def plain(tiny_checkpoint: Path) -> Iterator[str]:
    """No key; names added through the environment variable (comma separated)."""
    env = {"BGEM3_ALLOWED_HOSTS": "env-box.lan, Other-Box.lan."}
    with started_command([*SERVE, "--model", str(tiny_checkpoint)], "stderr", env, "/health") as (_, url, _l):
        yield url


def port_of(url: str) -> str:
    return url.rsplit(":", 1)[1]


def message(response: httpx.Response) -> str:
    error = response.json()["error"]
    text = error["message"] if isinstance(error, dict) else error  # OpenAI's shape or TEI's
    assert isinstance(text, str) and text and "\n" not in text, text
    return str(text)


def test_a_forged_host_is_refused_on_every_route(plain: str) -> None:
    """What a DNS-rebinding page sends: its own name in Host."""
    for host in ("attacker.example", f"attacker.example:{port_of(plain)}", "127.0.0.1.nip.io"):
        headers = {"Host": host}
        for method, path in (("POST", "/v1/embeddings"), ("GET", "/v1/models"), ("POST", "/embed")):
            body = EMBED if path != "/embed" else {"inputs": ["hello"]}
            r = httpx.request(method, plain + path, json=body if method == "POST" else None, headers=headers)
            assert r.status_code == 403, (host, path, r.text)
            text = message(r)
            assert "--allowed-host NAME (or BGEM3_ALLOWED_HOSTS)" in text and "DNS-rebinding" in text
        assert "hello" not in r.text
    # TEI's routes answer in TEI's shape
    tei = httpx.post(plain + "/embed", json={"inputs": ["x"]}, headers={"Host": "attacker.example"})
    assert tei.json()["error_type"] == "Unauthorized"


def test_this_machines_names_and_the_added_ones_pass(plain: str) -> None:
    port = port_of(plain)
    for host in ("127.0.0.1", f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST.", f"[::1]:{port}",
                 "env-box.lan", f"other-box.lan:{port}"):  # fmt: skip
        r = httpx.post(plain + "/v1/embeddings", json=EMBED, headers={"Host": host})
        assert r.status_code == 200, (host, r.text)
    assert httpx.get(plain + "/v1/models", headers={"Host": "third-box.lan"}).status_code == 403


def test_the_stock_openai_client_works_on_127_0_0_1_and_localhost(plain: str) -> None:
    openai = require_module("openai")
    for base in (plain, f"http://localhost:{port_of(plain)}"):
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        answer = client.embeddings.create(model="tiny", input=["hello", "world"])
        assert len(answer.data) == 2 and len(answer.data[0].embedding) > 0


def test_a_body_that_is_not_json_is_refused(plain: str) -> None:
    """A cross-site form or a fetch with text/plain (or no type) is sent without a CORS preflight."""
    payload = b'{"input": ["hello"]}'
    for content_type in ("text/plain;charset=UTF-8", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": content_type} if content_type else {}
        r = httpx.post(plain + "/v1/embeddings", content=payload, headers=headers)
        assert r.status_code == 415, (headers, r.text)
        assert "Content-Type: application/json" in message(r)
    assert httpx.post(plain + "/v1/embeddings", content=payload,
                      headers={"Content-Type": "application/json"}).status_code == 200  # fmt: skip


def test_a_cross_site_origin_is_refused_and_the_servers_own_passes(plain: str) -> None:
    for origin in ("http://attacker.example", "null", f"http://localhost:{port_of(plain)}"):
        r = httpx.post(plain + "/v1/embeddings", json=EMBED, headers={"Origin": origin})
        assert r.status_code == 403, (origin, r.text)
        assert "cross-site request refused" in message(r) and "--cors-origin ORIGIN" in message(r)
    own = httpx.post(plain + "/v1/embeddings", json=EMBED, headers={"Origin": plain})
    assert own.status_code == 200, own.text


def test_cli_names_and_cors_origins(tiny_checkpoint: Path) -> None:
    """--allowed-host on the command line; --cors-origin's app may call, others may not."""
    args = [*SERVE, "--model", str(tiny_checkpoint), "--allowed-host", "cli-box.lan", "--cors-origin", APP]
    with started_command(args, "stderr", first_path="/health") as (_, url, _lines):
        assert httpx.get(url + "/v1/models", headers={"Host": "cli-box.lan:8000"}).status_code == 200
        assert httpx.get(url + "/v1/models", headers={"Host": "env-box.lan"}).status_code == 403
        allowed = httpx.post(url + "/v1/embeddings", json=EMBED, headers={"Origin": APP})
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == APP
        # A JSON POST from the allowed app needs a preflight, which CORS answers.
        preflight = httpx.options(url + "/v1/embeddings", headers={
            "Origin": APP, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type"})  # fmt: skip
        assert preflight.status_code == 200, preflight.text
        # A refusal the allowed app gets carries the CORS header, so the app can read why.
        refused = httpx.post(url + "/v1/embeddings", content=b"{}", headers={"Origin": APP})
        assert refused.status_code == 415 and refused.headers["access-control-allow-origin"] == APP
        other = httpx.post(url + "/v1/embeddings", json=EMBED, headers={"Origin": "https://evil.example"})
        assert other.status_code == 403 and "access-control-allow-origin" not in other.headers


def test_with_a_key_the_host_is_not_checked(tiny_checkpoint: Path) -> None:
    args = [*SERVE, "--model", str(tiny_checkpoint), "--api-key", "s3cret"]
    with started_command(args, "stderr", first_path="/health") as (_, url, _lines):
        forged = {"Host": "proxy.example"}
        assert httpx.get(url + "/v1/models", headers=forged).status_code == 401
        keyed = {**forged, "Authorization": "Bearer s3cret"}
        assert httpx.post(url + "/v1/embeddings", json=EMBED, headers=keyed).status_code == 200
        # still JSON only, and still no cross-site Origin
        assert httpx.post(url + "/v1/embeddings", content=b"{}", headers=keyed).status_code == 415
        cross = httpx.post(
            url + "/v1/embeddings", json=EMBED, headers={**keyed, "Origin": "http://a.example"}
        )
        assert cross.status_code == 403


def test_a_bad_allowed_host_is_one_line(tiny_checkpoint: Path) -> None:
    done = run_module(
        "bgem3_embeddings.cli", "serve", "--model", str(tiny_checkpoint), "--allowed-host", "http://box.lan/"
    )
    assert_clean_failure(done, 1, "'http://box.lan/' is not a host name (--allowed-host)")
