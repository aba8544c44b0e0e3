"""`bgem3-qdrant search --explain`, run as a user runs it: under each hit its scores per mode (the stored
vectors' scores, recomputed from the text by the reference's formulas) and the top sparse terms and ColBERT
alignments in 80 columns; `--json` carries each hit's whole explanation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bgem3_qdrant import Ingestor, open_store, resolve_target

from tests.support import run_module
from tests.tolerances import APPROX

QUERY = "sourdough starter flour"
# The stored ColBERT rows are float16: a mean of MaxSim moves by well under 1e-3.
FLOAT16_SCORE = {"abs": 1e-3}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, encoder: Any, long_corpus: Path) -> Path:
    path = tmp_path_factory.mktemp("explain") / "store"
    with open_store(resolve_target(path=str(path))) as opened:
        Ingestor(opened, "kb", encoder).ingest_paths([long_corpus])
    return path


def _search(store: Path, checkpoint: Path, *extra: str) -> Any:
    return run_module(
        "bgem3_qdrant", "search", QUERY, "-c", "kb", "--path", str(store), "--model", str(checkpoint),
        "-k", "3", "--explain", *extra,
    )


def test_search_explain_json_is_the_encoders_explanation(
    store: Path, tiny_checkpoint: Path, encoder: Any
) -> None:
    done = _search(store, tiny_checkpoint, "--json", "--mode", "rerank")
    assert done.returncode == 0, done.stderr
    hits = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(hits) == 3
    for hit in hits:
        e = hit["explanation"]
        assert e["passage"]["text"] == hit["text"] and e["query"]["text"] == QUERY
        local = encoder.explain(QUERY, hit["text"])
        assert e["all"]["score"] == pytest.approx(local.combined, **APPROX)
        assert [t["token_id"] for t in e["sparse"]["terms"]] == [t.token_id for t in local.sparse_terms]
        # the hit's stage scores (from the stored vectors) are the explanation's totals
        assert hit["scores"]["dense"] == pytest.approx(e["dense"]["score"], **APPROX)
        assert hit["scores"]["sparse"] == pytest.approx(e["sparse"]["score"], **APPROX)
        assert hit["scores"]["colbert"] == pytest.approx(e["colbert"]["score"], **FLOAT16_SCORE)


def test_search_explain_text_fits_80_columns(store: Path, tiny_checkpoint: Path, encoder: Any) -> None:
    done = _search(store, tiny_checkpoint, "--width", "70")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # Under each hit (indented): its text (--width 70) and the explanation. The hit's own line names its
    # source path, as long as the path is.
    under = [line for line in lines if line.startswith("   ")]
    assert len(under) > 3 * 6
    assert all(len(line) <= 80 for line in under), [line for line in under if len(line) > 80]
    assert sum(line.startswith("   dense ") for line in lines) == 3
    assert sum(line.startswith("   colbert: query token") for line in lines) == 3
    from bgem3_qdrant import Searcher

    from bgem3_embeddings.explain.render import summary_lines

    with open_store(resolve_target(path=str(store))) as opened:
        hits = Searcher(opened, "kb", encoder).search(QUERY, limit=3)
    expected = [line for h in hits for line in summary_lines(encoder.explain(QUERY, h.text))]
    shown = [line.strip() for line in lines if line.startswith(("   dense ", "   all = "))]
    assert shown == expected


def test_search_explain_bad_weights_is_one_line(store: Path, tiny_checkpoint: Path) -> None:
    from tests.support import assert_clean_failure

    done = _search(store, tiny_checkpoint, "--weights", "0,0,0")
    assert_clean_failure(done, 2, "--weights", "sum to zero")
