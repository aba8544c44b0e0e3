"""`bgem3 serve` on loopback: every endpoint against the reference (FlagEmbedding semantics on transformers),
the stock OpenAI clients, concurrency, limits, auth, the queue bound and disconnecting clients.

One real uvicorn server per module on a tiny checkpoint (its own encoder: the server's warm-up changes the
encoder's eager-batch counter, which other tests' shared encoder must keep).
"""

from __future__ import annotations

import base64
import concurrent.futures
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.optional import require_module

require_module("fastapi", reason="the server needs the serve extra")

from bgem3_embeddings.concurrency import encoder_lock  # noqa: E402
from bgem3_embeddings.serve.app import create_app  # noqa: E402
from bgem3_embeddings.serve.server import serve_in_thread  # noqa: E402
from bgem3_embeddings.serve.settings import ServeSettings, exposure_problem, is_loopback  # noqa: E402
from tests.support import ReferenceM3  # noqa: E402
from tests.tolerances import APPROX, UNIT_VECTORS  # noqa: E402

TEXTS = [
    "What is BGE M3?",
    "Defination of BM25",
    "BGE M3 is an embedding model supporting dense retrieval, lexical matching and multi-vector interaction.",
    "a",  # one token (an empty text is refused: test_an_empty_text_is_refused_on_every_route)
    "héllo wörld, 日本語のテキスト and a repeated repeated word",
]
# float16 keeps 11 significant bits: a unit-vector element is off by at most 2**-11 relative (< 5e-4 abs).
FLOAT16_ATOL = 5e-4


@pytest.fixture(scope="module")
def encoder(tiny_checkpoint: Path) -> Any:
    from bgem3_embeddings import BGEM3Encoder

    return BGEM3Encoder(tiny_checkpoint, precision="float32", device="cpu", show_progress=False)


@pytest.fixture(scope="module")
def reference(tiny_checkpoint: Path) -> ReferenceM3:
    return ReferenceM3(tiny_checkpoint)


@pytest.fixture(scope="module")
def url(encoder: Any) -> Iterator[str]:
    with serve_in_thread(create_app(encoder, ServeSettings(model_name="bge-m3-tiny"))) as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c


def assert_dense(got: Any, want: np.ndarray) -> None:
    np.testing.assert_allclose(np.asarray(got, np.float32), want, **UNIT_VECTORS)


def assert_colbert(got: Any, want: np.ndarray) -> None:
    np.testing.assert_allclose(np.asarray(got, np.float32), want, **UNIT_VECTORS)


def assert_lexical(got: dict[str, float], want: dict[str, float]) -> None:
    assert set(got) == set(want)
    for token, weight in want.items():
        assert got[token] == pytest.approx(weight, **APPROX)


# --------------------------------------------------------------------------- outputs vs the reference
def test_bgem3_encode_matches_the_reference(client: httpx.Client, reference: ReferenceM3) -> None:
    ref = reference.encode(TEXTS)
    r = client.post(
        "/v1/bgem3/encode",
        json={"input": TEXTS, "return_dense": True, "return_sparse": True, "return_colbert_vecs": True},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["index"] for d in body["data"]] == list(range(len(TEXTS)))
    for i, item in enumerate(body["data"]):
        assert_dense(item["dense_vecs"], ref["dense_vecs"][i])
        assert_lexical(item["lexical_weights"], ref["lexical_weights"][i])
        assert_colbert(item["colbert_vecs"], ref["colbert_vecs"][i])
    n_tokens = sum(len(ids) for ids in reference.tokenizer(TEXTS)["input_ids"])
    assert body["usage"] == {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
    assert body["model"] == "bge-m3-tiny"


def test_bgem3_encode_only_what_is_asked_and_max_length(client: httpx.Client, reference: ReferenceM3) -> None:
    long_text = "retrieval " * 100
    r = client.post(
        "/v1/bgem3/encode",
        json={"input": long_text, "return_dense": False, "return_colbert_vecs": True, "max_length": 16},
    )
    item = r.json()["data"][0]
    assert set(item) == {"index", "colbert_vecs"}
    ref = reference.encode([long_text], max_length=16)
    np.testing.assert_allclose(np.asarray(item["colbert_vecs"]), ref["colbert_vecs"][0], **UNIT_VECTORS)
    assert r.json()["usage"]["total_tokens"] == 16


def test_base64_and_compact_colbert(client: httpx.Client, reference: ReferenceM3) -> None:
    from bgem3_embeddings.serve.wire import read_colbert, read_dense

    ref = reference.encode(TEXTS)
    body = {"input": TEXTS, "return_colbert_vecs": True, "encoding_format": "base64"}
    exact = client.post("/v1/bgem3/encode", json=body).json()["data"]
    compact = client.post("/v1/bgem3/encode", json={**body, "colbert_dtype": "float16"}).json()["data"]
    floats = client.post("/v1/bgem3/encode", json={**body, "encoding_format": "float"}).json()["data"]
    for i in range(len(TEXTS)):
        assert exact[i]["colbert_dtype"] == "float32" and compact[i]["colbert_dtype"] == "float16"
        # base64 float32 carries exactly the numbers the float form does
        as_json = floats[i]
        np.testing.assert_array_equal(read_colbert(exact[i]), np.float32(as_json["colbert_vecs"]))
        np.testing.assert_array_equal(read_dense(exact[i]["dense_vecs"]), np.float32(as_json["dense_vecs"]))
        np.testing.assert_allclose(read_colbert(compact[i]), ref["colbert_vecs"][i], atol=FLOAT16_ATOL)
        assert len(base64.b64decode(compact[i]["colbert_vecs"])) == ref["colbert_vecs"][i].size * 2


def test_openai_embeddings_endpoint(client: httpx.Client, reference: ReferenceM3) -> None:
    ref = reference.encode(TEXTS)
    as_float = client.post("/v1/embeddings", json={"input": TEXTS, "model": "anything"}).json()
    assert as_float["object"] == "list" and as_float["model"] == "bge-m3-tiny"
    for i, item in enumerate(as_float["data"]):
        assert item["object"] == "embedding" and item["index"] == i
        assert_dense(item["embedding"], ref["dense_vecs"][i])
    as_b64 = client.post("/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "base64"}).json()
    vector = np.frombuffer(base64.b64decode(as_b64["data"][0]["embedding"]), dtype="<f4")
    assert_dense(vector, ref["dense_vecs"][0])
    n = len(reference.tokenizer(TEXTS[0])["input_ids"])
    assert as_b64["usage"] == {"prompt_tokens": n, "total_tokens": n}
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == "bge-m3-tiny" and models["data"][0]["object"] == "model"


def test_tei_embed_and_embed_sparse(client: httpx.Client, reference: ReferenceM3) -> None:
    ref = reference.encode(TEXTS)
    dense = client.post("/embed", json={"inputs": TEXTS}).json()
    for i, row in enumerate(dense):
        assert_dense(row, ref["dense_vecs"][i])
    assert len(client.post("/embed", json={"inputs": TEXTS[0]}).json()) == 1  # a str still gives [[...]]
    sparse = client.post("/embed_sparse", json={"inputs": TEXTS}).json()
    for i, entries in enumerate(sparse):
        indices = [e["index"] for e in entries]
        assert indices == sorted(set(indices))
        assert_lexical({str(e["index"]): e["value"] for e in entries}, ref["lexical_weights"][i])
    info = client.get("/info").json()
    assert info["model_id"] == "bge-m3-tiny" and info["max_input_length"] == 8192


def test_tei_refuses_over_long_input_unless_truncate(client: httpx.Client, reference: ReferenceM3) -> None:
    too_long = "word " * 9000
    r = client.post("/embed", json={"inputs": [too_long]})
    assert r.status_code == 413 and "max_input_length" in r.json()["error"], r.text
    r = client.post("/embed", json={"inputs": [too_long], "truncate": True})
    assert r.status_code == 200
    assert_dense(r.json()[0], reference.encode([too_long], max_length=8192)["dense_vecs"][0])


def test_a_cut_text_is_said_on_every_embedding_route(client: httpx.Client, reference: ReferenceM3) -> None:
    """Issue 58 item 7: a text cut at the max length is named, with its whole token count, in the
    BGEM3-Truncated header on every route (and in `warnings` on our own); an uncut request has neither."""
    long_text = "retrieval " * 40  # 42 tokens with <s> and </s>
    whole = len(reference.tokenizer(long_text)["input_ids"])
    header = "BGEM3-Truncated"

    cut = client.post("/v1/bgem3/encode", json={"input": [TEXTS[0], long_text], "max_length": 16})
    note = f"1 of 2 texts have more tokens than the model reads (text 2: {whole:,}): only the first 16"
    assert cut.json()["warnings"] == [cut.headers[header]] and cut.headers[header].startswith(note)
    score = client.post(
        "/v1/bgem3/score",
        json={"sentence_pairs": [[long_text, TEXTS[1]]], "max_query_length": 8, "max_passage_length": 8},
    ).json()
    assert score["warnings"] == [
        f"queries: the query has {whole:,} tokens, more than the model reads: only its first 8 were used "
        "(max length)",
        f"passages: the passage has {len(reference.tokenizer(TEXTS[1])['input_ids']):,} tokens, more than "
        "the model reads: only its first 8 were used (max length)",
    ]
    too_long = "word " * 9000  # past the model's 8192 positions: OpenAI's route and TEI's truncate cut it
    tokens = len(reference.tokenizer(too_long)["input_ids"])
    for route, body in (
        ("/v1/embeddings", {"input": too_long}),
        ("/embed", {"inputs": too_long, "truncate": True}),
        ("/embed_sparse", {"inputs": too_long, "truncate": True}),
    ):
        r = client.post(route, json=body)
        assert r.status_code == 200 and r.headers[header] == (
            f"the text has {tokens:,} tokens, more than the model reads: only its first 8,192 were used "
            "(max length)"
        ), route
    for route, body in (("/v1/embeddings", {"input": TEXTS}), ("/embed", {"inputs": TEXTS}),
                        ("/v1/bgem3/encode", {"input": TEXTS})):
        r = client.post(route, json=body)  # exactly at the limit is not cut: 16 tokens at max_length 16
        assert header not in r.headers and "warnings" not in (r.json() if route == "/v1/bgem3/encode" else {})
    exact = [t for t in ("retrieval " * 14,) if len(reference.tokenizer(t)["input_ids"]) == 16]
    r = client.post("/v1/bgem3/encode", json={"input": exact, "max_length": 16})
    assert exact and header not in r.headers and "warnings" not in r.json()


def test_score_matches_the_reference(client: httpx.Client, reference: ReferenceM3) -> None:
    pairs = [(TEXTS[0], TEXTS[2]), (TEXTS[1], TEXTS[4]), (TEXTS[1], TEXTS[1])]
    weights = [0.4, 0.2, 0.4]
    r = client.post("/v1/bgem3/score", json={"sentence_pairs": pairs, "weights_for_different_modes": weights})
    assert r.status_code == 200, r.text
    got = r.json()["scores"]
    want = reference.compute_score(pairs, weights)
    assert set(got) == set(want)
    for key, values in want.items():
        assert got[key] == pytest.approx(values, **APPROX), key


def test_info_and_tokenizer_describe_the_model(client: httpx.Client, encoder: Any) -> None:
    from tokenizers import Tokenizer

    from bgem3_embeddings.tokenizer import BGEM3Tokenizer

    info = client.get("/v1/bgem3/info").json()
    assert info["fingerprint"] == encoder.fingerprint()
    assert info["hidden_size"] == encoder.hidden_size and info["vocab_size"] == encoder.config.vocab_size
    assert info["outputs"] == ["dense", "sparse", "colbert"]
    assert info["limits"]["max_inputs_per_request"] == 2048
    spec = client.get("/v1/bgem3/tokenizer").json()
    rebuilt = BGEM3Tokenizer(
        Tokenizer.from_str(spec["tokenizer"]),
        spec["special_tokens"],
        spec["model_max_length"],
        spec["clean_up_tokenization_spaces"],
    )
    assert rebuilt.encode_batch(TEXTS, 64) == encoder.tokenizer.encode_batch(TEXTS, 64)


def test_health_and_metrics(client: httpx.Client) -> None:
    assert client.get("/health").json()["status"] == "ok"
    client.post("/v1/embeddings", json={"input": ["count me"]})
    text = client.get("/metrics").text
    for name in (
        "bgem3_requests_total",
        "bgem3_request_seconds_bucket",
        "bgem3_batch_texts_bucket",
        "bgem3_tokens_total",
        "bgem3_tokens_per_second",
        "bgem3_queue_texts",
    ):
        assert name in text, name
    assert 'bgem3_requests_total{route="/v1/embeddings",status="200"}' in text


# --------------------------------------------------------------------------- stock clients
def test_openai_client_gets_the_reference_vectors(url: str, reference: ReferenceM3) -> None:
    openai = require_module("openai")
    ref = reference.encode(TEXTS)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    # the client asks for base64 by default and decodes it itself
    out = client.embeddings.create(input=TEXTS, model="bge-m3-tiny")
    for i, item in enumerate(out.data):
        assert_dense(item.embedding, ref["dense_vecs"][i])
    assert out.usage.total_tokens == sum(len(ids) for ids in reference.tokenizer(TEXTS)["input_ids"])
    as_float = client.embeddings.create(input=TEXTS[2], model="x", encoding_format="float")
    assert_dense(as_float.data[0].embedding, ref["dense_vecs"][2])


def test_langchain_openai_embeddings_get_the_reference_vectors(url: str, reference: ReferenceM3) -> None:
    langchain_openai = require_module("langchain_openai")
    emb = langchain_openai.OpenAIEmbeddings(
        base_url=f"{url}/v1", api_key="unused", model="bge-m3-tiny", check_embedding_ctx_length=False
    )
    texts = [t for t in TEXTS if t]  # LangChain itself refuses empty strings
    ref = reference.encode(texts)
    for i, vector in enumerate(emb.embed_documents(texts)):
        assert_dense(vector, ref["dense_vecs"][i])
    assert_dense(emb.embed_query(texts[0]), ref["dense_vecs"][0])


# --------------------------------------------------------------------------- concurrency
def test_32_concurrent_mixed_requests_each_get_their_own_results(url: str, reference: ReferenceM3) -> None:
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "retrieval", "sparse", "dense", "colbert", "token", "ünïcode", "東京"]
    requests = []
    for i in range(32):
        n_texts = int(rng.integers(1, 5))
        texts = [
            f"request {i} text {j}: " + " ".join(rng.choice(words, int(rng.integers(1, 120))))
            for j in range(n_texts)
        ]
        requests.append((["bgem3", "openai", "tei_sparse"][i % 3], texts))
    barrier = threading.Barrier(len(requests))

    def send(kind: str, texts: list[str]) -> Any:
        with httpx.Client(base_url=url, timeout=120) as c:
            barrier.wait()  # all 32 in flight together
            if kind == "bgem3":
                return c.post(
                    "/v1/bgem3/encode",
                    json={"input": texts, "return_sparse": True, "return_colbert_vecs": True},
                ).json()
            if kind == "openai":
                return c.post("/v1/embeddings", json={"input": texts}).json()
            return c.post("/embed_sparse", json={"inputs": texts}).json()

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(lambda r: send(*r), requests))
    for (kind, texts), answer in zip(requests, answers, strict=True):
        ref = reference.encode(texts)
        if kind == "bgem3":
            assert len(answer["data"]) == len(texts)
            for i, item in enumerate(answer["data"]):
                assert_dense(item["dense_vecs"], ref["dense_vecs"][i])
                assert_lexical(item["lexical_weights"], ref["lexical_weights"][i])
                assert_colbert(item["colbert_vecs"], ref["colbert_vecs"][i])
        elif kind == "openai":
            for i, item in enumerate(answer["data"]):
                assert_dense(item["embedding"], ref["dense_vecs"][i])
        else:
            for i, entries in enumerate(answer):
                assert_lexical({str(e["index"]): e["value"] for e in entries}, ref["lexical_weights"][i])


# --------------------------------------------------------------------------- bad input
BAD_REQUESTS = [
    ("/v1/embeddings", b"{not json", 400, "not valid JSON"),
    ("/v1/embeddings", b"[1, 2]", 400, "JSON object"),
    ("/v1/embeddings", {"input": [1, 2]}, 422, "`input"),
    ("/v1/embeddings", {"model": "m"}, 422, "`input`"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, 422, "`encoding_format`"),
    ("/v1/embeddings", {"input": "x", "dimensions": 7}, 422, "dimensions"),
    ("/v1/bgem3/encode", {"input": ["x"], "return_colbert": True}, 422, "`return_colbert`"),
    ("/v1/bgem3/encode", {"input": ["x"], "max_length": 1}, 422, "`max_length`"),
    ("/v1/bgem3/encode", {"input": ["x"], "return_sparse": "yes"}, 422, "`return_sparse`"),
    ("/v1/bgem3/encode", {"input": ["x"], "colbert_dtype": "float16"}, 422, "base64"),
    ("/v1/bgem3/score", {"sentence_pairs": [["only one"]]}, 422, "`sentence_pairs"),
    (
        "/v1/bgem3/score",
        {"sentence_pairs": [["a", "b"]], "weights_for_different_modes": [0, 0, 0]},
        422,
        "sum to zero",
    ),
    ("/embed", {"inputs": None}, 422, "`inputs`"),
    ("/embed", {"inputs": "x", "normalize": False}, 422, "normalize"),
    ("/embed_sparse", {"inputs": ["x"], "prompt_name": "query"}, 422, "prompt_name"),
]


@pytest.mark.parametrize(("path", "body", "status", "phrase"), BAD_REQUESTS)
def test_bad_requests_get_their_status_and_the_server_keeps_serving(
    client: httpx.Client, path: str, body: Any, status: int, phrase: str
) -> None:
    if isinstance(body, bytes):
        r = client.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        r = client.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    message = error if isinstance(error, str) else error["message"]
    assert phrase in message, message
    assert client.post("/v1/embeddings", json={"input": "still here"}).status_code == 200


def test_unknown_route_and_method(client: httpx.Client) -> None:
    assert client.get("/v2/nothing").status_code == 404
    assert client.get("/v1/embeddings").status_code == 405


# --------------------------------------------------------------------------- limits, auth, queue
KEY = "test-key-123"


@pytest.fixture(scope="module")
def strict(encoder: Any) -> Iterator[tuple[str, Any]]:
    settings = ServeSettings(
        api_key=KEY,
        max_inputs_per_request=4,
        max_chars_per_input=100,
        max_body_bytes=2000,
        max_queued_texts=3,
        cors_origins=("http://allowed.example",),
    )
    app = create_app(encoder, settings)
    with serve_in_thread(app) as base:
        yield base, app


def authed(base: str) -> httpx.Client:
    return httpx.Client(base_url=base, timeout=60, headers={"Authorization": f"Bearer {KEY}"})


def test_api_key_is_required_except_for_health(strict: tuple[str, Any]) -> None:
    base, _ = strict
    with httpx.Client(base_url=base) as anonymous:
        assert anonymous.get("/health").status_code == 200
        r = anonymous.post("/v1/embeddings", json={"input": "x"})
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        assert "API key missing" in r.json()["error"]["message"]
        wrong = anonymous.post("/embed", json={"inputs": "x"}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "API key wrong" in wrong.json()["error"]
        assert anonymous.get("/metrics").status_code == 401
    with authed(base) as c:
        assert c.post("/v1/embeddings", json={"input": "x"}).status_code == 200


@pytest.mark.parametrize(
    ("body", "limit"),
    [
        ({"input": ["a"] * 5}, "max_inputs_per_request"),
        ({"input": ["a" * 101]}, "max_chars_per_input"),
        ({"input": ["a" * 90] * 4, "pad": "x" * 2000}, "max_body_bytes"),
    ],
)
def test_request_limits_answer_413_naming_the_limit(strict: tuple[str, Any], body: Any, limit: str) -> None:
    base, _ = strict
    with authed(base) as c:
        r = c.post("/v1/embeddings", json=body)
        assert r.status_code == 413, r.text
        assert r.json()["error"]["code"] == limit and limit in r.json()["error"]["message"]
        assert c.post("/v1/embeddings", json={"input": "fine"}).status_code == 200


def test_chunked_body_over_the_limit_is_refused(strict: tuple[str, Any]) -> None:
    base, _ = strict

    def chunks() -> Iterator[bytes]:
        yield b'{"input": ["'
        for _ in range(30):
            yield b"a" * 100
        yield b'"]}'

    with authed(base) as c:
        r = c.post("/v1/embeddings", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "max_body_bytes"


def test_full_queue_answers_503_with_retry_after(strict: tuple[str, Any]) -> None:
    base, app = strict
    encoder = app.state.service.encoder
    with concurrent.futures.ThreadPoolExecutor(4) as pool, authed(base) as c:
        with encoder_lock(encoder):  # the worker cannot encode: requests stay queued
            first = pool.submit(c.post, "/v1/embeddings", json={"input": ["one"]})
            # the worker takes the first request and blocks on the lock; two more fill the queue (3 texts)
            _wait_until(lambda: app.state.service.batcher.in_flight_texts == 1)
            second = pool.submit(c.post, "/v1/embeddings", json={"input": ["two", "three"]})
            _wait_until(lambda: app.state.service.batcher.queued_texts == 2)
            third = pool.submit(c.post, "/v1/embeddings", json={"input": ["four"]})
            _wait_until(lambda: app.state.service.batcher.queued_texts == 3)
            full = c.post("/v1/embeddings", json={"input": ["five"]})
            assert full.status_code == 503, full.text
            assert int(full.headers["Retry-After"]) >= 1
            assert full.json()["error"]["code"] == "max_queued_texts"
        for future in (first, second, third):
            assert future.result(timeout=60).status_code == 200
        assert c.post("/v1/embeddings", json={"input": ["five"]}).status_code == 200
        assert 'bgem3_rejected_total{reason="queue_full"} 1.0' in c.get("/metrics").text


def test_a_client_that_disconnects_does_not_poison_the_batch(
    strict: tuple[str, Any], reference: ReferenceM3
) -> None:
    base, app = strict
    encoder = app.state.service.encoder
    texts = ["the client stays", "and gets its own vectors"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool, authed(base) as c:
        with encoder_lock(encoder):
            blocker = pool.submit(c.post, "/v1/embeddings", json={"input": ["taken first"]})
            _wait_until(lambda: app.state.service.batcher.in_flight_texts == 1)
            with pytest.raises(httpx.TimeoutException):  # this client gives up while queued
                httpx.post(
                    f"{base}/v1/embeddings",
                    json={"input": ["gone"]},
                    timeout=0.5,
                    headers={"Authorization": f"Bearer {KEY}"},
                )
            stays = pool.submit(c.post, "/v1/embeddings", json={"input": texts})
            _wait_until(lambda: app.state.service.batcher.queued_texts >= 2)
        answer = stays.result(timeout=60)
        assert blocker.result(timeout=60).status_code == 200
    assert answer.status_code == 200
    ref = reference.encode(texts)
    for i, item in enumerate(answer.json()["data"]):
        assert_dense(item["embedding"], ref["dense_vecs"][i])
    with authed(base) as c:
        _wait_until(lambda: 'reason="abandoned"} 1.0' in c.get("/metrics").text)


def test_cors_only_for_the_origins_given(strict: tuple[str, Any], client: httpx.Client) -> None:
    base, _ = strict
    preflight = {
        "Origin": "http://allowed.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    with httpx.Client(base_url=base) as c:
        r = c.options("/v1/embeddings", headers=preflight)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://allowed.example"
        other = c.options("/v1/embeddings", headers={**preflight, "Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in other.headers
    # the default server sends no CORS headers at all
    r = client.post("/v1/embeddings", json={"input": "x"}, headers={"Origin": "http://allowed.example"})
    assert "access-control-allow-origin" not in r.headers


def test_only_loopback_is_open_without_a_key() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert is_loopback(host) and exposure_problem(host, None, False) is None
    for host in ("0.0.0.0", "::", "192.168.1.5", "example.org"):
        assert not is_loopback(host)
        assert "--api-key" in (exposure_problem(host, None, False) or "")
        assert exposure_problem(host, "key", False) is None
        assert exposure_problem(host, None, True) is None


def test_settings_are_checked_and_travel_as_json() -> None:
    settings = ServeSettings(api_key="k", cors_origins=("http://a",), max_queued_texts=7)
    assert ServeSettings.from_json(settings.to_json()) == settings
    assert json.loads(settings.to_json())["max_queued_texts"] == 7
    with pytest.raises(ValueError, match="max_queued_texts"):
        ServeSettings(max_queued_texts=0)
    with pytest.raises(ValueError, match="api_key"):
        ServeSettings(api_key=" ")


def _wait_until(condition: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def test_a_checkpoint_without_a_head_refuses_that_output(tiny_checkpoint: Path, tmp_path: Path) -> None:
    import shutil

    from bgem3_embeddings import BGEM3Encoder

    folder = shutil.copytree(tiny_checkpoint, tmp_path / "no_sparse")
    (folder / "sparse_linear.pt").unlink()
    encoder = BGEM3Encoder(folder, device="cpu", allow_missing_heads=True, show_progress=False)
    with serve_in_thread(create_app(encoder)) as base, httpx.Client(base_url=base) as c:
        r = c.post("/embed_sparse", json={"inputs": "x"})
        assert r.status_code == 422 and r.json()["param"] == "return_sparse", r.text
        assert c.get("/v1/bgem3/info").json()["outputs"] == ["dense", "colbert"]
        assert c.post("/v1/bgem3/encode", json={"input": "x", "return_colbert_vecs": True}).status_code == 200
