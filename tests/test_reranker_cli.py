"""`bgem3 rerank QUERY PASSAGE...` run as a user runs it (a fresh process), on the tiny reranker."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.flagembedding_ref import flag_reranker
from tests.support import assert_clean_failure, run_module
from tests.tolerances import SCALED

QUERY = "What is BGE M3?"
PASSAGES = [
    "BM25 is a bag-of-words retrieval function",
    "BGE M3 is an embedding model supporting dense retrieval, lexical matching and multi-vector interaction.",
    "搜索引擎返回与查询最相关的文档。",
    "Cafe\u0301 🚀 with combining marks and emoji",
]


def _bgem3(*args: str) -> tuple[int, str, str]:
    done = run_module("bgem3_embeddings.cli", *args)
    return done.returncode, done.stdout, done.stderr


def _reference(checkpoint: Path, normalize: bool) -> list[float]:
    scores: list[float] = flag_reranker(checkpoint).compute_score(
        [(QUERY, p) for p in PASSAGES], normalize=normalize
    )
    return scores


def test_json_is_flagrerankers_order_and_scores(tiny_reranker_checkpoint: Path) -> None:
    code, out, err = _bgem3(
        "rerank", QUERY, *PASSAGES, "--model", str(tiny_reranker_checkpoint), "--json", "--normalize",
        "--top-n", "3", "--device", "cpu", "--precision", "float32",
    )  # fmt: skip
    assert code == 0, err
    records = json.loads(out)
    scores = _reference(tiny_reranker_checkpoint, normalize=True)
    best = sorted(range(len(PASSAGES)), key=lambda i: -scores[i])[:3]
    assert [r["index"] for r in records] == best
    assert [r["text"] for r in records] == [PASSAGES[i] for i in best]
    np.testing.assert_allclose([r["score"] for r in records], [scores[i] for i in best], **SCALED)


def test_plain_output_lists_every_passage_best_first(tiny_reranker_checkpoint: Path) -> None:
    code, out, err = _bgem3("rerank", QUERY, *PASSAGES, "--model", str(tiny_reranker_checkpoint))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["rank", "score", "index", "passage"]
    rows = [line.split(maxsplit=3) for line in lines[1:]]
    scores = _reference(tiny_reranker_checkpoint, normalize=False)  # logits without --normalize
    best = sorted(range(len(PASSAGES)), key=lambda i: -scores[i])
    assert [int(r[2]) for r in rows] == best
    assert [int(r[0]) for r in rows] == [1, 2, 3, 4]
    np.testing.assert_allclose([float(r[1]) for r in rows], [scores[i] for i in best], atol=1e-4)
    assert rows[0][3] == PASSAGES[best[0]][:67] + ("..." if len(PASSAGES[best[0]]) > 70 else "")


@pytest.mark.parametrize(
    ("args", "code", "phrases"),
    [
        (["rerank", "  ", "a passage"], 2, ("QUERY", "the query is empty")),
        (["rerank", "q", "p", "--precision", "float64"], 2, ("--precision", "unknown precision 'float64'")),
    ],
)
def test_bad_arguments_are_one_line(
    tiny_reranker_checkpoint: Path, args: list[str], code: int, phrases: tuple[str, ...]
) -> None:
    done = run_module("bgem3_embeddings.cli", *args, "--model", str(tiny_reranker_checkpoint))
    assert_clean_failure(done, code, *phrases)


def test_an_embedding_checkpoint_is_named(tiny_checkpoint: Path) -> None:
    done = run_module("bgem3_embeddings.cli", "rerank", "q", "p", "--model", str(tiny_checkpoint))
    assert_clean_failure(done, 1, "not a cross-encoder reranker", "BAAI/bge-reranker-v2-m3")
