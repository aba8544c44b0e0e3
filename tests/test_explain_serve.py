"""`POST /v1/bgem3/explain` and `RemoteEncoder.explain`: FlagEmbedding's numbers through the server, the same
Explanation as a local encoder, and one-line 4xx answers to bad input (the server keeps serving).

Also `bgem3 explain` run as a user runs it, locally and through the server.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.optional import require_module

require_module("fastapi", reason="the server needs the serve extra")

from bgem3_embeddings.query_text import EMPTY_QUERY  # noqa: E402
from bgem3_embeddings.remote import RemoteEncoder  # noqa: E402
from tests.flagembedding_ref import flagembedding_m3  # noqa: E402
from tests.support import (  # noqa: E402
    assert_clean_failure,
    assert_health_answers_during,
    run_module,
    tiny_server,
)
from tests.tolerances import APPROX  # noqa: E402

QUERY = "What is BGE M3?"
MATRIX_CAP = 1000  # cells: the QUERY x PASSAGES matrices fit (about 10 x 25), a long passage does not
PASSAGES = [
    "What is BGE M3? BGE M3 is an embedding model.",
    "BM25 is a bag-of-words retrieval function that ranks documents",
]


@pytest.fixture(scope="module")
def url(tiny_checkpoint: Path) -> Iterator[str]:
    with tiny_server(
        tiny_checkpoint,
        model_name="bge-m3-tiny",
        max_chars_per_input=2000,
        max_colbert_matrix_cells=MATRIX_CAP,
    ) as base:
        yield base


def _close(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two explanations' JSON forms: same tokens and terms, numbers within float32 rounding."""
    assert a["query"] == b["query"] and a["passage"] == b["passage"]
    for mode in ("dense", "sparse", "colbert", "all"):
        assert a[mode]["score"] == pytest.approx(b[mode]["score"], **APPROX)
    assert [t["token_id"] for t in a["sparse"]["terms"]] == [t["token_id"] for t in b["sparse"]["terms"]]
    for x, y in zip(a["sparse"]["terms"], b["sparse"]["terms"], strict=True):
        assert x["product"] == pytest.approx(y["product"], **APPROX)
        assert x["passage_spans"] == y["passage_spans"]
    assert len(a["colbert"]["matches"]) == len(b["colbert"]["matches"])
    for x, y in zip(a["colbert"]["matches"], b["colbert"]["matches"], strict=True):
        assert x["query_token"] == y["query_token"]
        assert x["similarity"] == pytest.approx(y["similarity"], **APPROX)
    assert a["all"]["weights"] == b["all"]["weights"]


def test_remote_explain_is_the_local_explanation(url: str, tiny_encoder: Any, tiny_checkpoint: Path) -> None:
    remote = RemoteEncoder(url)
    flag = flagembedding_m3(tiny_checkpoint)
    for passage in PASSAGES:
        got = remote.explain(QUERY, passage, colbert_matrix=True)
        _close(got.to_dict(), tiny_encoder.explain(QUERY, passage).to_dict())
        assert got.colbert_matrix is not None and got.colbert_matrix.shape == (
            len(got.query.tokens) - 1,
            len(got.passage.tokens) - 1,
        )
        ref = flag.compute_score([(QUERY, passage)], weights_for_different_modes=[0.4, 0.2, 0.4])
        assert got.combined == pytest.approx(ref["colbert+sparse+dense"][0], **APPROX)
        assert got.sparse == pytest.approx(ref["sparse"][0], **APPROX)
    many = remote.explain_many(QUERY, PASSAGES, weights=(1, 1, 1))
    assert [e.passage.text for e in many] == PASSAGES
    assert many[0].weights == (1.0, 1.0, 1.0)


def test_plain_http_client_gets_the_documented_shape(url: str) -> None:
    answer = httpx.post(f"{url}/v1/bgem3/explain", json={"query": QUERY, "passage": PASSAGES[0]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["object"] == "list" and body["model"] == "bge-m3-tiny" and body["usage"]["total_tokens"] > 0
    item = body["data"][0]
    assert item["index"] == 0
    assert set(item) == {"index", "query", "passage", "dense", "sparse", "colbert", "all"}
    assert item["colbert"]["matrix"] is None
    assert item["all"]["weights"] == {"dense": 0.4, "sparse": 0.2, "colbert": 0.4}
    token = item["passage"]["tokens"][1]
    assert set(token) == {"id", "token", "start", "stop", "special"}


@pytest.mark.parametrize(
    ("body", "status", "phrase"),
    [
        # The rule every text a user sends follows (query_text.py): 400, as OpenAI's API and TEI answer it.
        ({"query": "", "passage": "p"}, 400, EMPTY_QUERY),
        ({"query": " \n", "passage": "p"}, 400, EMPTY_QUERY),
        ({"query": "q", "passage": " "}, 400, "`passage[0]` is empty (or only whitespace)"),
        ({"query": "q", "passages": ["p", ""]}, 400, "`passages[1]` is empty (or only whitespace)"),
        ({"query": "q"}, 422, "give one of `passage`"),
        ({"query": "q", "passage": "p", "passages": ["p"]}, 422, "give one of `passage`"),
        ({"query": "q", "passage": "x" * 2001}, 413, "max_chars_per_input"),
        ({"query": QUERY, "passage": "ok " * 600, "colbert_matrix": True}, 413, "max_colbert_matrix_cells"),
        ({"query": "q", "passage": "p", "weights_for_different_modes": [0, 0, 0]}, 422, "sum to zero"),
        ({"query": "q", "passage": "p", "weights_for_different_modes": [1, 1]}, 422, "weights_for_different"),
        ({"query": 3, "passage": "p"}, 422, "query"),
        ({"query": "q", "passage": "p", "colbert": True}, 422, "colbert"),
    ],
)
def test_bad_input_is_a_4xx_with_one_line(url: str, body: dict[str, Any], status: int, phrase: str) -> None:
    answer = httpx.post(f"{url}/v1/bgem3/explain", json=body)
    assert answer.status_code == status, answer.text
    message = answer.json()["error"]["message"]
    assert phrase in message and "\n" not in message
    # and the server keeps serving
    assert httpx.post(f"{url}/v1/bgem3/explain", json={"query": "q", "passage": "p"}).status_code == 200


def test_matrix_cap_names_the_sizes_and_the_answer_without_matrix_is_served(url: str) -> None:
    body = {"query": QUERY, "passages": ["ok " * 300, "ok " * 300], "colbert_matrix": True}
    refused = httpx.post(f"{url}/v1/bgem3/explain", json=body)
    assert refused.status_code == 413
    error = refused.json()["error"]
    assert error["param"] == error["code"] == "max_colbert_matrix_cells"
    assert error["message"].startswith("the ColBERT matrix would have ") and "\n" not in error["message"]
    assert "ask without colbert_matrix" in error["message"]
    assert httpx.get(f"{url}/v1/bgem3/info").json()["limits"]["max_colbert_matrix_cells"] == MATRIX_CAP
    served = httpx.post(f"{url}/v1/bgem3/explain", json={**body, "colbert_matrix": False})
    assert served.status_code == 200 and len(served.json()["data"]) == 2


def test_health_answers_while_a_big_explain_runs(tiny_checkpoint: Path) -> None:
    """Taking the scores apart and writing a large answer (here a 2,100 x 700 matrix, ~28 MB of JSON) run
    off the event loop: /health keeps answering meanwhile. (Before, the loop wrote the JSON itself and a
    probe waited for most of the request.)"""
    body = {"query": "wo " * 700, "passage": "ok " * 350, "colbert_matrix": True, "max_query_length": 8192}
    with tiny_server(tiny_checkpoint, max_colbert_matrix_cells=1 << 22) as base:
        answer = assert_health_answers_during(
            base, lambda: httpx.post(f"{base}/v1/bgem3/explain", json=body, timeout=300)
        )
    assert answer.status_code == 200, answer.text[:300]
    item = answer.json()["data"][0]
    matrix = np.asarray(item["colbert"]["matrix"], dtype=np.float32)
    assert matrix.shape == (len(item["query"]["tokens"]) - 1, len(item["passage"]["tokens"]) - 1)
    assert matrix.size > 1_000_000


def test_remote_checks_texts_before_asking(url: str) -> None:
    with pytest.raises(ValueError, match="query is empty"):
        RemoteEncoder(url).explain("", "p")


# ------------------------------------------------------------------ bgem3 explain, as a user runs it
def test_bgem3_explain_prints_80_columns_and_json(tiny_checkpoint: Path, tiny_encoder: Any, url: str) -> None:
    done = run_module("bgem3_embeddings.cli", "explain", QUERY, PASSAGES[0], "--model", str(tiny_checkpoint))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    e = tiny_encoder.explain(QUERY, PASSAGES[0])
    assert lines[0] == (
        f"dense {e.dense:.4f}  sparse {e.sparse:.4f}  colbert {e.colbert:.4f}  all {e.combined:.4f}"
    )
    assert any(line.startswith("sparse terms") for line in lines)
    assert any(line.startswith("colbert: query token") for line in lines)
    assert not done.stderr.strip(), done.stderr  # no TensorFlow start-up lines
    remote = run_module("bgem3_embeddings.cli", "explain", QUERY, PASSAGES[0], "--encoder-url", url, "--json")
    assert remote.returncode == 0, remote.stderr
    _close(json.loads(remote.stdout), e.to_dict())


def _columns(text: str) -> int:
    """Terminal columns, counted here from Unicode's tables: East Asian wide / fullwidth 2, combining and
    format characters 0, others 1."""
    return sum(
        0
        if unicodedata.combining(c) or unicodedata.category(c) in ("Mn", "Me", "Cf")
        else 2
        if unicodedata.east_asian_width(c) in ("W", "F")
        else 1
        for c in text
    )


def _is_number(text: str) -> bool:
    try:
        float(text.rstrip("%"))
    except ValueError:
        return False
    return True


def _cut_at(line: str, columns: int) -> int:
    """The index in `line` where `columns` terminal columns end (AssertionError if a character straddles)."""
    used = 0
    for i, c in enumerate(line):
        if used == columns:
            return i
        used += _columns(c)
        assert used <= columns, f"a wide character straddles column {columns}: {line!r}"
    assert used == columns, line
    return len(line)


def test_bgem3_explain_columns_line_up_with_wide_characters(tiny_checkpoint: Path) -> None:
    """CJK tokens and emoji take two terminal columns: every row's numbers start at the header's column."""
    query = "机器人 What is BGE M3? 🦜 café"
    passage = "机器学习是人工智能的一个分支。🦜🦜 BGE M3 is an embedding model. café x\u0301"
    done = run_module("bgem3_embeddings.cli", "explain", query, passage, "--model", str(tiny_checkpoint),
                      "--top", "0")  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    sparse_at = next(i for i, line in enumerate(lines) if line.startswith("sparse terms"))
    colbert_at = next(i for i, line in enumerate(lines) if line.startswith("colbert: query token"))
    sparse_rows = [line for line in lines[sparse_at + 1 : colbert_at] if not line.startswith("  ...")]
    colbert_rows = [line for line in lines[colbert_at + 1 :] if not line.startswith("  ...")]
    assert sparse_rows and colbert_rows, done.stdout
    # rows with CJK or emoji tokens in both tables (what the test is about)
    assert any(_columns(line) > len(line) for line in sparse_rows), done.stdout
    assert sum(_columns(line) > len(line) for line in colbert_rows) >= 3, done.stdout
    tables = ((lines[sparse_at], sparse_rows, [24]), (lines[colbert_at], colbert_rows, [24, 46]))
    for header, rows, columns in tables:
        width = _columns(header)
        for row in rows:
            assert _columns(row) == width, (row, header)  # the same columns to the end
            for column in columns:  # each token column ends on the header's column
                cut = _cut_at(row, column)
                assert row[cut - 1] == " ", (row, column)
            for column in columns[:-1]:  # ... and the next token starts there
                assert row[_cut_at(row, column)] != " ", (row, column)
            tail = row[_cut_at(row, columns[-1]) :]  # the numbers, in the header's columns
            assert tail.isascii() and len(tail) == width - columns[-1], row
            numbers = tail.replace(" x ", " ").replace(" = ", " ").split()
            assert numbers and all(_is_number(x) for x in numbers), row


def test_bgem3_explain_bad_input_is_one_line(tiny_checkpoint: Path) -> None:
    done = run_module("bgem3_embeddings.cli", "explain", QUERY, "  ", "--model", str(tiny_checkpoint))
    assert_clean_failure(done, 2, "the passage is empty")
    done = run_module("bgem3_embeddings.cli", "explain", QUERY, "p", "--weights", "1,2")
    assert_clean_failure(done, 2, "--weights", "3 finite numbers >= 0")
