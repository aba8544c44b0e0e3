"""`bgem3 serve` with clients nobody on this project wrote: huggingface_hub's stock InferenceClient and
AsyncInferenceClient (TEI's root route), LangChain's HuggingFaceEndpointEmbeddings on them, TEI's
/tokenize; and empty input answered as OpenAI's API and text-embeddings-inference answer it.

Vectors are checked against the reference (transformers' XLMRobertaModel + FlagEmbedding's heads).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.optional import require_module

require_module("fastapi", reason="the server needs the serve extra")
hub = require_module("huggingface_hub")

from tests.command_server import started_command  # noqa: E402
from tests.support import ReferenceM3, assert_health_answers_during, tiny_server  # noqa: E402
from tests.tolerances import UNIT_VECTORS  # noqa: E402

KEY = "s3cret"
TEXTS = ["What is BGE M3?", "Defination of BM25", "héllo wörld, 日本語のテキスト </s> x"]


@pytest.fixture(scope="module")
def reference(tiny_checkpoint: Path) -> ReferenceM3:
    return ReferenceM3(tiny_checkpoint)


@pytest.fixture(scope="module")
def url(tiny_checkpoint: Path) -> Iterator[str]:
    with tiny_server(tiny_checkpoint) as base:
        yield base


@pytest.fixture(scope="module")
def keyed_url(tiny_checkpoint: Path) -> Iterator[str]:
    with tiny_server(tiny_checkpoint, api_key=KEY) as base:
        yield base


def _dense(got: object, want: np.ndarray) -> None:
    np.testing.assert_allclose(np.asarray(got, np.float32), want, **UNIT_VECTORS)


# ------------------------------------------------------------------------- huggingface_hub's own client
def test_inference_client_posts_to_the_root_route(url: str, reference: ReferenceM3) -> None:
    want = reference.encode(TEXTS)["dense_vecs"]
    client = hub.InferenceClient(base_url=url)
    one = client.feature_extraction(TEXTS[0])
    assert one.shape == (1, want.shape[1])
    _dense(one[0], want[0])
    _dense(client.feature_extraction(TEXTS), want)
    assert httpx.get(f"{url}/").status_code == 200  # TEI's GET / is its health route


def test_inference_client_with_and_without_the_key(keyed_url: str, reference: ReferenceM3) -> None:
    want = reference.encode(TEXTS[:1])["dense_vecs"]
    _dense(hub.InferenceClient(base_url=keyed_url, api_key=KEY).feature_extraction(TEXTS[0]), want)
    with pytest.raises(hub.errors.HfHubHTTPError) as refused:
        hub.InferenceClient(base_url=keyed_url, api_key="wrong").feature_extraction(TEXTS[0])
    assert refused.value.response.status_code == 401
    assert "API key wrong" in refused.value.response.json()["error"]


def test_async_inference_client(url: str, reference: ReferenceM3) -> None:
    async def run() -> np.ndarray:
        client = hub.AsyncInferenceClient(base_url=url)
        return await client.feature_extraction(TEXTS)

    _dense(asyncio.run(run()), reference.encode(TEXTS)["dense_vecs"])


def test_langchain_huggingface_endpoint_embeddings(keyed_url: str, reference: ReferenceM3) -> None:
    lhf = require_module("langchain_huggingface")
    major = int(lhf.__version__.split(".")[0]) if hasattr(lhf, "__version__") else 1
    want = reference.encode(TEXTS)["dense_vecs"]
    if major < 1:  # 0.3: the endpoint's URL as the model
        emb = lhf.HuggingFaceEndpointEmbeddings(model=keyed_url, huggingfacehub_api_token=KEY)
    else:  # 1.x refuses a URL as `model`: its stock clients, pointed at the server, are the documented way
        emb = lhf.HuggingFaceEndpointEmbeddings(model="BAAI/bge-m3", huggingfacehub_api_token=KEY)
        emb.client = hub.InferenceClient(base_url=keyed_url, api_key=KEY)
        emb.async_client = hub.AsyncInferenceClient(base_url=keyed_url, api_key=KEY)
    _dense(emb.embed_documents(TEXTS), want)
    _dense(emb.embed_query(TEXTS[1]), want[1])
    _dense(asyncio.run(emb.aembed_query(TEXTS[2])), want[2])


# ------------------------------------------------------------------------- /tokenize
def test_tokenize_is_tei_shaped_with_the_reference_ids(url: str, reference: ReferenceM3) -> None:
    r = httpx.post(f"{url}/tokenize", json={"inputs": TEXTS})
    assert r.status_code == 200, r.text
    rows = r.json()
    assert len(rows) == len(TEXTS)
    sparse = httpx.post(f"{url}/embed_sparse", json={"inputs": TEXTS}).json()
    for text, tokens, ids, weights in zip(
        TEXTS, rows, reference.tokenizer(TEXTS)["input_ids"], sparse, strict=True
    ):
        assert [t["id"] for t in tokens] == ids
        assert all(set(t) == {"id", "text", "special", "start", "stop"} for t in tokens)
        first, last = tokens[0], tokens[-1]
        assert first["special"] and last["special"] and first["start"] is None and last["stop"] is None
        raw = text.encode("utf-8")
        for t in tokens[1:-1]:  # UTF-8 byte offsets, as TEI's into_tokens slices input.bytes()
            assert not t["special"] and t["text"] == raw[t["start"] : t["stop"]].decode("utf-8"), t
        # every sparse index is a token of the text: a client turns weights into words with these spans
        assert {w["index"] for w in weights} <= {t["id"] for t in tokens}
    bare = httpx.post(f"{url}/tokenize", json={"inputs": TEXTS[0], "add_special_tokens": False}).json()
    assert [t["id"] for t in bare[0]] == reference.tokenizer(TEXTS[0], add_special_tokens=False)["input_ids"]


MULTIBYTE = "東京 🦜 is x\u0301 café </s> ok"  # CJK, an emoji, a combining mark, é, a literal </s>


def test_tokenize_offsets_are_utf8_bytes_as_tei_gives_them(url: str, reference: ReferenceM3) -> None:
    """A TEI client slices the UTF-8 bytes of its text with start:stop: after 東京 (6 bytes, 2 characters)
    the offsets of code points would give it the wrong text."""
    tokens = httpx.post(f"{url}/tokenize", json={"inputs": MULTIBYTE}).json()[0]
    assert [t["id"] for t in tokens] == reference.tokenizer(MULTIBYTE)["input_ids"]
    raw = MULTIBYTE.encode("utf-8")
    spanned = [t for t in tokens if t["start"] is not None]
    assert [t["special"] for t in tokens] == [True] + [False] * len(spanned) + [True]
    for t in spanned:
        assert t["text"] == raw[t["start"] : t["stop"]].decode("utf-8"), t
        # the same span in code points, counted independently of the server
        char_start = len(raw[: t["start"]].decode("utf-8"))
        assert MULTIBYTE[char_start : char_start + len(t["text"])] == t["text"]
    # "東京 🦜 is": 東 and 京 are 3 bytes each, 🦜 4: "is" is bytes 12..14 (code points 5..7)
    assert [(t["start"], t["stop"]) for t in spanned if t["text"] == "is"] == [(12, 14)]
    assert [(t["start"], t["stop"]) for t in spanned if t["text"] == "東京"] == [(0, 6)]
    # <unk> (no vocabulary entry for 東京 or 🦜 in the test tokenizer) and a literal </s> are tokens of the
    # text, with their characters, not special: TEI marks only what the tokenizer added
    unk = reference.tokenizer.unk_token_id
    assert any(t["id"] == unk for t in spanned)
    literal = [t for t in spanned if t["text"] == "</s>"]
    assert literal and not literal[0]["special"]


def test_tokenize_and_explain_agree_on_special(url: str) -> None:
    """`special` means the same in /tokenize and in /v1/bgem3/explain's tokens: added by the tokenizer."""
    row = httpx.post(f"{url}/tokenize", json={"inputs": MULTIBYTE}).json()[0]
    explained = httpx.post(f"{url}/v1/bgem3/explain", json={"query": "東京", "passage": MULTIBYTE})
    assert explained.status_code == 200, explained.text
    tokens = explained.json()["data"][0]["passage"]["tokens"]
    assert [t["id"] for t in tokens] == [t["id"] for t in row]
    assert [t["special"] for t in tokens] == [t["special"] for t in row]
    for ours, tei in zip(tokens, row, strict=True):  # explain's spans are code points, TEI's bytes
        if not tei["special"]:
            assert MULTIBYTE[ours["start"] : ours["stop"]] == tei["text"]


def test_long_tokenize_is_answered_in_pieces(url: str) -> None:
    """A request past the inline size (tokenized and written in a worker thread) gives the same rows."""
    texts = [MULTIBYTE * 40, "plain ascii text " * 200]
    rows = httpx.post(f"{url}/tokenize", json={"inputs": texts}, timeout=60).json()
    for text, row in zip(texts, rows, strict=True):
        raw = text.encode("utf-8")
        assert all(t["text"] == raw[t["start"] : t["stop"]].decode("utf-8") for t in row if not t["special"])
        assert row[1]["start"] == 0 and row[-2]["stop"] == len(raw.rstrip())


def test_health_answers_while_a_long_tokenize_is_served(tiny_checkpoint: Path) -> None:
    """`bgem3 serve` started as a user starts it, and a /tokenize of 32 texts of 20,000 characters
    (multi-byte: ~500k tokens, ~30 MB of JSON): tokenizing and writing the answer run off the event loop,
    so /health keeps answering meanwhile (as tests/test_explain_serve.py probes it during an explain)."""
    text = (MULTIBYTE + " ") * (20_000 // (len(MULTIBYTE) + 1))
    texts = [text] * 32
    args = ["-m", "bgem3_embeddings.cli", "serve", "--port", "0", "--log-level", "warning"]
    with started_command([*args, "--model", str(tiny_checkpoint)], "stderr", first_path="/health") as started:
        base = started[1]
        answer = assert_health_answers_during(
            base, lambda: httpx.post(f"{base}/tokenize", json={"inputs": texts}, timeout=300)
        )
    assert answer.status_code == 200, answer.text[:300]
    rows = answer.json()
    assert len(rows) == len(texts) and rows[0] == rows[-1]
    raw = text.encode("utf-8")
    assert all(t["text"] == raw[t["start"] : t["stop"]].decode("utf-8") for t in rows[0] if not t["special"])
    assert sum(map(len, rows)) > 300_000


# ------------------------------------------------------------------------- empty input
@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/embeddings", {"input": []}, "input"),
        ("/v1/bgem3/encode", {"input": []}, "input"),
        ("/v1/bgem3/score", {"sentence_pairs": []}, "sentence_pairs"),
    ],
)
def test_empty_input_is_openai_400(url: str, path: str, body: dict[str, object], field: str) -> None:
    r = httpx.post(url + path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == field
    assert error["message"].startswith(f"`{field}` cannot be empty")


@pytest.mark.parametrize("path", ["/embed", "/embed_sparse", "/", "/tokenize"])
def test_empty_inputs_is_tei_400(url: str, path: str) -> None:
    r = httpx.post(url + path, json={"inputs": []})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["error_type"] == "Empty" and body["error"].startswith("`inputs` cannot be empty")


def test_empty_input_client_errors(url: str) -> None:
    openai = require_module("openai")
    with pytest.raises(openai.BadRequestError, match="cannot be empty"):
        openai.OpenAI(base_url=f"{url}/v1", api_key="unused").embeddings.create(input=[], model="x")
    with pytest.raises(hub.errors.HfHubHTTPError) as refused:
        hub.InferenceClient(base_url=url).feature_extraction([])
    assert refused.value.response.status_code == 400


def test_an_empty_text_is_refused_on_every_route(url: str) -> None:
    """One rule for every text a user sends (issue 58, item 10; query_text.is_blank), as OpenAI's API and
    TEI refuse an empty input: a 400 naming the field, in each wire format's shape, to the stock clients."""
    said = "is empty (or only whitespace): give some text"
    openai = require_module("openai")
    with pytest.raises(openai.BadRequestError, match=re.escape(f"`input[0]` {said}")):
        openai.OpenAI(base_url=f"{url}/v1", api_key="unused").embeddings.create(input="", model="x")
    with pytest.raises(hub.errors.HfHubHTTPError) as refused:
        hub.InferenceClient(base_url=url).feature_extraction(" ")
    assert refused.value.response.status_code == 400
    for path, body, field in [
        ("/v1/embeddings", {"input": ["fine", " \n"]}, "input[1]"),
        ("/embed", {"inputs": ""}, "inputs[0]"),
        ("/embed_sparse", {"inputs": ["fine", ""]}, "inputs[1]"),
        ("/tokenize", {"inputs": "\t"}, "inputs[0]"),
        ("/v1/bgem3/encode", {"input": [""]}, "input[0]"),
        ("/v1/bgem3/score", {"sentence_pairs": [["q", "p"], ["q", " "]]}, "sentence_pairs[1][1]"),
    ]:
        r = httpx.post(url + path, json=body)
        assert r.status_code == 400 and f"`{field}` {said}" in r.text, (path, r.text)
    assert httpx.post(url + "/embed", json={"inputs": "fine"}).status_code == 200
