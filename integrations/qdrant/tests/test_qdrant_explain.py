"""`bgem3-qdrant search --explain`, run as a user runs it: under each hit its scores per mode (the stored
vectors' scores, recomputed from the text by the reference's formulas) and the top sparse terms and ColBERT
alignments in 80 columns; `--json` carries each hit's whole explanation."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from bgem3_qdrant import IngestOptions, Ingestor, open_store, resolve_target
from bgem3_qdrant.schema import CollectionSchema

from tests.support import run_module
from tests.tolerances import APPROX

QUERY = "sourdough starter flour"
# The stored ColBERT rows are float16: a mean of MaxSim moves by well under 1e-3.
FLOAT16_SCORE = {"abs": 1e-3}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, encoder: Any, long_corpus: Path) -> Path:
    """`kb` as ingested by default; `pooled` (ColBERT rows pooled by 2) and `idf` (Qdrant's IDF modifier on
    the sparse vector): the two collections whose search scores and explanations can differ."""
    path = tmp_path_factory.mktemp("explain") / "store"
    with open_store(resolve_target(path=str(path))) as opened:
        Ingestor(opened, "kb", encoder).ingest_paths([long_corpus])
        pooled = IngestOptions(show_progress=False, colbert_pooling=2)
        Ingestor(opened, "pooled", encoder, options=pooled).ingest_paths([long_corpus])
        idf = CollectionSchema(size=encoder.hidden_size, sparse_modifier="idf")
        Ingestor(opened, "idf", encoder, schema=idf).ingest_paths([long_corpus])
    return path


def _search(store: Path, checkpoint: Path, *extra: str, collection: str = "kb", explain: bool = True) -> Any:
    return run_module(
        "bgem3_qdrant", "search", QUERY, "-c", collection, "--path", str(store), "--model", str(checkpoint),
        "-k", "3", *(["--explain"] if explain else []), *extra,
    )


def test_search_explain_json_is_the_encoders_explanation(
    store: Path, tiny_checkpoint: Path, encoder: Any
) -> None:
    done = _search(store, tiny_checkpoint, "--json", "--mode", "rerank")
    assert done.returncode == 0, done.stderr
    hits = json.loads(done.stdout)["hits"]
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


HIT = re.compile(r"^\d+\. \[(?P<score>-?[\d.]+)\] .*\((?P<stages>.*)\)$")


def _hits(stdout: str) -> list[tuple[float, dict[str, float]]]:
    """Each hit line's [score] and its stage scores (name=value)."""
    out = []
    for line in stdout.splitlines():
        if m := HIT.match(line):
            stages = dict(pair.split("=") for pair in m["stages"].split())
            out.append((float(m["score"]), {k: float(v) for k, v in stages.items()}))
    return out


def test_search_says_the_rerank_score_is_qdrants_maxsim_sum(
    store: Path, tiny_checkpoint: Path, encoder: Any
) -> None:
    """25.36 beside colbert=0.94: the output says the first is Qdrant's MaxSim sum over the query's vectors,
    the second FlagEmbedding's mean, and with what count."""
    done = _search(store, tiny_checkpoint, "--mode", "rerank", explain=False)
    assert done.returncode == 0, done.stderr
    vectors = len(encoder.encode([QUERY], return_dense=False, return_colbert_vecs=True)["colbert_vecs"][0])
    lines = done.stdout.splitlines()
    assert f"[score]: Qdrant's rerank, ColBERT MaxSim summed over the query's {vectors} vectors" in lines
    assert f"colbert=: FlagEmbedding's ColBERT score, their mean ([score] / {vectors})" in lines
    hits = _hits(done.stdout)
    assert len(hits) == 3
    for score, stages in hits:  # the legend's arithmetic holds for the printed numbers
        assert score / vectors == pytest.approx(stages["colbert"], abs=1e-4)
    assert all(len(line) <= 80 for line in lines if line.startswith(("[score]", "colbert=")))
    hybrid = _search(store, tiny_checkpoint, "--mode", "hybrid", explain=False)
    legend = "[score]: reciprocal rank fusion of the dense and sparse ranks (rrf=)"
    assert legend in hybrid.stdout.splitlines()
    assert "note:" not in done.stdout + hybrid.stdout  # kb: nothing differs


def test_search_explain_says_which_scores_differ(store: Path, tiny_checkpoint: Path, encoder: Any) -> None:
    """Pooled ColBERT rows and an IDF-weighted sparse index make the search's scores differ from the
    explanation's (the text encoded again, FlagEmbedding's formulas): the output says which is which."""
    pooled = _search(store, tiny_checkpoint, "--mode", "rerank", collection="pooled")
    assert pooled.returncode == 0, pooled.stderr
    text = " ".join(pooled.stdout.split())
    assert "note: the collection stores ColBERT rows pooled by 2: colbert= and the rerank score come from " \
        "the pooled rows, the explanation's colbert from every token of the text" in text
    assert "IDF" not in text
    # and they do differ: the hit's colbert= (pooled rows) is not the explanation's colbert
    json_lines = _search(store, tiny_checkpoint, "--mode", "rerank", "--json", collection="pooled")
    hits = json.loads(json_lines.stdout)["hits"]
    assert any(
        abs(h["scores"]["colbert"] - h["explanation"]["colbert"]["score"]) > 1e-3 for h in hits
    ), [(h["scores"]["colbert"], h["explanation"]["colbert"]["score"]) for h in hits]
    assert "pooled by 2" in json_lines.stderr  # --json: stdout keeps JSON lines only

    idf = _search(store, tiny_checkpoint, "--mode", "sparse", collection="idf")
    assert idf.returncode == 0, idf.stderr
    text = " ".join(idf.stdout.split())
    assert "note: the collection's sparse index weights terms by IDF: the sparse stage ranked with IDF; " \
        "sparse= and the explanation's sparse score are FlagEmbedding's, without IDF" in text
    assert "sparse=: FlagEmbedding's lexical score, without IDF" in idf.stdout.splitlines()
    for score, stages in _hits(idf.stdout):  # Qdrant's IDF score is not the reference's sparse=
        assert score != pytest.approx(stages["sparse"], abs=1e-4)
    notes = [line for line in idf.stdout.splitlines() if not HIT.match(line) and not line.startswith("   ")]
    assert notes and all(len(line) <= 80 for line in notes), notes
    plain = _search(store, tiny_checkpoint, "--mode", "rerank")
    assert "note:" not in plain.stdout
