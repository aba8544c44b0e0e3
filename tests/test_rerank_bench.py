"""benchmarks/rerank_bench.py's own logic (not a timing): the passages it builds, the best pass per engine
across rounds, the ratios at the same precision and the score agreement it prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import load_benchmark

bench = load_benchmark("rerank_bench")


def test_passages_have_the_asked_token_count(tiny_reranker_checkpoint: Path) -> None:
    from bgem3_embeddings.tokenizer import BGEM3Tokenizer

    texts = bench.passages(tiny_reranker_checkpoint, 5, 40)
    tokenizer = BGEM3Tokenizer.from_dir(tiny_reranker_checkpoint)
    assert len(set(texts)) == 5
    assert [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] == [40] * 5


def test_best_pass_ratios_and_agreement() -> None:
    def run(engine: str, walls: list[float], scores: list[float]) -> dict:
        return {"engine": engine, "compute_dtype": "float32", "load_s": 1.0, "walls": walls,
                "peak_rss_mb": 10.0, "threads": 2, "scores": scores}  # fmt: skip

    results = [
        run("ours-float32", [2.0, 1.5], [1.0, 2.0]),
        run("flag-float32", [4.0], [1.0, 2.5]),
        run("ours-float32", [1.0], [1.0, 2.0]),  # a second round, faster: kept
        {"engine": "flag-bfloat16", "error": "exit 1: boom"},
        run("ours-bfloat16", [2.0], [1.5, 2.0]),
        run("ours-int8", [0.5], [1.0, 2.0]),
    ]
    rows = bench.summarize(results, tokens=1000, pairs=10)
    by = {r["engine"]: r for r in rows}
    assert by["ours-float32"]["wall_s"] == 1.0 and by["ours-float32"]["tokens_per_s"] == 1000.0
    assert "error" in by["flag-bfloat16"]
    # int8 against FlagReranker's fp32 (it has no int8); bf16 has no FlagReranker row here.
    assert bench.ratios(rows) == {
        "ours-float32 / flag-float32": pytest.approx(4.0),
        "ours-int8 / flag-float32": pytest.approx(8.0),
    }
    assert bench.score_agreement(rows) == {"ours-float32": 0.5, "ours-bfloat16": 0.5, "ours-int8": 0.5}
