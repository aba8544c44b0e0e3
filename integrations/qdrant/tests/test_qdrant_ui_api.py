"""`bgem3-qdrant ui`'s JSON API and command, without a browser: the answers the page draws, every bad
input answered with a 4xx and one line, the store opened lazily and retried, the headers that keep the
page on this machine, the key, and the command itself (started as a user starts it)."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.optional import require_module

require_module("fastapi", reason="the page's server needs the serve extra")

from bgem3_qdrant import Ingestor, open_store, resolve_target  # noqa: E402
from bgem3_qdrant.cli import app  # noqa: E402
from bgem3_qdrant.errors import BGEM3QdrantError  # noqa: E402
from bgem3_qdrant.sources import Document  # noqa: E402
from bgem3_qdrant.ui.app import STATIC, create_ui_app  # noqa: E402
from bgem3_qdrant.ui.evals import EvalFolder  # noqa: E402
from bgem3_qdrant.ui.session import MAX_PASSAGE_CHARS, MAX_QUERY_CHARS, StoreSession  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402
from ui_support import (  # noqa: E402
    CHUNKING,
    COLLECTION,
    EVAL_COLLECTIONS,
    EVAL_FILE,
    IDF,
    OTHER,
    POOLED,
    SYNTHETIC,
    UNICODE,
    UNICODE_TEXTS,
    build_store,
    eval_report,
    session_for,
    write_eval_dir,
)

from bgem3_embeddings.cli_support import run_cli  # noqa: E402
from bgem3_embeddings.serve.settings import DEFAULT_MAX_MATRIX_CELLS  # noqa: E402
from tests.support import run_module, tiny_server  # noqa: E402

QUERY = "sourdough starter flour"
RYE = "Rye flour makes it lively."


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, long_corpus: Path, encoder: Any) -> tuple[Path, int]:
    return build_store(tmp_path_factory.mktemp("ui_api"), long_corpus, encoder)


@pytest.fixture(scope="module")
def session(built: tuple[Path, int], encoder: Any) -> Iterator[StoreSession]:
    s = session_for(built[0], encoder)
    yield s
    s.close()


@pytest.fixture(scope="module")
def eval_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_eval_dir(tmp_path_factory.mktemp("evals"))


@pytest.fixture(scope="module")
def client(session: StoreSession, eval_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_ui_app(session, EvalFolder(eval_dir))) as c:
        yield c


def one_document_store(path: Path, encoder: Any, text: str) -> Path:
    with open_store(resolve_target(path=str(path))) as store:
        Ingestor(store, COLLECTION, encoder, options=CHUNKING).ingest_documents([Document("d", "d", text)])
    return path


def message(response: Any) -> str:
    """The one-line message of an error answer."""
    text = response.json()["error"]["message"]
    assert isinstance(text, str) and text and "\n" not in text, text
    return text


def test_collections_show_model_precision_pooling_and_chunks(
    client: TestClient, built: tuple[Path, int], encoder: Any
) -> None:
    listed = {c["name"]: c for c in client.get("/api/collections").json()["collections"]}
    assert set(listed) == {COLLECTION, OTHER, UNICODE, POOLED, IDF}
    kb = listed[COLLECTION]
    assert kb["problem"] is None
    assert kb["chunks"] == built[1] > 0
    assert kb["model"] == encoder.model_id and kb["precision"] == "float32"
    assert kb["pooling"] == 1 and kb["colbert_dtype"] == "float16" and kb["size"] == encoder.hidden_size
    assert kb["sparse_modifier"] == "none" and listed[IDF]["sparse_modifier"] == "idf"
    assert listed[POOLED]["pooling"] == 2 and listed[POOLED]["sparse_modifier"] == "none"
    assert {"lang=en", "lang=fr", "lang=xss", "topic=rerank"} <= set(kb["filters"])
    assert "another model" in listed[OTHER]["problem"] and "BAAI/some-other-model" in listed[OTHER]["problem"]


def test_search_highlights_the_terms_explain_finds(client: TestClient, encoder: Any) -> None:
    """Every hit's highlighted terms (from its stored sparse vector, no encoding) are the sparse terms
    `explain` computes by encoding the hit's text: same tokens, order, products and spans."""
    data = client.post("/api/search", json={"collection": COLLECTION, "query": QUERY, "limit": 5}).json()
    assert list(data["modes"]) == ["dense", "sparse", "hybrid", "rerank"]
    assert all(len(hits) >= 1 for hits in data["modes"].values())
    hits = {h["id"]: h for mode_hits in data["modes"].values() for h in mode_hits}
    assert any(h["terms"] for h in hits.values())  # the check below compares something
    for h in hits.values():
        expected = encoder.explain(QUERY, h["text"]).sparse_terms[:24]
        assert [t["token_id"] for t in h["terms"]] == [t.token_id for t in expected]
        for got, want in zip(h["terms"], expected, strict=True):
            assert got["product"] == pytest.approx(want.product, rel=1e-4, abs=1e-7)
            assert [tuple(s) for s in got["spans"]] == list(want.passage_spans)
    for mode, mode_hits in data["modes"].items():
        assert [h["rank"] for h in mode_hits] == list(range(1, len(mode_hits) + 1)), mode
    timing = data["timing"]
    assert set(timing["search_ms"]) == set(data["modes"])
    assert 0 <= timing["embed_ms"] <= timing["searched_ms"] <= timing["server_ms"]


def test_offsets_count_code_points_and_the_search_says_how_it_scores(
    client: TestClient, encoder: Any
) -> None:
    """Every span the API sends counts code points (the answers say so): the hits' term spans and the
    explanation's token spans are the Python encoder's, after emoji, CJK Extension B, mathematical letters and
    combining marks (the browser tests check the page converts them). A search says its collection's ColBERT
    pooling and sparse modifier, what makes its scores differ from an explanation's."""
    scoring = {UNICODE: {"colbert_pooling": 1, "sparse_modifier": "none"},
               POOLED: {"colbert_pooling": 2, "sparse_modifier": "none"},
               IDF: {"colbert_pooling": 1, "sparse_modifier": "idf"}}  # fmt: skip
    for name, want in scoring.items():
        data = client.post("/api/search", json={"collection": name, "query": UNICODE_TEXTS["math"]}).json()
        assert data["scoring"] == want and data["offset_unit"] == "code point", name
    after_astral = 0
    for key, text in UNICODE_TEXTS.items():
        data = client.post("/api/search", json={"collection": UNICODE, "query": text}).json()
        own = next(h for hits in data["modes"].values() for h in hits if h["text"] == text)
        want = encoder.explain(text, text, colbert_matrix=False)
        assert own["terms"], key  # each text shares sparse terms with itself (see ui_support)
        assert [t["token_id"] for t in own["terms"]] == [t.token_id for t in want.sparse_terms[:24]], key
        for got, term in zip(own["terms"], want.sparse_terms, strict=False):
            assert [tuple(s) for s in got["spans"]] == list(term.passage_spans), key
            after_astral += sum(any(ord(c) > 0xFFFF for c in text[:a]) for a, _ in got["spans"])
        asked = {"collection": UNICODE, "id": own["id"], "query": text}
        answer = client.post("/api/explain", json=asked).json()
        assert answer["offset_unit"] == "code point"
        spans = [(t["start"], t["stop"]) for t in answer["passage"]["tokens"]]
        assert spans == [(t.start, t.stop) for t in want.passage.tokens], key
    assert after_astral >= 5  # spans that a UTF-16 index would put in the wrong place


def test_explanations_are_the_encoders(client: TestClient, encoder: Any) -> None:
    data = client.post("/api/search", json={"collection": COLLECTION, "query": QUERY, "limit": 3}).json()
    hit = data["modes"]["rerank"][0]
    got = client.post("/api/explain", json={"collection": COLLECTION, "id": hit["id"], "query": QUERY}).json()
    for answer, passage in ((got, hit["text"]), (None, "BGE M3 is an embedding model for flour and water")):
        if answer is None:
            answer = client.post("/api/explain-pair", json={"query": QUERY, "passage": passage}).json()
        want = encoder.explain(QUERY, passage, colbert_matrix=True)
        assert answer["passage"]["text"] == passage
        assert [t["token_id"] for t in answer["sparse"]["terms"]] == [t.token_id for t in want.sparse_terms]
        pairs = [(m["query_token"], m["passage_token"]) for m in answer["colbert"]["matches"]]
        assert pairs == [(m.query_token, m.passage_token) for m in want.colbert_matches]
        matrix = answer["colbert"]["matrix"]
        assert (len(matrix), len(matrix[0])) == want.colbert_matrix.shape
        for mode in ("dense", "sparse", "colbert", "all"):
            assert answer[mode]["score"] == pytest.approx(want.scores[mode], abs=1e-5)
    assert got["hit"]["id"] == hit["id"] and got["hit"]["source"] == hit["source"]


BAD_INPUT = [
    ("post", "/api/search", {"collection": COLLECTION, "query": "   "}, 400, "the query is empty"),
    ("post", "/api/search", {"collection": COLLECTION, "query": "x" * (MAX_QUERY_CHARS + 1)}, 413, "limit"),
    ("post", "/api/search", {"collection": "nope", "query": QUERY}, 404, "collection 'nope' does not exist"),
    ("post", "/api/search", {"collection": OTHER, "query": QUERY}, 409, "another model"),
    ("post", "/api/search", {"collection": COLLECTION, "query": QUERY, "filters": ["lang"]}, 400, "value"),
    ("post", "/api/search", {"collection": COLLECTION, "query": QUERY, "limit": 0}, 400, "limit must be"),
    ("post", "/api/search", {"collection": COLLECTION, "query": QUERY, "limit": "ten"}, 400, "whole number"),
    ("post", "/api/search", {"collection": COLLECTION}, 400, "no 'query'"),
    ("post", "/api/search", "not json", 400, "not valid JSON"),
    ("post", "/api/search", [1, 2], 400, "must be a JSON object"),
    ("post", "/api/explain", {"collection": OTHER, "id": 1, "query": QUERY}, 409, "another model"),
    ("post", "/api/explain", {"collection": COLLECTION, "id": "0" * 32, "query": QUERY}, 404, "no point"),
    ("post", "/api/explain", {"collection": COLLECTION, "id": "../x", "query": QUERY}, 400, "not a UUID"),
    ("post", "/api/explain-pair", {"query": QUERY, "passage": ""}, 400, "the passage is empty"),
    ("post", "/api/explain-pair", {"query": QUERY, "passage": "a" * (MAX_PASSAGE_CHARS + 1)}, 413,
     f"over the page's limit of {MAX_PASSAGE_CHARS:,}"),
    ("post", "/api/explain-pair", {"query": QUERY, "passage": "p", "weights": [0, 0, 0]}, 400, "sum to zero"),
    ("get", "/api/evals/broken.json", None, 422, "broken.json: not valid JSON"),
    ("get", "/api/evals/notes.json", None, 422, "not an evaluation report"),
    ("get", "/api/evals/missing.json", None, 404, "no evaluation file"),
    ("get", "/api/evals/..%2F..%2Fetc%2Fpasswd", None, 404, "passwd"),
    ("get", "/api/nothing", None, 404, "no such page or API route"),
    ("post", "/api/collections", {}, 405, "method not allowed"),
]  # fmt: skip


def test_a_pair_past_the_matrix_cells_is_413(session: StoreSession, eval_dir: Path) -> None:
    """The page's explanations carry the ColBERT matrix (the heatmap): a typed pair whose matrix would be
    larger than the cap is one 413 line naming the cells and the limit; a smaller pair is explained."""
    with TestClient(create_ui_app(session, EvalFolder(eval_dir), max_matrix_cells=200)) as small:
        refused = small.post("/api/explain-pair", json={"query": QUERY, "passage": RYE * 20})
        assert refused.status_code == 413, refused.text
        line = message(refused)
        assert line.startswith("the pair's ColBERT matrix would have ") and "\n" not in line
        assert "over the page's limit of 200 cells: shorten the passage or the query" in line
        assert small.post("/api/explain-pair", json={"query": "flour", "passage": RYE}).status_code == 200
        # the length limits are said first, as before
        long_passage = {"query": QUERY, "passage": "a" * (MAX_PASSAGE_CHARS + 1)}
        assert "over the page's limit of 8,000" in message(small.post("/api/explain-pair", json=long_passage))


def test_answers_are_written_off_the_event_loop(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """An explanation's matrix at the cell limit is about 20 MB of JSON: it is written in a worker thread
    (no event loop running there), so other requests are answered meanwhile. The written text is the JSON
    Starlette's JSONResponse would send."""
    import asyncio

    import bgem3_qdrant.ui.app as ui_app

    on_loop: list[bool] = []
    real_dumps = ui_app.dumps

    def recording_dumps(value: Any) -> str:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return real_dumps(value)

    monkeypatch.setattr(ui_app, "dumps", recording_dumps)
    answer = client.post("/api/explain-pair", json={"query": "flour 東京 🐕", "passage": RYE})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert body["colbert"]["matrix"] and body["offset_unit"] == "code point"
    assert json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")) == answer.text
    assert client.get("/api/collections").status_code == 200
    assert on_loop == [False, False], on_loop


@pytest.mark.parametrize(("method", "path", "body", "status", "phrase"), BAD_INPUT)
def test_bad_input_is_a_4xx_with_one_line_and_the_api_keeps_working(
    client: TestClient, method: str, path: str, body: Any, status: int, phrase: str
) -> None:
    if method == "get":
        response = client.get(path)
    elif isinstance(body, str):
        response = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        response = client.post(path, json=body)
    assert response.status_code == status, response.text
    assert phrase in message(response)
    after = client.post("/api/search", json={"collection": COLLECTION, "query": QUERY, "limit": 2})
    assert after.status_code == 200


def test_a_store_another_process_holds_is_tried_again(tmp_path: Path, encoder: Any) -> None:
    """The page starts; while the store is held its API says so in one line; once free, it answers."""
    path = one_document_store(tmp_path / "store", encoder, "flour and water")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; from bgem3_qdrant.stores.layout import "
         "lock_store; f = lock_store(Path(sys.argv[1])); print('held', flush=True); sys.stdin.read()",
         str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    session = session_for(path, encoder)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with TestClient(create_ui_app(session, EvalFolder(None))) as c:
            for response in (c.get("/api/collections"), c.post("/api/search", json={"collection": "kb",
                                                                                     "query": "flour"})):
                assert response.status_code == 409
                assert "open in another process" in message(response)
            assert c.get("/api/info").status_code == 200  # what needs no store still answers
            holder.communicate("", timeout=30)
            names = [x["name"] for x in c.get("/api/collections").json()["collections"]]
            assert names == [COLLECTION]
            hits = c.post("/api/search", json={"collection": COLLECTION, "query": "flour"}).json()
            assert hits["modes"]["dense"][0]["text"] == "flour and water"
    finally:
        holder.kill()
        session.close()


def test_the_key_guards_the_api_not_the_page(session: StoreSession) -> None:
    with TestClient(create_ui_app(session, EvalFolder(None), api_key="s3cret")) as c:
        assert c.get("/").status_code == 200 and c.get("/static/js/main.js").status_code == 200
        missing = c.get("/api/info")
        assert missing.status_code == 401 and "API key missing" in message(missing)
        assert "--ui-api-key" in message(missing)  # the option of this command, not bgem3 serve's
        assert c.get("/api/info", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert c.get("/api/info", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_every_answer_keeps_the_page_on_this_machine(client: TestClient) -> None:
    """CSP: nothing but this origin, no inline script; the page's files fetch nothing from elsewhere and
    never insert HTML (document texts go in as text)."""
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for response in (page, client.get("/api/info"), client.get("/api/nothing")):
        csp = response.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp and "http" not in csp
        assert response.headers["x-content-type-options"] == "nosniff"
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page.text, re.S)
    assert scripts and all('src="/static/' in attrs and not body.strip() for attrs, body in scripts)
    assert not re.search(r"\son\w+=", page.text)  # no inline event handlers
    files = sorted(p for p in STATIC.rglob("*") if p.is_file())
    assert {p.suffix for p in files} == {".html", ".css", ".js", ".svg"}
    for f in files:
        text = f.read_text(encoding="utf-8")
        # The SVG namespace names a vocabulary, it is never fetched.
        urls = set(re.findall(r"(?:https?:)?//[\w.-]+\.\w+", text)) - {"http://www.w3.org"}
        assert not urls, f"{f.name} names {urls}"
        if f.suffix == ".js":
            assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(", text), f
            served = client.get(f"/static/{f.relative_to(STATIC).as_posix()}")
            assert served.status_code == 200 and "javascript" in served.headers["content-type"]


def test_eval_folder_lists_good_and_malformed_files(client: TestClient) -> None:
    files = {f["name"]: f for f in client.get("/api/evals").json()["files"]}
    assert set(files) == {EVAL_FILE, "broken.json", "notes.json"}
    assert files[EVAL_FILE]["ok"] and files[EVAL_FILE]["dataset"] == SYNTHETIC
    assert files[EVAL_FILE]["collections"] == list(EVAL_COLLECTIONS)
    for name in ("broken.json", "notes.json"):
        error = files[name]["error"]
        assert not files[name]["ok"] and error.startswith(f"{name}: ") and "\n" not in error
        assert "bgem3-qdrant eval" in error
    report = client.get(f"/api/evals/{EVAL_FILE}").json()
    written = eval_report()
    assert [c["name"] for c in report["collections"]] == list(EVAL_COLLECTIONS)
    first = report["collections"][0]
    assert first["modes"]["rerank"]["ndcg@10"] == written["modes"]["rerank"]["ndcg@10"]
    assert first["bytes_per_chunk"] == written["bytes_per_chunk"]
    second = report["collections"][1]
    compared = written["compare"][EVAL_COLLECTIONS[1]]
    assert second["modes"]["all"]["mrr@10"] == compared["modes"]["all"]["mrr@10"]
    assert second["colbert_pooling"] == 2
    assert [m["title"] for m in report["measures"]] == ["nDCG@10", "Recall@100", "MRR@10"]


def _ui(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        run_cli(app, expected=(BGEM3QdrantError,), argv=["ui", *args], start_tensorflow=False)
    out = capsys.readouterr()
    return int(exit_info.value.code or 0), out.err + out.out


def test_ui_command_refuses_what_cannot_work_in_one_line(
    built: tuple[Path, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = str(built[0])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        cases = [
            (["--path", store, "--host", "0.0.0.0"], "set --ui-api-key KEY"),
            (["--path", str(tmp_path / "none")], "no store at"),
            (["--path", store, "--eval-dir", str(tmp_path / "none")], "(--eval-dir)"),
            (["--path", store, "--port", port], f"port {port} on 127.0.0.1 is in use"),
        ]
        for args, phrase in cases:
            code, output = _ui(capsys, *args)
            lines = [line for line in output.splitlines() if line.strip()]
            assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), output
            assert phrase in output, output


def test_ui_command_prints_its_address_and_serves(
    tmp_path: Path, tiny_checkpoint: Path, encoder: Any
) -> None:
    """As a user runs it: through `bgem3 serve` (--encoder-url), on a free port; the matrix-cells 413 said
    by the running command; SIGTERM ends it with 0."""
    path = one_document_store(tmp_path / "store", encoder, RYE)
    import httpx

    with tiny_server(tiny_checkpoint) as encoder_url:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bgem3_qdrant", "ui", "--path", str(path), "--encoder-url", encoder_url,
             "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
            assert found and str(path) in line, line + (proc.stderr.read() if proc.poll() is not None else "")
            url = found.group(0)
            assert "<title>" in httpx.get(url, timeout=60).text
            asked = {"collection": COLLECTION, "query": "rye flour"}
            hits = httpx.post(url + "api/search", json=asked, timeout=60).json()  # a loaded CI box is slow
            assert hits["modes"]["rerank"][0]["text"] == RYE
            # The explanation is the server's (RemoteEncoder.explain_many -> POST /v1/bgem3/explain).
            asked = {"collection": COLLECTION, "id": hits["modes"]["rerank"][0]["id"], "query": "rye flour"}
            explained = httpx.post(url + "api/explain", json=asked, timeout=60).json()
            want = encoder.explain("rye flour", RYE, colbert_matrix=True)
            assert explained["all"]["score"] == pytest.approx(want.combined, abs=1e-5)
            assert len(explained["colbert"]["matrix"]) == want.colbert_matrix.shape[0]
            # A typed pair past the page's ColBERT matrix cells: one 413 line naming the limit, before the
            # encoder runs (511 query x ~2,666 passage tokens, within the character limits).
            big = {"query": "wo " * (MAX_QUERY_CHARS // 3), "passage": "ok " * (MAX_PASSAGE_CHARS // 3)}
            refused = httpx.post(url + "api/explain-pair", json=big, timeout=60)
            assert refused.status_code == 413, refused.text
            line = message(refused)
            assert line.startswith("the pair's ColBERT matrix would have ")
            assert f"over the page's limit of {DEFAULT_MAX_MATRIX_CELLS:,} cells" in line
            small = httpx.post(url + "api/explain-pair", json={"query": "rye", "passage": RYE}, timeout=60)
            assert small.status_code == 200, small.text  # and the page keeps explaining
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
        finally:
            proc.kill()


def test_ui_help_names_the_options() -> None:
    done = run_module("bgem3_qdrant", "ui", "--help")
    assert done.returncode == 0, done.stderr
    for option in ("--path", "--url", "--encoder-url", "--eval-dir", "--host", "--port", "--ui-api-key"):
        assert option in done.stdout
