"""ColBERT token pooling (`ingest --colbert-pooling N`): stored rows equal colbert-ai's hierarchical pooling
of the reference ColBERT rows, a pooled collection holds about 1/N of the rows, the factor is recorded
with the model and another factor is refused; `Collection.add` (LangChain, LlamaIndex) keeps it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from bgem3_qdrant import Collection, Document, IngestOptions, Ingestor, Searcher, open_store, resolve_target
from bgem3_qdrant.identity import ModelIdentity, ModelMismatchError, stored_pooling
from bgem3_qdrant.pooling import check_pool_factor, pool_rows, pooled_row_count
from bgem3_qdrant.stores import BGEM3Store
from scipy.cluster.hierarchy import ClusterWarning, fcluster, linkage

from tests.support import ReferenceM3, assert_clean_failure, run_module

OPTS = {"chunk_size": 40, "chunk_overlap": 8, "batch_size": 8, "show_progress": False}


def colbert_ai_pool(rows: np.ndarray, pool_factor: int) -> np.ndarray:
    """colbert-ai's `pool_embeddings_hierarchical` for one passage (protected_tokens=0), as published in
    colbert/modeling/checkpoint.py: torch similarities, Ward linkage over the rows of 1 - similarity,
    `fcluster(maxclust)` with max(len // pool_factor, 1) clusters, cluster means, L2-normalised."""
    emb = torch.from_numpy(np.asarray(rows, dtype=np.float32))
    similarities = 1 - torch.mm(emb, emb.t()).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ClusterWarning)  # rows of the matrix are observations, on purpose
        Z = linkage(similarities, metric="euclidean", method="ward")
    max_clusters = max(emb.shape[0] // pool_factor, 1)
    labels = fcluster(Z, t=max_clusters, criterion="maxclust")
    pooled = []
    for cluster_id in range(1, max_clusters + 1):
        idx = torch.where(torch.tensor(labels == cluster_id))[0]
        if idx.numel() > 0:
            pooled.append(emb[idx].mean(dim=0))
    return torch.nn.functional.normalize(torch.stack(pooled), p=2, dim=-1).numpy()


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("factor", [2, 3, 4])
@pytest.mark.parametrize("rows", [2, 3, 7, 33, 129])
def test_pool_rows_is_colbert_ais_pooling(rows: int, factor: int) -> None:
    rng = np.random.default_rng(rows * 10 + factor)
    # Rows with some structure (near-duplicates of a few directions), as a document's tokens have.
    centres = _unit(rng.standard_normal((max(rows // 3, 1), 48)))
    x = _unit(centres[rng.integers(0, len(centres), rows)] + 0.3 * rng.standard_normal((rows, 48)))
    got = pool_rows(x, factor)
    want = colbert_ai_pool(x, factor)
    assert got.shape == want.shape == (pooled_row_count(rows, factor), 48)
    np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_pooling_off_and_single_rows_pass_through() -> None:
    x = _unit(np.random.default_rng(0).standard_normal((5, 8)))
    np.testing.assert_array_equal(pool_rows(x, 1), x)
    np.testing.assert_array_equal(pool_rows(x[:1], 4), x[:1])
    assert pooled_row_count(513, 2) == 256 and pooled_row_count(513, 3) == 171 and pooled_row_count(3, 4) == 1
    for bad in (0, 5, -2, True):
        with pytest.raises(ValueError, match="--colbert-pooling must be 1 \\(off\\), 2, 3 or 4"):
            check_pool_factor(bad)


def _rows(store: BGEM3Store, name: str) -> dict[str, tuple[str, np.ndarray]]:
    return {
        p.id: (p.payload["text"], np.asarray(p.vectors["colbert"]))
        for p in store.iter_points(name, with_payload=True, with_vectors=["colbert"])
    }


def test_pooled_collection_equals_reference_pooling_of_reference_rows(
    tmp_path: Path, corpus: Path, encoder: Any, tiny_checkpoint: Path
) -> None:
    with open_store(resolve_target(path=str(tmp_path / "store"))) as store:
        plain = Ingestor(store, "plain", encoder, options=IngestOptions(**OPTS))
        pooled = Ingestor(store, "pool2", encoder, options=IngestOptions(**OPTS, colbert_pooling=2))
        s1, s2 = plain.ingest_paths([corpus]), pooled.ingest_paths([corpus])
        assert s1.chunks == s2.chunks > 5
        full, half = _rows(store, "plain"), _rows(store, "pool2")
        assert full.keys() == half.keys()
        assert stored_pooling(store, "pool2") == 2 and stored_pooling(store, "plain") == 1
    # Half the rows: each chunk's R rows become max(R // 2, 1).
    for pid, (_, rows) in full.items():
        assert len(half[pid][1]) == pooled_row_count(len(rows), 2), pid
    total_full = sum(len(r) for _, r in full.values())
    total_half = sum(len(r) for _, r in half.values())
    assert total_half <= total_full / 2

    # The stored (float16) pooled rows are the reference pooling of the reference model's rows.
    texts = [text for text, _ in half.values()]
    ref = ReferenceM3(tiny_checkpoint).encode(texts, max_length=IngestOptions(**OPTS).max_length)
    for (text, stored), ref_rows in zip(half.values(), ref["colbert_vecs"], strict=True):
        want = colbert_ai_pool(ref_rows, 2)
        assert stored.shape == want.shape, text
        # float16 storage: 2^-11 relative rounding of values below 1.
        np.testing.assert_allclose(stored, want, rtol=2**-10, atol=2e-4, err_msg=text)


def _ingest(store: BGEM3Store, name: str, encoder: Any, corpus: Path, pooling: int | None = None) -> Any:
    options = IngestOptions(**OPTS, colbert_pooling=pooling)
    return Ingestor(store, name, encoder, options=options).ingest_paths([corpus])


def test_factor_recorded_and_another_factor_refused(client: BGEM3Store, corpus: Path, encoder: Any) -> None:
    _ingest(client, "kb", encoder, corpus, 2)
    record = client.read_model_record("kb")
    assert record is not None and record["colbert_pooling"] == 2
    count = client.count("kb")
    with pytest.raises(ModelMismatchError, match="pooled with factor 2 .*asks for factor 3"):
        _ingest(client, "kb", encoder, corpus, 3)
    with pytest.raises(ModelMismatchError, match="pooled with factor 2 .*asks for factor 1"):
        _ingest(client, "kb", encoder, corpus, 1)
    assert client.count("kb") == count
    # Without the option an ingest uses the collection's factor: nothing re-encoded, nothing refused.
    again = _ingest(client, "kb", encoder, corpus)
    assert again.encoded == 0 and again.unchanged == again.chunks
    # A search reads pooled rows (queries are never pooled).
    hits = Searcher(client, "kb", encoder).search("sourdough starter", limit=3)
    assert hits and "colbert" in hits[0].scores
    # An unpooled collection written before records existed cannot take pooled rows.
    _ingest(client, "old", encoder, corpus)
    _forget_record(client, "old")
    with pytest.raises(ModelMismatchError, match="pooled with factor 1 .*asks for factor 2"):
        _ingest(client, "old", encoder, corpus, 2)


def test_records_without_the_factor_mean_unpooled() -> None:
    old = {"model": "m", "fingerprint": "abc", "precision": "float32", "vocab_size": 10}
    assert ModelIdentity.from_dict(old).colbert_pooling == 1
    assert ModelIdentity.from_dict({**old, "colbert_pooling": 3}).colbert_pooling == 3


def test_collection_add_keeps_the_collections_factor(client: BGEM3Store, encoder: Any) -> None:
    """LangChain's and LlamaIndex's add paths go through Collection.add with default options."""
    first = Document("a", "a.txt", "Feed the sourdough starter daily with flour and water, then bake it.")
    later = Document("b", "b.txt", "Separated bike lanes follow the Seine; shared bicycles stand everywhere.")
    Collection(client, "kb", encoder, options=IngestOptions(**OPTS, colbert_pooling=3)).add([first])
    kb = Collection(client, "kb", encoder)  # as the retrievers build it: no pooling option
    kb.add([later])
    full = Collection(client, "full", encoder)
    full.add([later])
    (b_pooled,) = [r for t, r in _rows(client, "kb").values() if t.startswith("Separated")]
    (b_full,) = [r for _, r in _rows(client, "full").values()]
    assert len(b_pooled) == pooled_row_count(len(b_full), 3) < len(b_full)
    assert stored_pooling(client, "kb") == 3 and stored_pooling(client, "full") == 1
    assert kb.search("bike lanes", limit=1)[0].doc_id == "b"


def test_cli_records_factor_and_refuses_another(tmp_path: Path, corpus: Path, tiny_checkpoint: Path) -> None:
    store = str(tmp_path / "store")
    common = ("-c", "kb", "--path", store, "--model", str(tiny_checkpoint), "--no-progress")
    first = run_module("bgem3_qdrant", "ingest", str(corpus), *common, "--colbert-pooling", "2")
    assert first.returncode == 0, first.stderr
    record = json.loads((Path(store) / "collections" / "kb" / "model.json").read_text())
    assert record["colbert_pooling"] == 2
    second = run_module("bgem3_qdrant", "ingest", str(corpus), *common, "--colbert-pooling", "3")
    assert_clean_failure(
        second, 1, "pooled with factor 2 (--colbert-pooling)", "asks for factor 3", "--colbert-pooling 2"
    )
    bad = run_module("bgem3_qdrant", "ingest", str(corpus), *common, "--colbert-pooling", "7")
    assert_clean_failure(bad, 1, "--colbert-pooling must be 1 (off), 2, 3 or 4")


def _forget_record(store: BGEM3Store, name: str) -> None:
    if store.kind == "edge":
        (store.path / "collections" / name / "model.json").unlink()  # type: ignore[attr-defined]
    else:
        store.write_model_record(name, None)  # type: ignore[arg-type]


def test_bench_store_compares_pooling_factors(tmp_path: Path) -> None:
    from bgem3_qdrant.tools.bench_store import BenchData, format_report, run_store_bench

    data = BenchData(chunks=24, dim=16, tokens=8, sparse=4, queries=4)
    rep = run_store_bench(data, engines=["edge"], dtypes=["float16"], workdir=str(tmp_path), poolings=(1, 2))
    runs = rep["runs"]
    assert set(runs) == {"edge/float16", "edge/float16/pool2"}
    assert runs["edge/float16"]["colbert_rows"] == 24 * 8
    assert runs["edge/float16/pool2"]["colbert_rows"] == 24 * 4
    assert runs["edge/float16/pool2"]["pool_ms_per_chunk"] > 0
    assert "ColBERT rows per chunk" in format_report(rep)


def test_bench_pooling_reports_both_times(encoder: Any) -> None:
    from bgem3_qdrant.tools.bench_pooling import format_pooling_report, run_pooling_bench

    r = run_pooling_bench(encoder, chunks=2, tokens=32, factors=(2, 3), batch_size=2, repeats=1)
    assert r["encode_ms_per_chunk"] > 0 and r["rows_per_chunk"] > 16
    assert r["factors"][2]["pooled_rows_per_chunk"] == pytest.approx(r["rows_per_chunk"] // 2, abs=1)
    assert "pool / encode" in format_pooling_report(r)
