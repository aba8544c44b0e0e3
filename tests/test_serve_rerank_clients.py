"""`bgem3 serve --reranker MODEL` alone, started as a user starts it, with rerank clients nobody on this
project wrote: the `cohere` SDK (`ClientV2(base_url=...).rerank` posts /v2/rerank, the v1 `Client`
/v1/rerank) and LlamaIndex's `TextEmbeddingInference` postprocessor (llama-index-postprocessor-tei-rerank,
TEI's /rerank). Scores are checked against the library (`BGEM3Reranker.compute_score`, normalize=True).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.optional import require_module

require_module("fastapi", reason="the server needs the serve extra")
cohere = require_module("cohere")

from tests.command_server import started_command  # noqa: E402
from tests.support import assert_clean_failure, run_module  # noqa: E402
from tests.tolerances import SCALED  # noqa: E402

KEY = "s3cret"
MAX_LENGTH = 64
QUERY = "What is BGE M3?"
DOCUMENTS = [
    "BGE M3 is an embedding model supporting dense retrieval, lexical matching and multi-vector interaction.",
    "BM25 is a bag-of-words retrieval function",
    "Le renard brun rapide saute par-dessus le chien paresseux.",
    "検索エンジンは質問に最も関連する文書を返します。",
    " ".join(["A search engine returns the documents most relevant to the question of its user."] * 6),
]


@pytest.fixture(scope="module")
def url(tiny_reranker_checkpoint: Path) -> Iterator[str]:
    args = ["-m", "bgem3_embeddings.cli", "serve", "--reranker", str(tiny_reranker_checkpoint)]
    args += ["--precision", "float32", "--rerank-max-length", str(MAX_LENGTH), "--api-key", KEY]
    args += ["--port", "0", "--log-level", "warning"]
    with started_command(args, "stderr", first_path="/health") as (_, base, lines):
        assert any("reranker" in line or str(tiny_reranker_checkpoint) in line for line in lines), lines
        yield base


@pytest.fixture(scope="module")
def want(tiny_reranker_checkpoint: Path) -> np.ndarray:
    """The library's normalized scores of (QUERY, document) for DOCUMENTS."""
    from bgem3_embeddings import BGEM3Reranker

    reranker = BGEM3Reranker(
        tiny_reranker_checkpoint, precision="float32", device="cpu", max_length=MAX_LENGTH
    )
    return np.asarray(reranker.compute_score([(QUERY, d) for d in DOCUMENTS], normalize=True))


def _best_first(scores: np.ndarray) -> list[int]:
    return [int(i) for i in np.argsort(-scores, kind="stable")]


# ------------------------------------------------------------------------- cohere
def test_cohere_client_v2_rerank(url: str, want: np.ndarray) -> None:
    client = cohere.ClientV2(base_url=url, api_key=KEY)
    answer = client.rerank(model="bge-reranker-v2-m3", query=QUERY, documents=DOCUMENTS, top_n=3)
    assert [r.index for r in answer.results] == _best_first(want)[:3]
    for r in answer.results:
        np.testing.assert_allclose(r.relevance_score, want[r.index], **SCALED)


def test_cohere_v1_client_rerank_with_documents(url: str, want: np.ndarray) -> None:
    client = cohere.Client(base_url=url, api_key=KEY)
    answer = client.rerank(
        model="bge-reranker-v2-m3", query=QUERY, documents=DOCUMENTS, return_documents=True
    )
    assert [r.index for r in answer.results] == _best_first(want)
    for r in answer.results:
        assert r.document is not None and r.document.text == DOCUMENTS[r.index]
        np.testing.assert_allclose(r.relevance_score, want[r.index], **SCALED)


def test_cohere_errors_are_the_sdk_s_own(url: str) -> None:
    with pytest.raises(cohere.errors.UnauthorizedError):
        cohere.ClientV2(base_url=url, api_key="wrong").rerank(model="m", query=QUERY, documents=DOCUMENTS)
    with pytest.raises(cohere.errors.BadRequestError) as empty:
        cohere.ClientV2(base_url=url, api_key=KEY).rerank(model="m", query=QUERY, documents=[])
    assert "`documents` cannot be empty" in str(empty.value.body)


# ------------------------------------------------------------------------- LlamaIndex's TEI postprocessor
def test_llamaindex_text_embedding_inference_postprocessor(url: str, want: np.ndarray) -> None:
    tei = require_module("llama_index.postprocessor.tei_rerank")
    from llama_index.core.schema import NodeWithScore, TextNode

    postprocessor = tei.TextEmbeddingInference(base_url=url, top_n=2, auth_token=f"Bearer {KEY}")
    # Its request carries no truncate (TEI's default false): the long document would be refused, so it is
    # left out here (test_serve_rerank covers the 413).
    documents = DOCUMENTS[:4]
    nodes = [NodeWithScore(node=TextNode(text=d, id_=str(i)), score=0.0) for i, d in enumerate(documents)]
    kept = postprocessor.postprocess_nodes(nodes, query_str=QUERY)
    order = _best_first(want[:4])[:2]
    assert [int(n.node.node_id) for n in kept] == order
    np.testing.assert_allclose([n.score for n in kept], want[order], **SCALED)


# ------------------------------------------------------------------------- a reranker-only server
def test_a_reranker_only_server_says_what_it_serves(url: str) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    info = httpx.get(f"{url}/info", headers=auth).json()
    assert "reranker" in info["model_type"] and info["max_input_length"] == MAX_LENGTH
    ours = httpx.get(f"{url}/v1/bgem3/info", headers=auth).json()
    assert ours["model"] is None and ours["reranker"]["max_input_length"] == MAX_LENGTH
    embed = httpx.post(f"{url}/v1/embeddings", json={"input": ["x"]}, headers=auth)
    assert embed.status_code == 404 and "no embedding model" in embed.json()["error"]["message"]
    assert "--model" in embed.json()["error"]["message"]
    tei = httpx.post(f"{url}/embed", json={"inputs": ["x"]}, headers=auth)
    assert tei.status_code == 404 and "no embedding model" in tei.json()["error"]


def test_a_missing_reranker_folder_is_one_line(tmp_path: Path) -> None:
    done = run_module("bgem3_embeddings.cli", "serve", "--port", "0", "--reranker", str(tmp_path / "none"))
    assert_clean_failure(done, 1, "none", "(--reranker)")


def test_rerank_routes_without_a_reranker_say_how_to_start_one(tiny_checkpoint: Path) -> None:
    from tests.support import tiny_server

    with tiny_server(tiny_checkpoint) as base:
        r = httpx.post(f"{base}/rerank", json={"query": QUERY, "texts": DOCUMENTS})
        assert r.status_code == 404 and "--reranker" in r.json()["error"], r.text
        c = httpx.post(f"{base}/v2/rerank", json={"model": "m", "query": QUERY, "documents": DOCUMENTS})
        assert c.status_code == 404 and "--reranker" in c.json()["message"], c.text
