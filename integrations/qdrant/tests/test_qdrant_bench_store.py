"""`bgem3-qdrant bench-store` on a tiny synthetic corpus: the report holds every figure for each engine,
and the agreement figures are computed from the engines' actual results (the engine comparison must
show identical top-k with float32 ColBERT, scores within 1e-5, as the issue's target says)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bgem3_qdrant.cli import app
from bgem3_qdrant.errors import BGEM3QdrantError
from bgem3_qdrant.tools.bench_store import MODES, compare, format_report

from bgem3_embeddings.cli_support import run_cli


def test_compare_counts_overlap_order_and_score_diff() -> None:
    a = [[("x", 0.9), ("y", 0.8)], [("p", 0.5), ("q", 0.4)]]
    b = [[("y", 0.8), ("x", 0.85)], [("p", 0.5), ("r", 0.3)]]
    got = compare(a, b, k=2)
    assert got["top_k_overlap"] == pytest.approx(0.75)  # 2/2 and 1/2
    assert got["identical_order"] == 0.0  # first query's order differs, second's ids differ
    assert got["max_score_diff"] == pytest.approx(0.05)
    assert compare(a, a)["identical_order"] == 1.0 and compare(a, a)["max_score_diff"] == 0.0


def test_bench_store_command_reports_every_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        "bench-store",
        "--chunks", "40", "--dim", "16", "--tokens", "6", "--sparse", "5", "--queries", "6",
        "--engines", "edge,local", "--colbert-dtypes", "float32,float16,uint8",
        "--workdir", str(tmp_path / "w"), "--json",
    ]  # fmt: skip
    with pytest.raises(SystemExit) as done:
        run_cli(app, expected=(BGEM3QdrantError,), argv=args, start_tensorflow=False)
    out = capsys.readouterr()
    assert done.value.code in (0, None), out.err
    rep = json.loads(out.out)

    assert set(rep["runs"]) == {"edge/float32", "edge/float16", "edge/uint8", "local/float32"}
    keys = [f"{m}{f}" for f in ("", " +filter") for m in MODES]
    for name, r in rep["runs"].items():
        assert r["points"] == 40, name
        assert r["write_chunks_per_s"] > 0 and r["disk_bytes"] > 0 and r["reopen_s"] > 0 and r["rss_mb"] > 0
        assert r["disk_vs_raw_f32_colbert"] == pytest.approx(r["disk_bytes"] / (40 * 6 * 16 * 4))
        assert list(r["latency_ms"]) == keys
        assert all(0 < p50 <= p95 for p50, p95 in r["latency_ms"].values()), r["latency_ms"]

    assert rep["agreement_vs"] == "edge/float32"
    assert set(rep["agreement"]) == {"edge/float16", "edge/uint8", "local/float32"}
    # Engines on the same data with float32 ColBERT: identical ids in identical order, scores within 1e-5.
    # (RRF gives equal scores to hits of equal ranks, and the engines order such ties differently.)
    for key, a in rep["agreement"]["local/float32"].items():
        assert a["top_k_overlap"] == 1.0 and (a["identical_order"] == 1.0 or key.startswith("hybrid")), key
        assert a["max_score_diff"] < 1e-5, key
    # ColBERT dtype changes only the rerank stage; its score differences are computed and small.
    f16 = rep["agreement"]["edge/float16"]
    assert f16["dense"]["max_score_diff"] < 1e-5 and f16["dense"]["identical_order"] == 1.0
    assert 0 < f16["rerank"]["max_score_diff"] < 1e-2
    assert 0 < rep["agreement"]["edge/uint8"]["rerank"]["max_score_diff"] < 0.1

    # The planted chunks: exact float32 MaxSim in numpy and Edge's float32 rerank find the same ones.
    assert rep["runs"]["edge/float32"]["planted_recall"] == rep["reference_recall"]["float32"]
    assert all(0 <= r["planted_recall"] <= 1 for r in rep["runs"].values())
    for name, r in rep["runs"].items():  # the first pass after dropping the store's pages, then warm
        assert list(r["cold_ms"]) == ["rerank", "rerank +filter"], name
        assert all(0 < p50 <= p95 for p50, p95 in r["cold_ms"].values()), name

    text = format_report(rep)
    labels = ("write (chunks/s)", "disk / raw float32 ColBERT", "reopen, cache dropped (s)")
    labels += ("resident memory after open (MiB)",)
    labels += ("rerank +filter p50 / p95 (ms)", "agreement with edge/float32", "planted recall@10")
    labels += ("rerank cold p50 / p95 (ms)", "targets missed", "targets (100,000 chunks")
    for label in labels:
        assert label in text, label
