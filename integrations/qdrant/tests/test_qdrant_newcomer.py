"""What a newcomer meets first (issue 45), run as a user runs the commands: listing and dropping
collections, an empty query, `BGEM3_MODEL=tiny`, a folder with nothing to ingest, unreadable input, modes
eval has and search has not, `search --json` without hits, counts said in words.

Failures that decide what a person sees (one line, no traceback) run in a fresh process (`run_module`); the
rest run the same entry point (`run_cli`) in this process, where TensorFlow and the model are loaded once.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bgem3_qdrant import Ingestor, open_store, resolve_target
from bgem3_qdrant.cli import app
from bgem3_qdrant.errors import BGEM3QdrantError
from bgem3_qdrant.ingest import IngestOptions
from bgem3_qdrant.mcp_server.tools import McpTools
from bgem3_qdrant.search import Searcher
from bgem3_qdrant.sources import SKIP_INVALID
from bgem3_qdrant.ui.errors import PageError
from bgem3_qdrant.ui.session import StoreSession

from bgem3_embeddings.query_text import EMPTY_QUERY, EmptyQueryError
from tests.optional import require_module
from tests.support import assert_clean_failure, run_module, without_modules

SMALL = IngestOptions(chunk_size=48, chunk_overlap=8, show_progress=False)
READS = "ingest reads .txt, .md, .markdown, .jsonl and .ndjson files"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, long_corpus: Path, encoder: Any) -> Path:
    """A store holding `kb`, the test corpus (metadata keys lang and topic)."""
    path = tmp_path_factory.mktemp("newcomer") / "store"
    with open_store(resolve_target(path=str(path))) as st:
        Ingestor(st, "kb", encoder, options=SMALL).ingest_paths([long_corpus])
    return path


def cli(capsys: pytest.CaptureFixture[str], *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    """`bgem3-qdrant ARGS` through the command's own entry point (run_cli), in this process: exit code,
    stdout, stderr. `stdin`: what the user types."""
    from bgem3_embeddings.cli_support import run_cli

    saved = sys.stdin
    sys.stdin = io.StringIO(stdin or "")
    try:
        with pytest.raises(SystemExit) as done:
            run_cli(app, expected=(BGEM3QdrantError,), argv=list(args), start_tensorflow=False)
    finally:
        sys.stdin = saved
    captured = capsys.readouterr()
    code = done.value.code
    return (code if isinstance(code, int) else 0), captured.out, captured.err


LONG_QUERY = "how do I keep a sourdough starter alive " * 48  # over 512 tokens, under the page's limit


def long_query_note(encoder: Any) -> str:
    """What every place that searches with LONG_QUERY says once: its token count, 512 of them read."""
    whole = len(encoder.tokenizer.encode_batch([LONG_QUERY], 10**6)[0])
    assert whole > 512
    return f"the query has {whole:,} tokens, more than the model reads: only its first 512 were used " + (
        "(max length)"
    )


def one_error(err: str) -> str:
    """The one `error: ...` line an expected failure prints (nothing else on stderr)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def hold_store(path: Path) -> subprocess.Popen[str]:
    """Another process that holds the embedded store until its stdin closes."""
    code = ("import sys; from pathlib import Path; from bgem3_qdrant.stores.layout import lock_store; "
            "f = lock_store(Path(sys.argv[1])); print('held', flush=True); sys.stdin.read()")  # fmt: skip
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


# -- item 2: collections and drop
def test_collections_lists_what_the_mcp_tool_says(
    store: Path, encoder: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, "collections", "--path", str(store))
    assert code == 0 and not err, err
    with open_store(resolve_target(path=str(store))) as st:
        chunks = st.count("kb")
    head, line = out.splitlines()
    assert head == f"Qdrant Edge store at {store}: 1 collection"
    assert line.startswith(f"  kb: {chunks} chunks, model {encoder.model_id} (float32), ColBERT float16, "
                           "unpooled, no copy in RAM, ")  # fmt: skip
    assert " KiB on disk; metadata keys: lang, topic" in line

    code, out, _ = cli(capsys, "collections", "--path", str(store), "--json")
    listed = json.loads(out)
    session = StoreSession(resolve_target(path=str(store)), encoder)
    try:  # what the MCP `collections` tool answers, one JSON object per collection
        tools = McpTools(session, default_collection="kb", model_id="m")
        tool = [json.loads(t) for t in tools.collections({})]
    finally:
        session.close()
    assert code == 0 and listed == {"store": f"Qdrant Edge store at {store}", "collections": tool}
    assert tool[0]["chunks"] == chunks and tool[0]["storage"] == "float16, unpooled, no copy in RAM"

    open_store(resolve_target(path=str(tmp_path / "empty"))).close()
    code, out, _ = cli(capsys, "collections", "--path", str(tmp_path / "empty"))
    assert code == 0 and "holds no collection yet" in out
    code, _, err = cli(capsys, "collections", "--path", str(tmp_path / "nowhere"))
    assert code == 1 and f"no store at {tmp_path / 'nowhere'}" in one_error(err)
    assert not (tmp_path / "nowhere").exists()  # listing creates no store


def test_drop_asks_refuses_a_held_store_and_deletes(
    store: Path, corpus: Path, encoder: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with open_store(resolve_target(path=str(store))) as st:
        Ingestor(st, "old", encoder, options=SMALL).ingest_paths([corpus / "bread.txt"])
        chunks = st.count("old")
    what = f"'old' ({chunks} chunk{'s' if chunks > 1 else ''})"
    drop = ("drop", "-c", "old", "--path", str(store))
    code, _, err = cli(capsys, *drop)  # no answer: nothing deleted
    assert code == 1 and f"drop asks before it deletes {what}: answer y, or pass --yes" in err
    code, out, err = cli(capsys, *drop, stdin="n\n")  # declined: the user's answer, not a failure (issue 58)
    assert code == 0 and out.strip() == "kept 'old': nothing was deleted" and "error" not in err

    holder = hold_store(store)
    try:
        assert_clean_failure(run_module("bgem3_qdrant", *drop, "--yes"), 1, "open in another process")
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)

    code, out, err = cli(capsys, *drop, stdin="y\n")
    assert code == 0 and f"delete collection {what} of the Qdrant Edge store at {store}? [y/N]" in err
    assert out.strip() == f"deleted collection {what} of the Qdrant Edge store at {store}"
    assert sorted(p.name for p in (store / "collections").iterdir()) == ["kb"]  # nothing left aside
    code, _, err = cli(capsys, *drop, "--yes")
    assert code == 1 and "collection 'old' does not exist in Qdrant Edge store at" in err
    assert "which holds 'kb'; use one of them (-c)" in err


def test_an_unknown_collection_names_the_existing_ones(
    store: Path, tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, "search", "q", "-c", "kbb", "--path", str(store), "-m", str(tiny_checkpoint))
    line = one_error(err)
    assert code == 1 and "collection 'kbb' does not exist in Qdrant Edge store at " in line
    assert "which holds 'kb'; use one of them (-c), or create it with `bgem3-qdrant ingest PATH" in line


# -- item 3: an empty query, one rule
def test_an_empty_query_is_one_error_everywhere(
    store: Path, tiny_checkpoint: Path, encoder: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ("-c", "kb", "--path", str(store), "-m", str(tiny_checkpoint))
    assert_clean_failure(run_module("bgem3_qdrant", "search", "", *common), 1, EMPTY_QUERY)
    code, _, err = cli(capsys, "search", " \t", *common, "--explain")
    assert code == 1 and one_error(err) == f"error: {EMPTY_QUERY}"
    code, _, err = cli(capsys, "search", "sourdough", "  ", *common)
    assert code == 1 and one_error(err) == f"error: QUERY 2: {EMPTY_QUERY}"
    done = run_module("bgem3_embeddings.cli", "explain", "  ", "a passage", "--model", str(tiny_checkpoint))
    assert done.returncode == 2 and EMPTY_QUERY in done.stderr and "Traceback" not in done.stderr

    empty = pytest.raises(EmptyQueryError, match=re.escape(EMPTY_QUERY))
    with open_store(resolve_target(path=str(store))) as st, empty:
        Searcher(st, "kb", encoder).search("\n")
    session = StoreSession(resolve_target(path=str(store)), encoder)
    try:  # the page's API and the MCP tools say the same
        for call in (lambda: session.search("kb", " "), lambda: session.explain_pair("", "p"),
                     lambda: McpTools(session, default_collection="kb", model_id="m").find({"query": " "})):
            with pytest.raises(PageError) as refused:
                call()
            assert str(refused.value) == EMPTY_QUERY and refused.value.status == 400
    finally:
        session.close()


# -- issue 58, item 7: a query past the model's length is said once, with its counts
def test_a_cut_query_is_said_once(
    store: Path, tiny_checkpoint: Path, encoder: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ("-c", "kb", "--path", str(store), "-m", str(tiny_checkpoint), "-k", "3")
    code, out, err = cli(capsys, "search", LONG_QUERY, *common, "--explain")
    assert code == 0 and err.strip() == f"warning: {long_query_note(encoder)}", err
    assert out.count("3. [") == 1 and "note: the query" not in out  # not under each hit
    code, out, err = cli(capsys, "search", "sourdough", LONG_QUERY, *common, "--json")
    assert code == 0 and err.strip() == f"warning: QUERY 2: {long_query_note(encoder)}", err
    assert [json.loads(line)["query"] for line in out.splitlines()] == ["sourdough", LONG_QUERY]


# -- item 5: `--json` without hits; issue 58, items 2 and 3: the collection's own model, `tiny` anywhere
def test_search_uses_the_recorded_model_and_tiny_works_from_any_folder(
    store: Path, tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    search = ("search", "sourdough", "-c", "kb", "--path", str(store), "--json")
    # From another folder, no --model (the collection records the checkpoint that wrote it) and
    # `--reranker tiny`: the tiny cross-encoder is generated once into the cache, with a line saying so.
    tiny_root = tmp_path / "cache"
    done = run_module("bgem3_qdrant", *search, "-k", "2", "--reranker", "tiny",
                      env={"BGEM3_TINY_DIR": str(tiny_root)}, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == (
        f"generating the tiny random cross-encoder once into {tiny_root / 'reranker'} (random weights: every "
        "step runs, its scores and rankings mean nothing)"
    )
    found = json.loads(done.stdout)
    assert found["ordered_by"] == "cross_encoder" and found["reranker"] == "tiny" and len(found["hits"]) == 2
    # No hits (a filter nothing matches): the same JSON object, with an empty list, and exit 0.
    code, out, err = cli(capsys, *search, "--filter", "lang=zz")
    assert code == 0, err
    assert json.loads(out) == {"query": "sourdough", "mode": "rerank", "hits": []}

    # A collection whose recorded folder is gone: one line naming it and --model, before anything loads.
    moved = tmp_path / "model-copy"
    shutil.copytree(tiny_checkpoint, moved)
    (tmp_path / "doc.txt").write_text("Feed the sourdough starter daily.", encoding="utf-8")
    code, _, err = cli(capsys, "ingest", str(tmp_path / "doc.txt"), "-c", "gone", "--path", str(store),
                       "--model", str(moved))  # fmt: skip
    assert code == 0, err
    shutil.rmtree(moved)
    code, _, err = cli(capsys, "search", "sourdough", "-c", "gone", "--path", str(store))
    line = one_error(err)
    assert code == 1 and f"collection 'gone' records the model that wrote it, {moved}, which is not" in line
    assert line.endswith("pass that checkpoint with --model")
    code, _, err = cli(capsys, "drop", "-c", "gone", "--path", str(store), "--yes")
    assert code == 0, err


# -- issue 58, item 2: mcp and ui, which open their store lazily, also use the model the store records
def test_mcp_and_ui_use_the_model_the_store_records(
    tiny_checkpoint: Path, encoder: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "s"
    moved = tmp_path / "model-copy"
    shutil.copytree(tiny_checkpoint, moved)
    (tmp_path / "doc.txt").write_text("Feed the sourdough starter daily.", encoding="utf-8")
    for name, model in (("gone", moved), ("kb", tiny_checkpoint)):
        code, _, err = cli(capsys, "ingest", str(tmp_path / "doc.txt"), "-c", name, "--path", str(store),
                           "--model", str(model))  # fmt: skip
        assert code == 0, err
    shutil.rmtree(moved)
    # The recorded folder is gone: one line naming it and --model, before anything loads.
    code, _, err = cli(capsys, "mcp", "--path", str(store), "-c", "gone")
    line = one_error(err)
    assert code == 1 and f"collection 'gone' records the model that wrote it, {moved}, which is not" in line
    # The page searches every collection: two models recorded is one line naming each, and --model.
    code, _, err = cli(capsys, "ui", "--path", str(store))
    assert code == 1 and one_error(err) == (
        f"error: the store's collections record 2 models (gone: {moved}; kb: {tiny_checkpoint}): pass the "
        "one to search with as --model (a collection of another model is listed, not searched)"
    )
    code, _, err = cli(capsys, "drop", "-c", "gone", "--path", str(store), "--yes")
    assert code == 0, err

    # As a user starts them, no --model: the page names the recorded checkpoint and finds with it ...
    import httpx

    proc = subprocess.Popen([sys.executable, "-m", "bgem3_qdrant", "ui", "--path", str(store), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert found and f", {tiny_checkpoint}); Ctrl-C stops it" in line, line + (
            proc.stderr.read() if proc.poll() is not None and proc.stderr else "")  # fmt: skip
        asked = {"collection": "kb", "query": "sourdough"}
        hits = httpx.post(found.group(0) + "api/search", json=asked, timeout=60)
        assert hits.status_code == 200 and hits.json()["modes"]["rerank"][0]["text"].startswith("Feed")
        assert hits.json()["warnings"] == []
        cut = httpx.post(found.group(0) + "api/search", json={**asked, "query": LONG_QUERY}, timeout=60)
        assert cut.status_code == 200 and cut.json()["warnings"] == [long_query_note(encoder)]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    # ... and the MCP server, as a client's config starts it (the SDK's own stdio client), finds with it.
    require_module("mcp", reason="the MCP server needs the mcp extra")
    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    mcp_args = ["-m", "bgem3_qdrant", "mcp", "--path", str(store), "-c", "kb"]
    params = StdioServerParameters(command=sys.executable, args=mcp_args, env=dict(os.environ))
    answers: list[Any] = []

    async def converse() -> None:
        with (tmp_path / "mcp.err").open("w") as errlog:  # the server's stderr (pytest's has no fd)
            async with stdio_client(params, errlog) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                answers.append(await session.call_tool("find", {"query": "sourdough", "k": 1}))
                answers.append(await session.call_tool("find", {"query": LONG_QUERY, "k": 1}))

    anyio.run(converse)
    result, cut = answers
    assert not result.is_error, (result.content, (tmp_path / "mcp.err").read_text())
    assert json.loads(result.content[0].text)["text"].startswith("Feed") and len(result.content) == 1
    # A query past the model's length (issue 58, item 7): the hits, then one line saying so.
    assert not cut.is_error and [c.text for c in cut.content[1:]] == [
        f"warning: {long_query_note(encoder)}"
    ]


def test_tiny_without_torch_names_the_pip_command(tmp_path: Path) -> None:
    env = without_modules(tmp_path / "stubs", "torch")
    env["BGEM3_TINY_DIR"] = str(tmp_path / "tiny")
    done = run_module("bgem3_embeddings.cli", "encode", "hello", "--model", "tiny", env=env, cwd=tmp_path)
    where = tmp_path / "tiny" / "bge-m3"
    assert_clean_failure(done, 1, f"a tiny random embedding model generated on first use into {where}",
                         'run pip install "torch==2.13.0" "sentencepiece>=0.2"')  # fmt: skip
    assert not (tmp_path / "tiny").exists()


# -- items 6, 7 and 12: nothing to ingest, unreadable input, counts in words
def test_a_folder_with_nothing_to_ingest_is_an_error(
    tmp_path: Path, tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "scans").mkdir()
    for name in ("a.pdf", "b.png"):
        (tmp_path / "scans" / name).write_bytes(b"%PDF-1.4 \x00\x01")
    done = run_module("bgem3_qdrant", "ingest", str(tmp_path / "scans"), "-c", "kb",
                      "--path", str(tmp_path / "s"), "--model", str(tiny_checkpoint))  # fmt: skip
    assert_clean_failure(done, 1, f"{tmp_path / 'scans'}: nothing to ingest: {READS}, found only 2 other "
                         "files (a.pdf, b.png)", "--glob PATTERN")  # fmt: skip
    assert not (tmp_path / "s").exists()  # no store, no collection

    # A folder among others with nothing read: one warning line in the CLI's style, the rest ingested.
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("Feed the sourdough starter daily.", encoding="utf-8")
    done = run_module("bgem3_qdrant", "ingest", str(tmp_path / "notes"), str(tmp_path / "scans"), "-c", "kb",
                      "--path", str(tmp_path / "s"), "--model", str(tiny_checkpoint))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == f"warning: {tmp_path / 'scans'}: nothing read there ({READS})"
    assert "1 file, 1 document, 1 chunk, 1 encoded, 0 unchanged" in done.stdout
    # Run again with nothing new (issue 58, item 12): said so, no "0 tokens in 0.0s = 0 tokens/s".
    code, out, err = cli(capsys, "ingest", str(tmp_path / "notes"), "-c", "kb", "--path", str(tmp_path / "s"),
                         "--model", str(tiny_checkpoint))  # fmt: skip
    assert code == 0, err
    assert "1 chunk, 0 encoded, 1 unchanged, nothing new to encode (" in out and "tokens/s" not in out, out
    assert "the recommended storage for under 10,000 chunks, as the input's size suggests" in done.stdout


def test_a_first_ingest_that_stores_nothing_creates_no_collection(
    tmp_path: Path, tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "s"
    (tmp_path / "random.txt").write_bytes(bytes([0xFF, 0xCB, 0x00, 0x9F]) * 16)
    (tmp_path / "bad.jsonl").write_text('{"text": \n{"text": "fine"}\n', encoding="utf-8")
    (tmp_path / "blank.txt").write_text(" \n\t\n", encoding="utf-8")
    common = ("--path", str(store), "--model", str(tiny_checkpoint))
    code, _, err = cli(capsys, "ingest", str(tmp_path / "random.txt"), "-c", "first", *common)
    line = one_error(err)
    assert code == 1 and "random.txt: not valid utf-8 text (byte 0xff at offset 0)" in line
    assert line.endswith(f"stopped there, nothing was written; {SKIP_INVALID}")
    code, _, err = cli(capsys, "ingest", str(tmp_path / "bad.jsonl"), "-c", "first", *common)
    assert code == 1 and "bad.jsonl:1: invalid JSON" in err and err.strip().endswith(SKIP_INVALID)
    code, _, err = cli(capsys, "ingest", str(tmp_path / "blank.txt"), "-c", "first", *common)
    assert code == 1 and one_error(err) == (
        "error: nothing to store: 1 file read, 1 document: 1 empty; collection 'first' was not created"
    )
    with open_store(resolve_target(path=str(store))) as st:
        assert st.list_collections() == []


# -- item 8: one vocabulary of modes
def test_eval_only_modes_are_refused_by_search_saying_why(
    store: Path, tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for mode, why in (("colbert", "the paper's multi-vector ranking"), ("all", "compute_score weighted sum")):
        code, _, err = cli(capsys, "search", "q", "-c", "kb", "--mode", mode, "--path", str(store),
                           "-m", str(tiny_checkpoint))  # fmt: skip
        line = one_error(err)
        assert code == 1 and f"--mode {mode} is a mode of `bgem3-qdrant eval --modes` only: " in line
        assert why in line and "Search with one of dense, sparse, hybrid, rerank" in line


# -- issue 58, item 6: ordinary mistakes are one line naming what is wrong, never "this is a bug"
def test_ordinary_mistakes_name_the_option(
    store: Path, tiny_checkpoint: Path, tiny_reranker_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ("-c", "kb", "--path", str(store))
    code, _, err = cli(capsys, "search", "tea", *common, "-m", str(tiny_checkpoint), "-k", "0")
    assert code == 2 and err.startswith("error: Invalid value for '--limit' / '-k': ") and "1" in err
    assert "bug" not in err and "unexpected" not in err
    reranker_here = (
        f"{tiny_reranker_checkpoint} is a cross-encoder reranker, not an embedding model: "
        "pass it as --reranker"
    )
    code, _, err = cli(capsys, "search", "tea", *common, "--model", str(tiny_reranker_checkpoint))
    assert code == 1 and reranker_here in one_error(err)
    done = run_module("bgem3_embeddings.cli", "encode", "tea", "--model", str(tiny_reranker_checkpoint))
    assert_clean_failure(done, 1, reranker_here, "(--model)")
    assert "--precision" not in done.stderr
