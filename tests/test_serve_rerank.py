"""`bgem3 serve --reranker`: TEI's /rerank and the Cohere-style /v1/rerank and /v2/rerank on one server that
also serves the embedding model (tiny checkpoints, fp32 CPU, started once for the module).

The scores are the library's (`BGEM3Reranker.compute_score`, itself checked against FlagReranker in the
reranker's own tests); every bad input is one 4xx in the shape the route's clients read.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.optional import require_module

require_module("fastapi", reason="the server needs the serve extra")

from bgem3_embeddings.concurrency import encoder_lock  # noqa: E402
from tests.support import assert_health_answers_during  # noqa: E402
from tests.tolerances import SCALED  # noqa: E402

QUERY = "What is BGE M3?"
TEXTS = [
    "BGE M3 is an embedding model supporting dense retrieval, lexical matching and multi-vector interaction.",
    "BM25 is a bag-of-words retrieval function",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "搜索引擎返回与查询最相关的文档。",
    "Paris is the capital of France",
]
# Past the server's reranker max_length (64 tokens) as a pair: truncated, or refused without truncate.
LONG = " ".join(["Dense retrieval maps each text to a single vector."] * 12)
MAX_LENGTH = 64
MAX_INPUTS = 8


@pytest.fixture(scope="module")
def reranker(tiny_reranker_checkpoint: Path) -> Any:
    from bgem3_embeddings import BGEM3Reranker

    return BGEM3Reranker(tiny_reranker_checkpoint, precision="float32", device="cpu", max_length=MAX_LENGTH)


@pytest.fixture(scope="module")
def served(tiny_checkpoint: Path, reranker: Any) -> Iterator[tuple[str, Any]]:
    """One server with both models; yields its URL and the app."""
    from bgem3_embeddings import BGEM3Encoder
    from bgem3_embeddings.serve.app import create_app
    from bgem3_embeddings.serve.server import serve_in_thread
    from bgem3_embeddings.serve.settings import ServeSettings

    encoder = BGEM3Encoder(tiny_checkpoint, precision="float32", device="cpu", show_progress=False)
    settings = ServeSettings(max_inputs_per_request=MAX_INPUTS, reranker_name="tiny-reranker")
    app = create_app(encoder, settings, reranker)
    with serve_in_thread(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def url(served: tuple[str, Any]) -> str:
    return served[0]


def _library(reranker: Any, texts: list[str], normalize: bool) -> np.ndarray:
    return np.asarray(reranker.compute_score([(QUERY, t) for t in texts], normalize=normalize))


def _wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.005)


# ------------------------------------------------------------------------- TEI /rerank
@pytest.mark.parametrize("raw_scores", [False, True])
def test_tei_rerank_scores_are_the_library_s_best_first(url: str, reranker: Any, raw_scores: bool) -> None:
    r = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": TEXTS, "raw_scores": raw_scores})
    assert r.status_code == 200, r.text
    items = r.json()
    assert isinstance(items, list) and all(set(item) == {"index", "score"} for item in items)
    want = _library(reranker, TEXTS, normalize=not raw_scores)
    assert sorted(item["index"] for item in items) == list(range(len(TEXTS)))
    got = np.array([item["score"] for item in items])
    np.testing.assert_allclose(got, want[[item["index"] for item in items]], **SCALED)
    assert list(got) == sorted(got, reverse=True)
    assert [item["index"] for item in items] == list(np.argsort(-want, kind="stable"))
    if not raw_scores:
        assert all(0.0 < s < 1.0 for s in got)


def test_tei_rerank_return_text_and_truncate(url: str, reranker: Any) -> None:
    texts = [TEXTS[0], LONG]
    r = httpx.post(
        f"{url}/rerank", json={"query": QUERY, "texts": texts, "return_text": True, "truncate": True}
    )
    assert r.status_code == 200, r.text
    items = r.json()
    assert {item["index"]: item["text"] for item in items} == dict(enumerate(texts))
    want = _library(reranker, texts, normalize=True)  # the library cuts the long pair at max_length too
    np.testing.assert_allclose([item["score"] for item in items], want[[i["index"] for i in items]], **SCALED)


def test_tei_rerank_refuses_a_pair_over_the_limit_without_truncate(url: str) -> None:
    r = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": [TEXTS[1], LONG]})
    assert r.status_code == 413, r.text
    body = r.json()
    assert body["error_type"] == "Validation" and body["param"] == "max_input_length"
    assert (
        "`texts[1]`" in body["error"] and f"({MAX_LENGTH})" in body["error"] and "truncate" in body["error"]
    )


@pytest.mark.parametrize(
    ("body", "status", "error_type", "phrase"),
    [
        ({"query": QUERY, "texts": []}, 400, "Empty", "`texts` cannot be empty"),
        ({"query": "  ", "texts": TEXTS}, 400, "Empty", "the query is empty (or only whitespace)"),
        ({"query": QUERY, "texts": [QUERY, "\n"]}, 400, "Empty", "`texts[1]` is empty (or only whitespace)"),
        ({"texts": TEXTS}, 422, "Validation", "`query`"),
        ({"query": QUERY}, 422, "Validation", "`texts`"),
        ({"query": QUERY, "texts": "one text"}, 422, "Validation", "`texts`"),
        ({"query": QUERY, "texts": ["x"] * (MAX_INPUTS + 1)}, 413, "Validation", "max_inputs_per_request"),
    ],
)
def test_tei_rerank_bad_input_is_one_clear_4xx(
    url: str, body: dict[str, Any], status: int, error_type: str, phrase: str
) -> None:
    r = httpx.post(f"{url}/rerank", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error_type"] == error_type and phrase in r.json()["error"], r.text


# ------------------------------------------------------------------------- Cohere-style
@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_cohere_rerank_top_n_and_documents(url: str, reranker: Any, path: str) -> None:
    documents: list[Any] = [TEXTS[0], {"text": TEXTS[1], "title": "ignored"}, *TEXTS[2:], LONG]
    texts = [*TEXTS, LONG]
    body = {"model": "whatever", "query": QUERY, "documents": documents, "top_n": 3, "return_documents": True}
    r = httpx.post(url + path, json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["model"] == "tiny-reranker" and answer["usage"]["total_tokens"] > 0
    want = _library(reranker, texts, normalize=True)  # Cohere-style routes always truncate
    order = list(np.argsort(-want, kind="stable"))[:3]
    assert [item["index"] for item in answer["results"]] == order
    for item in answer["results"]:
        assert set(item) == {"index", "relevance_score", "document"}
        assert item["document"] == {"text": texts[item["index"]]}
        np.testing.assert_allclose(item["relevance_score"], want[item["index"]], **SCALED)
    bare = httpx.post(url + path, json={"model": "m", "query": QUERY, "documents": TEXTS}).json()
    assert len(bare["results"]) == len(TEXTS) and all("document" not in item for item in bare["results"])


@pytest.mark.parametrize(
    ("body", "status", "param", "phrase"),
    [
        ({"query": QUERY, "documents": []}, 400, "documents", "`documents` cannot be empty"),
        ({"documents": TEXTS}, 422, "query", "`query`"),
        ({"query": QUERY, "documents": [{"title": "no text"}]}, 422, "documents[0]", "text"),
        ({"query": QUERY, "documents": TEXTS, "top_n": 0}, 422, "top_n", "top_n"),
        ({"query": QUERY, "documents": ["x"] * (MAX_INPUTS + 1)}, 413, "max_inputs_per_request", "more than"),
        ({"query": QUERY, "documents": TEXTS, "max_tokens_per_doc": 10}, 422, "max_tokens_per_doc", "leave"),
    ],
)
def test_cohere_rerank_bad_input_is_one_clear_4xx(
    url: str, body: dict[str, Any], status: int, param: str, phrase: str
) -> None:
    r = httpx.post(f"{url}/v2/rerank", json={"model": "m", **body})
    assert r.status_code == status, r.text
    answer = r.json()
    assert set(answer) <= {"message", "param"} and phrase in answer["message"], r.text
    assert answer.get("param") == param, r.text


# ------------------------------------------------------------------------- the server's rules
def test_info_and_health_say_what_is_loaded(url: str, reranker: Any) -> None:
    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ok" and health["reranker"] == "tiny-reranker"
    tei = httpx.get(f"{url}/info").json()
    assert tei["model_type"] == {"embedding": {"pooling": "cls"}}  # the embedding model first, as before
    assert (
        tei["reranker"]["model_id"] == "tiny-reranker" and tei["reranker"]["max_input_length"] == MAX_LENGTH
    )
    assert "reranker" in tei["reranker"]["model_type"]
    ours = httpx.get(f"{url}/v1/bgem3/info").json()
    assert ours["hidden_size"] > 0  # the embedding model's description is unchanged
    assert ours["reranker"]["fingerprint"] == reranker.fingerprint()
    assert ours["reranker"]["max_input_length"] == MAX_LENGTH and ours["reranker"]["precision"] == "float32"


def test_host_and_origin_guard_cover_the_rerank_routes(url: str) -> None:
    body = {"query": QUERY, "texts": TEXTS[:1]}
    evil = httpx.post(f"{url}/rerank", json=body, headers={"Host": "evil.example"})
    assert evil.status_code == 403 and evil.json()["error_type"] == "Unauthorized"
    cross = httpx.post(
        f"{url}/v2/rerank",
        json={"model": "m", "query": QUERY, "documents": TEXTS[:1]},
        headers={"Origin": "https://evil.example"},
    )
    assert cross.status_code == 403 and "Origin" in cross.json()["message"]


def test_concurrent_requests_share_a_model_call(served: tuple[str, Any], reranker: Any) -> None:
    """Requests queued while the cross-encoder is busy are scored together in one call, each getting
    exactly its own scores."""
    url, app = served
    batcher = app.state.rerank.batcher
    before = _call_count(url)
    queries = [TEXTS[:2], TEXTS[2:4], TEXTS[1:5]]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        with encoder_lock(reranker):  # the worker takes the first request and waits for the model
            first = pool.submit(httpx.post, f"{url}/rerank", json={"query": QUERY, "texts": ["first"]})
            _wait_until(lambda: batcher.in_flight_texts == 1)
            rest = [
                pool.submit(
                    httpx.post, f"{url}/rerank", json={"query": QUERY, "texts": t, "raw_scores": True}
                )
                for t in queries
            ]
            _wait_until(lambda: batcher.queued_texts == sum(map(len, queries)))
        assert first.result(timeout=60).status_code == 200
        answers = [f.result(timeout=60).json() for f in rest]
    assert _call_count(url) - before == 2  # the first request's call, then one for the three others
    for texts, items in zip(queries, answers, strict=True):
        want = _library(reranker, texts, normalize=False)
        np.testing.assert_allclose([i["score"] for i in items], want[[i["index"] for i in items]], **SCALED)


def _call_count(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("bgem3_rerank_batch_texts_count"):
            return float(line.split()[-1])
    raise AssertionError("no bgem3_rerank_batch_texts_count in /metrics")


def test_long_requests_are_tokenized_off_the_event_loop(url: str) -> None:
    texts = [LONG * 4] * MAX_INPUTS

    def requests_for_two_seconds() -> list[Any]:
        # At least 4 requests and 2 s of them: the probes need a request that lasts (one took 0.28 s in a
        # full run, too short for three probes).
        answers, start = [], time.perf_counter()
        while len(answers) < 4 or time.perf_counter() - start < 2.0:
            body = {"model": "m", "query": LONG, "documents": texts}
            answers.append(httpx.post(f"{url}/v1/rerank", json=body, timeout=300))
        return answers

    answer = assert_health_answers_during(url, requests_for_two_seconds)
    assert all(r.status_code == 200 for r in answer)


def test_the_embedding_routes_still_answer_beside_the_reranker(url: str) -> None:
    r = httpx.post(f"{url}/v1/embeddings", json={"input": ["one", "two"]})
    assert r.status_code == 200 and len(r.json()["data"]) == 2


def test_workers_build_the_reranker_from_their_config(
    tiny_reranker_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--workers N`: each worker builds the app from CONFIG_ENV; with the reranker alone, no encoder."""
    from bgem3_embeddings.serve.app import CONFIG_ENV, create_app_from_env, worker_config
    from bgem3_embeddings.serve.settings import ServeSettings

    kwargs = {"precision": "float32", "compute_dtype": "auto", "device": "cpu", "batch_size": 8,
              "max_tokens_per_batch": 512}  # fmt: skip
    config = worker_config(None, kwargs, ServeSettings(), str(tiny_reranker_checkpoint), {"max_length": 48})
    monkeypatch.setenv(CONFIG_ENV, config)
    app = create_app_from_env()
    assert app.state.service is None
    assert app.state.rerank.max_length == 48 and app.state.rerank.reranker.precision == "float32"
