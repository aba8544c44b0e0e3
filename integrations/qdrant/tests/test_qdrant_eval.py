"""`bgem3-qdrant eval` on a BEIR-format dataset the tests write (graded qrels, a query without a relevant
document, a query a sparse search finds nothing for, a query whose id is a document's):

- the reported metrics are pytrec_eval's on the run files written (every judged query counted);
- the dense and sparse runs rank documents exactly as the reference scores (transformers + FlagEmbedding
  heads, ReferenceM3) of the stored chunk texts do, a document scoring as its best chunk; colbert and
  all score as FlagEmbedding's colbert_score and compute_score;
- --ignore-identical-ids, the compare table of several collections (float16 / pooled), JSON, errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bgem3_qdrant import IngestOptions, Ingestor, open_store, resolve_target
from bgem3_qdrant.cli import app
from bgem3_qdrant.errors import BGEM3QdrantError
from bgem3_qdrant.evaluation import EVAL_MODES, EvalOptions, evaluate, load_beir
from bgem3_qdrant.evaluation.metrics import MEASURES, per_query, trec_order
from bgem3_qdrant.evaluation.runs import read_run
from bgem3_qdrant.sources import iter_documents

from bgem3_embeddings.cli_support import run_cli
from tests.support import ReferenceM3, assert_clean_failure, run_module

DOCS = {
    "d1": ("Sourdough", "Feed the sourdough starter once a day with equal weights of flour and water."),
    "d2": ("", "Rye flour makes a starter lively; white flour makes it mild. Bake when it doubles."),
    "d3": ("Cycling", "Separated bike lanes follow the Seine and the rue de Rivoli in Paris."),
    "d4": ("Bicycles", "Shared electric bicycles stand in almost every district; in winter use lights."),
    "d5": ("Energiewende", "Windkraft an Land und auf See liefert den größten Anteil, Photovoltaik folgt."),
    "d6": ("", "Neue Stromtrassen und Batteriespeicher verbinden den windigen Norden mit dem Süden."),
    "d7": ("Espresso", "Un espresso richiede sette grammi di caffè macinato fine e nove bar di pressione."),
    "d8": ("Crema", "L'estrazione dura venticinque secondi e la crema è color nocciola."),
    "d9": ("Kamchatka", "На Камчатке около трёхсот вулканов, из них около тридцати действующих."),
    # Long enough for several chunks at --chunk-size 24: it scores as its best chunk.
    "d10": (
        "Hybrid search",
        "Hybrid search mixes dense meaning with sparse exact words like product codes XJ-900. "
        "ColBERT compares each query token with every passage token and keeps the best match. "
        "Les vecteurs ColBERT servent seulement à reclasser une courte liste de candidats. "
        "Dense vectors find paraphrases; sparse weights find rare exact terms and codes.",
    ),
}
QUERIES = {
    "q1": "how often do I feed a sourdough starter?",
    "q2": "bike lanes in Paris",
    "q3": "Windkraft und Photovoltaik",
    "q4": "espresso pressione e crema",
    "q5": "product codes in hybrid search",
    "q-norel": "volcanoes of Kamchatka",  # judged, but no document is relevant (grades 0)
    "q-nohits": "東京 大阪 京都",  # <unk> tokens only: no lexical weight, so no sparse hit
    "d3": "Seine bike lanes",  # its id is a document's (BEIR's evaluation drops that document)
}
QRELS = [
    ("q1", "d1", 2), ("q1", "d2", 1), ("q2", "d3", 2), ("q2", "d4", 1), ("q3", "d5", 2), ("q3", "d6", 1),
    ("q4", "d7", 1), ("q4", "d8", 2), ("q5", "d10", 2), ("q-norel", "d9", 0), ("q-nohits", "d1", 1),
    ("d3", "d3", 1), ("d3", "d4", 1),
]  # fmt: skip
CHUNKING = ["--chunk-size", "24", "--chunk-overlap", "4"]


def write_beir(root: Path) -> Path:
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    with (root / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for did, (title, text) in DOCS.items():
            f.write(
                json.dumps({"_id": did, "title": title, "text": text, "metadata": {}}, ensure_ascii=False)
            )
            f.write("\n")
    with (root / "queries.jsonl").open("w", encoding="utf-8") as f:
        for qid, text in QUERIES.items():
            f.write(json.dumps({"_id": qid, "text": text, "metadata": {}}, ensure_ascii=False) + "\n")
    lines = ["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t{s}" for q, d, s in QRELS)]
    (root / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def beir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_beir(tmp_path_factory.mktemp("beir") / "tinybeir")


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The command as main() runs it, in this process."""
    with pytest.raises(SystemExit) as done:
        run_cli(app, expected=(BGEM3QdrantError,), argv=list(args), start_tensorflow=False)
    out = capsys.readouterr()
    return int(done.value.code or 0), out.out, out.err


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory, beir: Path, tiny_checkpoint: Path) -> dict[str, Any]:
    """One `eval` run into an empty collection (it ingests the corpus), with run files and JSON."""
    root = tmp_path_factory.mktemp("eval")
    store, runs, js = root / "store", root / "runs", root / "figures.json"
    args = ["eval", str(beir), "-c", "kb", "--path", str(store), "--model", str(tiny_checkpoint),
            "--run-dir", str(runs), "--json", str(js), "--no-progress", *CHUNKING]  # fmt: skip
    with pytest.raises(SystemExit) as done:
        run_cli(app, expected=(BGEM3QdrantError,), argv=args, start_tensorflow=False)
    assert done.value.code in (0, None)
    return {"store": store, "runs": runs, "json": json.loads(js.read_text()), "root": root}


def test_beir_corpus_lines_are_read_as_beir_does(beir: Path) -> None:
    docs = {d.doc_id: d for d in iter_documents([beir / "corpus.jsonl"])}
    assert set(docs) == set(DOCS)
    assert (
        docs["d1"].text
        == "Sourdough Feed the sourdough starter once a day with equal weights of flour and water."
    )
    assert docs["d2"].text == DOCS["d2"][1]  # an empty title adds nothing
    assert "title" not in docs["d1"].metadata
    data = load_beir(beir)
    assert list(data.queries) == list(dict.fromkeys(q for q, _, _ in QRELS))
    assert data.qrels["q1"] == {"d1": 2, "d2": 1} and data.relevant_queries() == len(data.qrels) - 1


def test_reported_metrics_are_pytrec_evals_on_the_run_files(evaluated: dict[str, Any], beir: Path) -> None:
    import pytrec_eval

    figures = evaluated["json"]
    assert figures["dataset"] == "tinybeir" and set(figures["modes"]) == set(EVAL_MODES)
    assert figures["bytes_per_chunk"] > 0 and figures["chunks"] > len(DOCS)  # d10 has several chunks
    qrels = load_beir(beir).qrels
    for mode in EVAL_MODES:
        path = evaluated["runs"] / f"{mode}.trec"
        lines = [line.split() for line in path.read_text().splitlines()]
        assert all(len(f) == 6 and f[1] == "Q0" and f[5] == mode for f in lines)
        run = read_run(path)
        for qid, docs in run.items():
            ranks = [int(f[3]) for f in lines if f[0] == qid]
            assert ranks == list(range(1, len(docs) + 1)) and len(docs) <= 100
        # pytrec_eval on the file, every judged query counted (0 where the run has none of its documents).
        for name, (measure, depth) in MEASURES.items():
            ranked = {q: dict(trec_order(d)[:depth]) if depth else d for q, d in run.items()}
            values = pytrec_eval.RelevanceEvaluator(qrels, {measure}).evaluate(ranked)
            want = sum(v[measure] for v in values.values()) / len(qrels)
            assert figures["modes"][mode][name] == pytest.approx(want, abs=1e-12), (mode, name)
        lat = figures["modes"][mode]["latency_ms"]
        assert 0 < lat["p50"] <= lat["p95"]
    sparse = read_run(evaluated["runs"] / "sparse.trec")
    assert "q-nohits" not in sparse and "q-nohits" in read_run(evaluated["runs"] / "dense.trec")
    # A query with no relevant document scores 0; documents whose id is the query's are kept by default.
    per = per_query(qrels, read_run(evaluated["runs"] / "dense.trec"))
    assert per["ndcg@10"]["q-norel"] == 0.0 and per["ndcg@10"]["q1"] > 0
    assert "d3" in read_run(evaluated["runs"] / "dense.trec")["d3"]


def _chunks(store: Path) -> dict[str, list[str]]:
    """Document id -> its stored chunk texts."""
    out: dict[str, list[str]] = {}
    with open_store(resolve_target(path=str(store))) as st:
        for p in st.iter_points("kb", with_payload=True):
            out.setdefault(p.payload["doc_id"], []).append(p.payload["text"])
    return out


def test_runs_rank_as_the_reference_scores(evaluated: dict[str, Any], tiny_checkpoint: Path) -> None:
    chunks = _chunks(evaluated["store"])
    texts = [t for ts in chunks.values() for t in ts]
    owner = [d for d, ts in chunks.items() for _ in ts]
    ref_model = ReferenceM3(tiny_checkpoint)
    ref = ref_model.encode(texts)
    qids = list(QUERIES)
    q = ref_model.encode([QUERIES[i] for i in qids], max_length=512)
    weights = (0.4, 0.2, 0.4)
    for mode, tol in (("dense", 1e-5), ("sparse", 1e-5), ("colbert", 2e-3), ("all", 2e-3)):
        run = read_run(evaluated["runs"] / f"{mode}.trec")
        for i, qid in enumerate(qids):
            per_chunk = []
            for j in range(len(texts)):
                d = float(q["dense_vecs"][i] @ ref["dense_vecs"][j])
                s = ref_model.lexical_score(q["lexical_weights"][i], ref["lexical_weights"][j])
                c = ref_model.colbert_score(q["colbert_vecs"][i], ref["colbert_vecs"][j])
                combined = (weights[0] * d + weights[1] * s + weights[2] * c) / sum(weights)
                per_chunk.append({"dense": d, "sparse": s, "colbert": c, "all": combined}[mode])
            best: dict[str, float] = {}
            for doc, score in zip(owner, per_chunk, strict=True):
                if mode == "sparse" and score <= 0:
                    continue  # no shared token: a sparse search does not return it
                best[doc] = max(best.get(doc, -np.inf), score)
            got = run.get(qid, {})
            if mode in ("dense", "sparse"):  # exactly the reference's order, scores within float32 noise
                assert [d for d, _ in trec_order(got)] == [d for d, _ in trec_order(best)], (mode, qid)
            # ColBERT is stored as float16: scores within its rounding (near-ties may swap places).
            assert got.keys() == best.keys(), (mode, qid)
            np.testing.assert_allclose([got[d] for d in best], list(best.values()), atol=tol, err_msg=mode)


def test_ignore_identical_ids(tmp_path: Path, beir: Path, evaluated: dict[str, Any], encoder: Any) -> None:
    with open_store(resolve_target(path=str(evaluated["store"]))) as store:
        opts = EvalOptions(modes=("dense",), ignore_identical_ids=True, show_progress=False, run_dir=tmp_path)
        report = evaluate(store, ["kb"], encoder, beir, options=opts)
    run = read_run(tmp_path / "dense.trec")
    assert "d3" not in run["d3"] and "d4" in run["d3"]
    assert report.to_json()["ignore_identical_ids"] is True
    assert "documents whose id is the query's dropped" in " ".join(report.format().split())


def test_compare_table_of_several_collections(
    tmp_path: Path, beir: Path, encoder: Any, tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    with open_store(resolve_target(path=str(store))) as st:
        for name, pooling in (("f16", 1), ("pool2", 2)):
            opts = IngestOptions(chunk_size=24, chunk_overlap=4, colbert_pooling=pooling, show_progress=False)
            Ingestor(st, name, encoder, options=opts).ingest_paths([beir / "corpus.jsonl"])
    js = tmp_path / "cmp.json"
    code, out, err = cli(
        capsys, "eval", str(beir), "-c", "f16", "-c", "pool2", "--path", str(store), "--model",
        str(tiny_checkpoint), "--modes", "dense,colbert", "--modes", "rerank", "--json", str(js),
        "--run-dir", str(tmp_path / "runs"), "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    assert "d nDCG@10: paired per-query difference against 'f16'" in out
    assert "bytes on disk per chunk: f16" in out and "pooled by 2" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:2] in (["colbert", "pool2"],)]
    assert len(rows) == 2 and "/" in rows[1][-1]  # its measures, then its paired difference
    assert max(len(line) for line in out.splitlines() if not line.startswith("run file:")) <= 100, out
    figures = json.loads(js.read_text())
    assert figures["collection"] == "f16" and list(figures["modes"]) == ["dense", "rerank", "colbert"]
    pooled = figures["compare"]["pool2"]
    assert pooled["colbert_pooling"] == 2 and pooled["bytes_per_chunk"] < figures["bytes_per_chunk"]
    # Pooling changes only ColBERT: dense is the same search, so every query ties.
    dense = pooled["paired_ndcg@10"]["dense"]
    assert dense["mean_diff"] == 0.0 and dense["losses"] == dense["wins"] == 0
    w, t, lo = (pooled["paired_ndcg@10"]["colbert"][k] for k in ("wins", "ties", "losses"))
    assert w + t + lo == figures["queries"]
    assert (tmp_path / "runs" / "pool2" / "colbert.trec").is_file()


def test_eval_failures_are_one_line(tmp_path: Path, beir: Path, tiny_checkpoint: Path) -> None:
    common = ("-c", "kb", "--path", str(tmp_path / "store"), "--model", str(tiny_checkpoint))
    missing = run_module("bgem3_qdrant", "eval", str(tmp_path / "nowhere"), *common)
    assert_clean_failure(missing, 1, "queries.jsonl not found (DATASET)", "download one")
    mode = run_module("bgem3_qdrant", "eval", str(beir), *common, "--modes", "dense,fast")
    assert_clean_failure(mode, 1, "--modes takes dense, sparse", "not fast")
    split = run_module("bgem3_qdrant", "eval", str(beir), *common, "--split", "dev")
    assert_clean_failure(split, 1, "qrels/dev.tsv not found (DATASET)")


def test_disk_bytes_right_after_optimize_are_the_collections(tmp_path: Path) -> None:
    """eval measures bytes per chunk in the process that may just have ingested: the segments the
    optimizer replaced must be gone by then (Edge frees them on flush)."""
    from bgem3_qdrant.schema import CollectionSchema
    from bgem3_qdrant.stores.layout import allocated_bytes
    from bgem3_qdrant.tools.bench_store import BenchData

    # Large enough (15 MB) for Edge's optimizer to rewrite the segment (smaller ones are left as they are).
    data = BenchData(chunks=1100, dim=128, tokens=48, sparse=4)
    with open_store(resolve_target(path=str(tmp_path / "s"))) as st:
        st.create_collection("c", CollectionSchema(size=128))
        for batch in data.batches():
            st.upsert("c", batch)
        st.optimize("c")
        live = st.disk_bytes("c")
    assert live is not None and live == allocated_bytes(tmp_path / "s" / "collections" / "c")
    with open_store(resolve_target(path=str(tmp_path / "s"))) as st:
        assert st.count("c") == 1100
        assert abs(live - (st.disk_bytes("c") or 0)) < 0.05 * live


def _ingest(store: Path, name: str, corpus: Path, encoder: Any) -> None:
    with open_store(resolve_target(path=str(store))) as st:
        opts = IngestOptions(chunk_size=24, chunk_overlap=4, show_progress=False)
        Ingestor(st, name, encoder, options=opts).ingest_paths([corpus])


def test_a_collection_of_another_corpus_is_refused_before_the_model_loads(
    tmp_path: Path, beir: Path, encoder: Any
) -> None:
    other = tmp_path / "notes.jsonl"
    other.write_text(json.dumps({"id": "n1", "text": "Notes about something else entirely."}) + "\n")
    _ingest(tmp_path / "store", "kb", other, encoder)
    # --model names no checkpoint: the refusal comes before any model is looked for
    done = run_module("bgem3_qdrant", "eval", str(beir), "-c", "kb", "--path", str(tmp_path / "store"),
                      "--model", str(tmp_path / "no-model"))  # fmt: skip
    assert_clean_failure(done, 1, "collection 'kb' holds none of the 10 documents", "-c tinybeir")


def test_a_collection_missing_some_judged_documents_is_a_warning(
    tmp_path: Path, beir: Path, encoder: Any, tiny_checkpoint: Path
) -> None:
    part = tmp_path / "part.jsonl"
    with part.open("w", encoding="utf-8") as f:
        for did in ("d1", "d2", "d3", "d4"):
            f.write(json.dumps({"_id": did, "title": DOCS[did][0], "text": DOCS[did][1]}) + "\n")
    _ingest(tmp_path / "store", "part", part, encoder)
    done = run_module("bgem3_qdrant", "eval", str(beir), "-c", "part", "--path", str(tmp_path / "store"),
                      "--model", str(tiny_checkpoint), "--modes", "dense", "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.strip()]
    assert warnings == [
        "warning: collection 'part' holds 4 of the 10 documents tinybeir's qrels judge: the missing ones "
        "count as not retrieved"
    ], done.stderr
    assert "nDCG@10" in done.stdout


def test_compare_tables_fit_100_columns_with_long_names() -> None:
    from bgem3_qdrant.evaluation.modes import ModeSettings
    from bgem3_qdrant.evaluation.report import CollectionResult, EvalReport, ModeResult

    def result(name: str, shift: float) -> CollectionResult:
        c = CollectionResult(name, 1000, "float16", 1, 1024 * 1000)
        for mode in EVAL_MODES:
            scores = {f"q{i}": min(1.0, i / 10 + shift) for i in range(10)}
            c.modes[mode] = ModeResult(mode, {m: dict(scores) for m in MEASURES}, [1.0, 2.0, 30.0])
        return c

    names = ["scifact-float16-unpooled-baseline-run", "scifact-uint8-pooled-by-2-second-run"]
    collections = [result(names[0], 0.0), result(names[1], 0.05)]
    report = EvalReport("scifact", "test", "BAAI/bge-m3", "Qdrant Edge store at ./qdrant_data", 10, 9,
                        ModeSettings(), False, 1.0, collections)  # fmt: skip
    lines = report.format().splitlines()
    assert max(len(line) for line in lines) <= 100, "\n".join(lines)
    assert f"1. '{names[0]}'" in report.format() and f"2. '{names[1]}'" in report.format()
    paired = [line.split() for line in lines if line.split()[:2] == ["dense", "2"]]
    assert len(paired) == 2 and paired[1][2] == "+0.0500"  # collections by number, the difference whole


def test_the_paired_test_on_constructed_per_query_numbers() -> None:
    from bgem3_qdrant.evaluation.significance import EXACT_MAX_QUERIES, _all_signs, sign_flip_p

    # Exact (every sign assignment): k equal wins and nothing else is as extreme as 2 of 2^k assignments.
    assert sign_flip_p([0.1] * 6) == 2 / 64  # beyond chance at 0.05
    assert sign_flip_p([0.1] * 5) == 2 / 32  # five queries cannot be
    assert sign_flip_p([-0.1] * 6) == 2 / 64  # two-sided: a clear loss as much as a clear win
    assert sign_flip_p([0.1, -0.1, 0.2, -0.2]) == 1.0  # a mirror image: no direction at all
    assert sign_flip_p([0.0] * 30) == 1.0  # identical runs
    assert sign_flip_p([0.3] * 6 + [0.0] * 20) == 2 / 64  # ties add nothing: still exact over 6
    # Beyond EXACT_MAX_QUERIES: seeded draws, the same p every time, close to the exact value.
    d = np.random.default_rng(3).normal(0.03, 0.1, EXACT_MAX_QUERIES + 2)
    exact = float(np.mean(np.abs(_all_signs(len(d)) @ d) >= abs(d.sum()) - 1e-12))
    assert sign_flip_p(d) == sign_flip_p(d) and abs(sign_flip_p(d) - exact) < 0.01, exact
    win = np.random.default_rng(1).normal(0.1, 0.05, 40)  # a clear win on 40 queries
    assert sign_flip_p(win) == 1 / 10_001  # no drawn assignment is as extreme


def test_compare_says_whether_each_difference_is_beyond_chance() -> None:
    from bgem3_qdrant.evaluation.modes import ModeSettings
    from bgem3_qdrant.evaluation.report import CollectionResult, EvalReport, ModeResult

    base_scores = {f"q{i}": 0.3 + 0.02 * (i % 7) for i in range(30)}

    def result(name: str, shift: dict[str, float]) -> CollectionResult:
        c = CollectionResult(name, 100, "float16", 1, None)
        for mode in ("dense", "sparse"):
            scores = {q: v + shift.get(mode, 0.0) * (1 + (int(q[1:]) % 3)) for q, v in base_scores.items()}
            c.modes[mode] = ModeResult(mode, {m: dict(scores) for m in MEASURES}, [1.0])
        return c

    runs = [result("base", {}), result("tuned", {"dense": 0.05}), result("same", {})]
    report = EvalReport("held", "test", "tiny", "store", 30, 30, ModeSettings(), False, 1.0, runs)
    rows = {tuple(line.split()[:2]): line.split() for line in report.format().splitlines()}
    assert rows["dense", "tuned"][-2:] == ["yes", "30/0/0"]  # every query better
    assert rows["sparse", "tuned"][-2:] == ["no", "0/30/0"]  # the same numbers: not beyond chance
    assert rows["dense", "same"][-3:] == ["1.000", "no", "0/30/0"]
    figures = report.to_json()["compare"]
    tuned = figures["tuned"]["paired_ndcg@10"]
    assert tuned["dense"]["beyond_chance"] is True and tuned["dense"]["p_value"] < 0.001
    assert tuned["dense"]["mean_diff"] > 0.05 and tuned["dense"]["test"].startswith("paired sign-flip")
    assert tuned["sparse"] == {**tuned["sparse"], "beyond_chance": False, "p_value": 1.0, "mean_diff": 0.0}
    assert figures["same"]["paired_ndcg@10"]["dense"]["beyond_chance"] is False
