"""ColBERT storage choices (issue 37): 4-bit rows (turbo4), a quantized copy in RAM (int8, binary), the
recommended storage `ingest` gives a new collection, and what a collection remembers of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bgem3_qdrant import open_store, resolve_target
from bgem3_qdrant.check import check_collection
from bgem3_qdrant.ingest import IngestOptions, Ingestor
from bgem3_qdrant.ingest.options import (
    LARGE_COLLECTION,
    LARGE_COLLECTION_STORAGE,
    SMALL_COLLECTION_STORAGE,
    estimate_chunks,
    new_collection_storage,
    storage_message,
)
from bgem3_qdrant.schema import ColbertStorage, CollectionSchema
from bgem3_qdrant.stores.base import QuerySpec
from bgem3_qdrant.tools.bench_store import BenchData

from tests.support import run_module


def test_storage_names_round_trip_and_bad_ones_are_named() -> None:
    names = ("float16", "uint8/pool2", "turbo4/pool3/binary", "float32/int8", "turbo4/pool2/binary/ondisk")
    for text in names:
        assert ColbertStorage.parse(text).name == text
    assert ColbertStorage.parse("uint8/pool3/binary") == ColbertStorage("uint8", 3, "binary")
    assert ColbertStorage.parse("turbo4/binary/ondisk") == ColbertStorage("turbo4", 1, "binary", True)
    with pytest.raises(ValueError, match="'ondisk' needs a copy .* in 'float16/ondisk'"):
        ColbertStorage.parse("float16/ondisk")
    with pytest.raises(ValueError, match="dtype must be one of .* not 'int4'"):
        ColbertStorage.parse("int4/pool2")
    with pytest.raises(ValueError, match="quantization .* not 'pq'"):
        ColbertStorage.parse("float16/pq")
    with pytest.raises(ValueError, match="--colbert-pooling must be 1"):
        ColbertStorage.parse("float16/pool7")


def test_schema_keeps_the_quantization_and_refuses_an_unknown_one() -> None:
    s = CollectionSchema(size=8, colbert_dtype="turbo4", colbert_quantization="binary")
    assert CollectionSchema.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    # A schema.json written before the field existed reads as no copy.
    old = {k: v for k, v in s.to_dict().items() if k not in ("colbert_quantization", "colbert_copy_on_disk")}
    assert CollectionSchema.from_dict(old).colbert_quantization == "none"
    # The copy's place: in RAM unless said (schema.json files written before the field hold it in RAM).
    on_disk = CollectionSchema(size=8, colbert_quantization="binary", colbert_copy_on_disk=True)
    assert CollectionSchema.from_dict(json.loads(json.dumps(on_disk.to_dict()))) == on_disk
    assert "colbert_copy_on_disk" not in old and not CollectionSchema.from_dict(old).colbert_copy_on_disk
    with pytest.raises(ValueError, match="colbert_quantization must be one of none, int8, binary"):
        CollectionSchema(colbert_quantization="pq")  # type: ignore[arg-type]


def test_new_collections_take_the_recommended_storage_for_what_is_left_out(tmp_path: Path) -> None:
    storage, defaulted = new_collection_storage()
    assert storage == SMALL_COLLECTION_STORAGE and len(defaulted) == 3
    assert "the recommended storage" in storage_message("kb", storage, defaulted)
    big, big_defaulted = new_collection_storage(expected_chunks=LARGE_COLLECTION)
    assert big == LARGE_COLLECTION_STORAGE != SMALL_COLLECTION_STORAGE
    # a large collection's binary copy stays on disk (it opens at once), and the line says so
    assert big.copy_on_disk and big_defaulted[-1] == "--colbert-copy-on-disk"
    assert "binary copy on disk (read as reranks need it)" in storage_message("kb", big, big_defaulted)
    in_ram, in_ram_defaulted = new_collection_storage(copy_on_disk=False, expected_chunks=LARGE_COLLECTION)
    assert in_ram == ColbertStorage("turbo4", 2, "binary", False) and len(in_ram_defaulted) == 3
    # a small collection has no copy, so where a copy lives is not asked: a copy asked for gets it in RAM
    assert new_collection_storage(quantization="binary")[0].copy_on_disk is False
    with pytest.raises(ValueError, match="--colbert-copy-on-disk needs a copy"):
        new_collection_storage(copy_on_disk=True)
    assert new_collection_storage(expected_chunks=LARGE_COLLECTION - 1)[0] == SMALL_COLLECTION_STORAGE
    line = storage_message("kb", big, ["--colbert-dtype"], 12_345)
    assert line.endswith(
        "(--colbert-dtype: the recommended storage for 10,000 chunks or more: the input's size suggests "
        "about 12,345; see docs/qdrant.md)"
    )
    # A small input is said as such, never as "about 0 chunks" (an estimate from file sizes is rough there)
    small = storage_message("kb", storage, ["--colbert-dtype"], 0)
    assert small.endswith("the recommended storage for under 10,000 chunks, as the input's size suggests; "
                          "see docs/qdrant.md)") and "about" not in small
    # The estimate: file sizes under the paths (hidden ones skipped), ~4 bytes per token.
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_bytes(b"x" * 4000)
    (tmp_path / "docs" / ".git").mkdir()
    (tmp_path / "docs" / ".git" / "pack").write_bytes(b"x" * 10**6)
    (tmp_path / "b.md").write_bytes(b"x" * 2000)
    assert estimate_chunks([tmp_path / "docs", tmp_path / "b.md"], chunk_size=100) == 15
    storage, defaulted = new_collection_storage("float32", 1, "none")
    assert storage == ColbertStorage("float32", 1, "none") and defaulted == []
    assert "recommended" not in storage_message("kb", storage, defaulted)
    storage, defaulted = new_collection_storage(quantization="int8")
    assert storage.quantization == "int8" and storage.dtype == SMALL_COLLECTION_STORAGE.dtype
    assert defaulted == ["--colbert-dtype", "--colbert-pooling", "--colbert-copy-on-disk"]
    with pytest.raises(ValueError, match="--colbert-quantization must be one of"):
        new_collection_storage(quantization="pq")


@pytest.mark.parametrize(
    ("dtype", "quantization", "chunks", "dim", "copy_on_disk"),
    [("turbo4", "binary", 1600, 256, False), ("float16", "int8", 1100, 128, False),
     ("turbo4", "binary", 1600, 256, True)],
)  # fmt: skip
def test_a_quantized_collection_is_remembered_reranks_and_checks(
    tmp_path: Path, dtype: str, quantization: str, chunks: int, dim: int, copy_on_disk: bool
) -> None:
    """Big enough (about 13 MB of stored ColBERT rows) for Edge's optimizer to index the segment and build
    the copy; the copy is on disk after optimize, survives reopening, and a rerank on it finds the planted
    chunks exact float32 MaxSim finds."""
    data = BenchData(chunks=chunks, dim=dim, tokens=64 if dtype == "turbo4" else 48, sparse=4, queries=6)
    schema = CollectionSchema(
        size=dim,
        colbert_dtype=dtype,  # type: ignore[arg-type]
        colbert_quantization=quantization,  # type: ignore[arg-type]
        colbert_copy_on_disk=copy_on_disk,
    )
    path = tmp_path / "s"
    with open_store(resolve_target(path=str(path))) as st:
        st.create_collection("c", schema)
        for batch in data.batches():
            st.upsert("c", batch)
        assert st.optimize("c")
    config = json.loads((path / "collections" / "c" / "shard" / "edge_config.json").read_text())
    assert quantization in json.dumps(config["vectors"]["colbert"]).lower()
    # Edge's own record of where the copy lives: pinned in RAM, or cold (read on demand)
    memory = next(iter(config["vectors"]["colbert"]["quantization_config"].values()))["memory"]
    assert memory == ("cold" if copy_on_disk else "pinned")
    files = [f.name for f in (path / "collections" / "c" / "shard").rglob("*") if f.is_file()]
    assert any("quantiz" in f for f in files), files
    with open_store(resolve_target(path=str(path))) as st:
        assert st.stored_schema("c") == schema
        relevant = data.relevant_ids()
        recall = []
        for spec, rel in zip(data.query_specs("rerank", False), relevant, strict=True):
            hits = st.query("c", spec)
            assert len(hits) == 10 and all(np.isfinite(h.score) for h in hits)
            recall.append(len({h.id for h in hits} & rel) / len(rel))
        # The planted chunks hold the query's rows: a rerank on the copy ranks them first, as exact
        # float32 MaxSim does (noise levels 0.6..1.4 apart; 4-bit rows and the copy blur them a little).
        assert np.mean(recall) >= data.reference_recall() - 0.1
        report = check_collection(st, "c")
        # Bench payloads are not ingest's: only the vectors are judged here.
        assert not [d for d in report.damaged if set(d.problems) - {"payload"}]
        where = "on disk (read as reranks need it)" if copy_on_disk else "in RAM"
        assert f"ColBERT storage: {dtype}, unpooled, {quantization} copy {where}" in report.format()
        assert report.to_dict()["colbert_copy_on_disk"] is copy_on_disk


def test_check_and_search_understand_an_ingested_turbo4_pooled_collection(
    tmp_path: Path, corpus: Path, encoder: Any
) -> None:
    schema = CollectionSchema(size=encoder.hidden_size, colbert_dtype="turbo4", colbert_quantization="binary")
    with open_store(resolve_target(path=str(tmp_path / "s"))) as st:
        opts = IngestOptions(chunk_size=24, chunk_overlap=4, show_progress=False, colbert_pooling=2)
        Ingestor(st, "kb", encoder, schema=schema, options=opts).ingest_paths([corpus])
        report = check_collection(st, "kb")
        assert report.ok, report.format()
        assert "ColBERT storage: turbo4, pooled by 2, binary copy in RAM" in report.format()
        assert report.to_dict()["colbert_quantization"] == "binary"
        q = encoder.encode(["sourdough starter flour"], return_dense=True, return_sparse=True,
                           return_colbert_vecs=True)  # fmt: skip
        spec = QuerySpec(
            mode="rerank",
            limit=3,
            prefetch_limit=20,
            dense=np.asarray(q["dense_vecs"][0]),
            sparse=(
                np.asarray(list(map(int, q["lexical_weights"][0])), np.int64),
                np.asarray(list(q["lexical_weights"][0].values()), np.float32),
            ),  # fmt: skip
            colbert=np.asarray(q["colbert_vecs"][0]),
        )
        assert st.query("kb", spec)


def test_ingest_says_which_storage_a_new_collection_gets(
    tmp_path: Path, corpus: Path, tiny_checkpoint: Path
) -> None:
    store = str(tmp_path / "store")
    common = ("-c", "kb", "--path", store, "--model", str(tiny_checkpoint), "--no-progress")
    first = run_module("bgem3_qdrant", "ingest", str(corpus), *common)
    assert first.returncode == 0, first.stderr
    rec = SMALL_COLLECTION_STORAGE  # a corpus of a few KiB
    assert f"new collection 'kb': ColBERT rows stored {rec.dtype}" in first.stdout
    assert (
        "--colbert-dtype, --colbert-pooling, --colbert-quantization: the recommended storage" in first.stdout
    )
    with open_store(resolve_target(path=store)) as st:
        have = st.stored_schema("kb")
        assert (have.colbert_dtype, have.colbert_quantization) == (rec.dtype, rec.quantization)
        assert (
            json.loads((Path(store) / "collections/kb/model.json").read_text())["colbert_pooling"]
            == rec.pooling
        )
    again = run_module("bgem3_qdrant", "ingest", str(corpus), *common, "--json")
    assert again.returncode == 0, again.stderr
    assert "colbert_storage" not in json.loads(again.stdout.strip().splitlines()[-1])  # not a new one

    explicit = ("--colbert-dtype", "float32", "--colbert-pooling", "1", "--colbert-quantization", "none")
    chosen = run_module("bgem3_qdrant", "ingest", str(corpus), *common[2:], "-c", "exact", *explicit)
    assert chosen.returncode == 0, chosen.stderr
    assert "new collection 'exact': ColBERT rows stored float32, unpooled, no copy in RAM\n" in chosen.stdout
    bad = run_module("bgem3_qdrant", "ingest", str(corpus), *common, "--colbert-quantization", "pq")
    assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [
        "error: --colbert-quantization must be one of none, int8, binary, not 'pq'"
    ], bad.stderr
    contradiction = ("--colbert-quantization", "none", "--colbert-copy-on-disk")
    no_copy = run_module("bgem3_qdrant", "ingest", str(corpus), *common, *contradiction)
    assert no_copy.returncode == 1 and no_copy.stderr.strip().splitlines() == [
        "error: --colbert-copy-on-disk needs a copy: --colbert-quantization int8 or binary"
    ], no_copy.stderr
    lazy = ("--colbert-quantization", "binary", "--colbert-copy-on-disk")
    on_disk = run_module("bgem3_qdrant", "ingest", str(corpus), *common[2:], "-c", "lazy", *lazy)
    assert on_disk.returncode == 0, on_disk.stderr
    assert "binary copy on disk (read as reranks need it)" in on_disk.stdout
    with open_store(resolve_target(path=store)) as st:
        assert st.stored_schema("lazy").colbert_copy_on_disk
    checked = run_module("bgem3_qdrant", "check", "-c", "lazy", "--path", store, "--no-progress")
    assert "binary copy on disk (read as reranks need it)" in checked.stdout, checked.stdout + checked.stderr


@pytest.mark.parametrize(
    ("dtype", "quantization", "copy_on_disk"),
    [("turbo4", "binary", False), ("uint8", "int8", False), ("float16", "none", False),
     ("turbo4", "binary", True), ("float16", "int8", True)],
)  # fmt: skip
def test_qdrant_client_collections_remember_the_storage(
    tmp_path: Path, dtype: str, quantization: str, copy_on_disk: bool
) -> None:
    """What a server (and qdrant-client's local mode) is given and gives back: the dtype and the copy,
    in RAM (always_ram) or not."""
    data = BenchData(chunks=40, dim=16, tokens=6, sparse=4, queries=4)
    schema = CollectionSchema(
        size=16,
        colbert_dtype=dtype,  # type: ignore[arg-type]
        colbert_quantization=quantization,  # type: ignore[arg-type]
        colbert_copy_on_disk=copy_on_disk,
    )
    with open_store(resolve_target(path=str(tmp_path / "local"), engine="local")) as st:
        st.create_collection("c", schema)
        assert st.stored_schema("c") == schema
        for batch in data.batches():
            st.upsert("c", batch)
        assert len(st.query("c", data.query_specs("rerank", False)[0])) == 10
