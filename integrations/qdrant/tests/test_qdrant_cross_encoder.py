"""The cross-encoder stage of the store (tiny checkpoints, Qdrant Edge): `search_with_cross_encoder`,
`bgem3-qdrant search --reranker [--rerank-candidates N]` (--json, --explain and the text legend say which
stage ordered the hits) and `bgem3-qdrant eval --reranker` (the `cross` mode). Orders and scores are checked
against `BGEM3Reranker.rerank` on the mode's own candidates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bgem3_qdrant import Document, IngestOptions, Ingestor, Searcher, open_store, resolve_target
from bgem3_qdrant.cli import app
from bgem3_qdrant.cross_encoder import search_with_cross_encoder
from bgem3_qdrant.errors import BGEM3QdrantError
from bgem3_qdrant.evaluation.runs import read_run

from bgem3_embeddings.cli_support import run_cli
from tests.support import assert_reordered

TEXTS = {
    "bread": "Feed the sourdough starter once a day with equal weights of flour and water.",
    "rye": "Rye flour makes a starter lively; white flour makes it mild. Bake when it doubles.",
    "bikes": "Separated bike lanes follow the Seine and the rue de Rivoli in Paris.",
    "wind": "Windkraft an Land und auf See liefert den größten Anteil, Photovoltaik folgt.",
    "coffee": "Un espresso richiede sette grammi di caffè macinato fine e nove bar di pressione.",
    "search": "A search engine returns the documents most relevant to the question of its user.",
}
QUERY = "how do I feed a sourdough starter?"
SCALED = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def reranker(tiny_reranker_checkpoint: Path) -> Any:
    from bgem3_embeddings import BGEM3Reranker

    return BGEM3Reranker(tiny_reranker_checkpoint, precision="float32", device="cpu")


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory, encoder: Any) -> Path:
    path = tmp_path_factory.mktemp("ce") / "qd"
    with open_store(resolve_target(path=str(path))) as store:
        docs = [Document(doc_id=k, source=k, text=t, metadata={}) for k, t in TEXTS.items()]
        Ingestor(store, "kb", encoder, options=IngestOptions(show_progress=False)).ingest_documents(docs)
    return path


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        run_cli(app, expected=(BGEM3QdrantError,), argv=list(args), start_tensorflow=False)
    out = capsys.readouterr()
    return int(done.value.code or 0), out.out, out.err


def test_search_with_cross_encoder_orders_the_mode_s_top_n(
    store_path: Path, encoder: Any, reranker: Any
) -> None:
    with open_store(resolve_target(path=str(store_path))) as store:
        searcher = Searcher(store, "kb", encoder)
        first = searcher.search(QUERY, mode="hybrid", limit=5)
        hits = search_with_cross_encoder(
            searcher, QUERY, reranker, limit=2, rerank_candidates=5, mode="hybrid"
        )
        assert search_with_cross_encoder(searcher, QUERY, None, limit=2, mode="hybrid")[0].id == first[0].id
    want = reranker.rerank(QUERY, [h.text for h in first], top_n=2)
    assert_reordered([i for i, _ in want])  # else hybrid's own order would pass
    assert [h.id for h in hits] == [first[i].id for i, _ in want]
    for hit, (_, score) in zip(hits, want, strict=True):
        np.testing.assert_allclose([hit.score, hit.scores["cross_encoder"]], [score, score], **SCALED)
        assert {"dense", "sparse", "rrf"} <= set(hit.scores)  # the first stage's scores stay beside it


def test_search_command_json_explain_and_legend(
    store_path: Path,
    tiny_checkpoint: Path,
    tiny_reranker_checkpoint: Path,
    reranker: Any,
    encoder: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    common = [
        "--path",
        str(store_path),
        "-c",
        "kb",
        "--model",
        str(tiny_checkpoint),
        "--precision",
        "float32",
    ]
    stage = ["--reranker", str(tiny_reranker_checkpoint), "--rerank-candidates", "5", "-k", "3"]
    code, out, err = cli(capsys, "search", QUERY, *common, *stage, "--json", "--explain")
    assert code == 0, err
    line = json.loads(out)
    assert line["ordered_by"] == "cross_encoder" and line["reranker"] == str(tiny_reranker_checkpoint)
    with open_store(resolve_target(path=str(store_path))) as store:
        first = Searcher(store, "kb", encoder).search(QUERY, mode="rerank", limit=5)
    want = reranker.rerank(QUERY, [h.text for h in first], top_n=3)
    assert_reordered([i for i, _ in want])
    assert [h["id"] for h in line["hits"]] == [first[i].id for i, _ in want]
    for hit, (_, score) in zip(line["hits"], want, strict=True):
        np.testing.assert_allclose(hit["scores"]["cross_encoder"], score, **SCALED)
        assert "colbert" in hit["scores"] and "explanation" in hit
    code, out, err = cli(capsys, "search", QUERY, *common, *stage, "--explain")
    assert code == 0, err
    assert "cross_encoder=" in out and "colbert=" in out
    assert "the cross-encoder" in out and "ordered the top 5 hits of --mode rerank" in " ".join(out.split())
    code, out, err = cli(capsys, "search", QUERY, *common, "--json")  # without: no new keys
    assert code == 0 and set(json.loads(out)) == {"query", "mode", "hits"}


def test_search_command_missing_reranker_is_one_line(
    store_path: Path, tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--path", str(store_path), "-c", "kb", "--model", str(tiny_checkpoint)]
    code, _, err = cli(capsys, "search", QUERY, *args, "--reranker", str(tmp_path / "none"))
    assert code == 1 and "(--reranker)" in err and len(err.strip().splitlines()) == 1, err


def _beir(root: Path) -> Path:
    (root / "qrels").mkdir(parents=True)
    corpus = [json.dumps({"_id": k, "title": "", "text": t}) for k, t in TEXTS.items()]
    (root / "corpus.jsonl").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    queries = {"q1": QUERY, "q2": "bike lanes in Paris", "q3": "what does a search engine return?"}
    (root / "queries.jsonl").write_text(
        "\n".join(json.dumps({"_id": q, "text": t}) for q, t in queries.items()) + "\n", encoding="utf-8"
    )
    qrels = ["query-id\tcorpus-id\tscore", "q1\tbread\t2", "q1\trye\t1", "q2\tbikes\t1", "q3\tsearch\t1"]
    (root / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n", encoding="utf-8")
    return root


def test_eval_offers_the_cross_encoder_as_a_mode(
    tmp_path: Path,
    tiny_checkpoint: Path,
    tiny_reranker_checkpoint: Path,
    reranker: Any,
    encoder: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    beir, store, runs, figures = (
        _beir(tmp_path / "beir"),
        tmp_path / "qd",
        tmp_path / "runs",
        tmp_path / "f.json",
    )
    args = ["eval", str(beir), "-c", "kb", "--path", str(store), "--model", str(tiny_checkpoint),
            "--no-progress", "--run-dir", str(runs), "--json", str(figures)]  # fmt: skip
    code, _, err = cli(capsys, *args, "--modes", "cross")
    assert code == 1 and "--reranker" in err, err
    stage = ["--reranker", str(tiny_reranker_checkpoint), "--rerank-candidates", "3"]
    code, out, err = cli(capsys, *args, "--modes", "rerank,cross", *stage)
    assert code == 0, err
    assert "cross" in out and set(json.loads(figures.read_text())["modes"]) == {"rerank", "cross"}
    cross, first = read_run(runs / "cross.trec"), read_run(runs / "rerank.trec")
    for qid, text in {"q1": QUERY, "q3": "what does a search engine return?"}.items():
        top = [d for d, _ in sorted(first[qid].items(), key=lambda kv: -kv[1])][:3]
        order = [i for i, _ in reranker.rerank(text, [TEXTS[d] for d in top])]
        assert_reordered(order)
        want = [top[i] for i in order]
        got = [d for d, _ in sorted(cross[qid].items(), key=lambda kv: -kv[1])]
        assert got[:3] == want and sorted(got) == sorted(first[qid]), qid  # the rest follow, same depth


def _session(store_path: Path, encoder: Any, reranker: Any) -> Any:
    from bgem3_qdrant.ui.session import StoreSession

    return StoreSession(resolve_target(path=str(store_path)), encoder, reranker=reranker, rerank_candidates=5)


def _rerank_top(store_path: Path, encoder: Any, reranker: Any, top_n: int) -> list[tuple[str, float]]:
    """The library's order of the rerank mode's top 5 hits: (id, score) of the best `top_n`."""
    with open_store(resolve_target(path=str(store_path))) as store:
        first = Searcher(store, "kb", encoder).search(QUERY, mode="rerank", limit=5)
    want = reranker.rerank(QUERY, [h.text for h in first], top_n=top_n)
    assert_reordered([i for i, _ in want])
    return [(first[i].id, s) for i, s in want]


def test_mcp_find_orders_by_the_cross_encoder(store_path: Path, encoder: Any, reranker: Any) -> None:
    from bgem3_qdrant.mcp_server.tools import McpTools

    want = _rerank_top(store_path, encoder, reranker, 3)
    session = _session(store_path, encoder, reranker)
    try:
        tools = McpTools(session, default_collection="kb", model_id="tiny")
        lines = [json.loads(line) for line in tools.call("find", {"query": QUERY, "mode": "rerank", "k": 3})]
    finally:
        session.close()
    assert [h["id"] for h in lines] == [i for i, _ in want]
    np.testing.assert_allclose([h["scores"]["cross_encoder"] for h in lines], [s for _, s in want], **SCALED)


def test_ui_page_adds_a_cross_encoder_column(store_path: Path, encoder: Any, reranker: Any) -> None:
    import httpx
    from ui_support import served

    want = _rerank_top(store_path, encoder, reranker, 3)
    session = _session(store_path, encoder, reranker)
    try:
        with served(session, None) as url:
            info = httpx.get(f"{url}/api/info").json()
            data = httpx.post(
                f"{url}/api/search", json={"collection": "kb", "query": QUERY, "limit": 3}
            ).json()
    finally:
        session.close()
    assert info["modes"][-1] == "cross_encoder" and info["reranker"] == reranker.model_id
    assert list(data["modes"]) == ["dense", "sparse", "hybrid", "rerank", "cross_encoder"]
    column = data["modes"]["cross_encoder"]
    assert [h["id"] for h in column] == [i for i, _ in want]
    np.testing.assert_allclose([h["score"] for h in column], [s for _, s in want], **SCALED)
    assert "cross_encoder" in data["timing"]["search_ms"]


@pytest.mark.parametrize("command", ["ui", "mcp"])
def test_ui_and_mcp_say_a_missing_reranker_in_one_line(
    command: str, store_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(capsys, command, "--path", str(store_path), "--reranker", str(tmp_path / "none"))
    assert code == 1 and "(--reranker)" in err and len(err.strip().splitlines()) == 1, err
