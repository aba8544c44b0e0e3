"""Ingest + search on the real embedded store with the tiny checkpoint (acceptance criteria)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bgem3_qdrant import (
    CollectionNotFoundError,
    CollectionSchema,
    IngestOptions,
    Ingestor,
    SchemaMismatchError,
    Searcher,
    SourceError,
)
from bgem3_qdrant.encoder import EncodedTexts
from bgem3_qdrant.ingest.encoding import EncodedBatch
from bgem3_qdrant.ingest.writer import to_points
from bgem3_qdrant.stores import BGEM3Store, StoredPoint

from bgem3_embeddings.scoring import colbert_score, lexical_matching_score

OPTS = {"chunk_size": 24, "chunk_overlap": 4, "batch_size": 8, "show_progress": False}


# float32 ColBERT: these tests compare stored vectors and scores with the reference at 1e-5.
F32 = CollectionSchema(size=32, colbert_dtype="float32")


def _ingestor(client: BGEM3Store, encoder: Any, **kw: Any) -> Ingestor:
    return Ingestor(client, "docs", encoder, schema=F32, options=IngestOptions(**{**OPTS, **kw}))


def _all_points(client: BGEM3Store, collection: str = "docs") -> list[StoredPoint]:
    return list(client.iter_points(collection, with_vectors=True))


def test_collection_schema(client: BGEM3Store, encoder: Any, corpus: Path) -> None:
    _ingestor(client, encoder).ingest_paths([corpus])
    schema = client.stored_schema("docs")
    assert schema.size == encoder.hidden_size == 32
    assert (schema.dense_name, schema.sparse_name, schema.colbert_name) == ("dense", "sparse", "colbert")
    assert schema.sparse_modifier == "none"
    # Filters on doc_id / source and the metadata keys seen have payload indexes (where the engine has any).
    if client.kind == "edge":
        assert {"doc_id", "source", "metadata.lang", "metadata.topic"} <= client.payload_indexes("docs")
    # The default schema stores ColBERT as float16.
    Ingestor(client, "f16", encoder, options=IngestOptions(**OPTS)).ingest_paths([corpus / "bread.txt"])
    assert client.stored_schema("f16").colbert_dtype == "float16"


def test_exact_text_query_first_in_every_mode(client: BGEM3Store, encoder: Any, corpus: Path) -> None:
    """Dense and ColBERT: a chunk's own text always finds it first (self-similarity is maximal).

    Sparse scores are dot products, so self-retrieval is guaranteed only when the reference lexical
    score itself ranks the chunk first; the tiny random checkpoint's ReLU head also leaves many chunks
    with no weights at all. So for sparse and hybrid the check is: the chunk is first wherever the
    reference scores (core `lexical_matching_score`) put it first, and Qdrant's sparse order is the
    reference order.
    """
    summary = _ingestor(client, encoder).ingest_paths([corpus])
    assert summary.files == 6 and summary.documents == 9 and summary.encoded == summary.chunks > 9
    points = _all_points(client)
    assert len(points) == summary.chunks
    searcher = Searcher(client, "docs", encoder)
    sparse_checked = 0
    for p in points:
        emb = searcher.embed_query(p.payload["text"])
        for mode in ("dense", "rerank"):
            hits = searcher.search(p.payload["text"], mode=mode, limit=3, embedding=emb)
            assert hits[0].id == str(p.id), (mode, p.payload["text"])
        assert hits[0].text == p.payload["text"] and hits[0].source == p.payload["source"]
        assert hits[0].scores["colbert"] == pytest.approx(1.0, abs=1e-4)  # every query token matches itself
        assert hits[0].scores["dense"] == pytest.approx(1.0, abs=1e-4)

        q_lw = {str(i): float(v) for i, v in zip(*emb.sparse, strict=True)}
        ref = {
            str(o.id): lexical_matching_score(
                q_lw,
                {str(i): float(v) for i, v in zip(*o.vectors["sparse"], strict=True)},
            )
            for o in points
        }
        others = max(v for k, v in ref.items() if k != str(p.id))
        sparse_hits = searcher.search(p.payload["text"], mode="sparse", limit=len(points), embedding=emb)
        # Qdrant sums the products in float32, the reference in float64: compare within float32 rounding
        # (rounding both to 5 decimals failed when a score sat on a rounding boundary: 0.48175 vs 0.48174).
        assert [h.score for h in sparse_hits] == pytest.approx(
            sorted((v for v in ref.values() if v > 0), reverse=True), rel=1e-5, abs=1e-6
        )
        if ref[str(p.id)] > others + 1e-6:
            sparse_checked += 1
            assert sparse_hits[0].id == str(p.id)
            assert searcher.search(p.payload["text"], mode="hybrid", limit=3, embedding=emb)[0].id == str(
                p.id
            )
    assert sparse_checked >= 5


def test_rerank_order_equals_core_colbert_score(client: BGEM3Store, encoder: Any, corpus: Path) -> None:
    _ingestor(client, encoder).ingest_paths([corpus])
    searcher = Searcher(client, "docs", encoder)
    query = "electric bicycles and wind power in the north"
    emb = searcher.embed_query(query)
    hits = searcher.search(query, mode="rerank", limit=100, prefetch_limit=100, embedding=emb)
    assert len(hits) == client.count("docs")  # every chunk is a candidate here
    stored = {r.id: r for r in client.retrieve("docs", [h.id for h in hits], with_vectors=["colbert"])}
    ref = [colbert_score(emb.colbert, stored[h.id].vectors["colbert"]) for h in hits]
    np.testing.assert_allclose([h.scores["colbert"] for h in hits], ref, atol=1e-5)
    # Qdrant's order is the order by the core's score (ties within float noise aside).
    assert all(a >= b - 1e-6 for a, b in zip(ref, ref[1:], strict=False))
    assert [h.id for h in hits] == [hits[i].id for i in np.argsort(-np.asarray(ref), kind="stable")] or (
        np.allclose(sorted(ref, reverse=True), ref, atol=1e-6)
    )


def test_rerun_adds_nothing_and_encodes_nothing(client: BGEM3Store, encoder: Any, corpus: Path) -> None:
    first = _ingestor(client, encoder).ingest_paths([corpus])
    ids = {str(p.id) for p in _all_points(client)}
    second = _ingestor(client, encoder).ingest_paths([corpus])
    assert second.encoded == 0 and second.unchanged == first.chunks and second.pruned == 0
    assert {str(p.id) for p in _all_points(client)} == ids


def test_changed_document_updates_in_place(client: BGEM3Store, encoder: Any, corpus: Path) -> None:
    ing = _ingestor(client, encoder)
    first = ing.ingest_paths([corpus])
    first_bread = sum(p.payload["source"].endswith("bread.txt") for p in _all_points(client))
    (corpus / "bread.txt").write_text(
        "Completely different text about mountain huts and snow.", encoding="utf-8"
    )
    records = [json.loads(line) for line in (corpus / "records.jsonl").read_text().splitlines()]
    records[0]["metadata"]["topic"] = "hybrid"  # metadata only: payload update, no re-encoding
    (corpus / "records.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    second = ing.ingest_paths([corpus])
    assert second.payload_updated >= 1 and second.pruned >= 1
    points = _all_points(client)
    assert len(points) == second.chunks
    # Sorted by chunk index: scroll returns points in id order, and ids hash the (tmp) source path.
    bread = [p for p in points if p.payload["source"].endswith("bread.txt")]
    bread.sort(key=lambda p: p.payload["chunk_index"])
    assert " ".join(p.payload["text"] for p in bread).startswith("Completely different text")
    assert second.encoded == len(bread)  # only the new bread.txt chunks; metadata changes re-encode nothing
    q1 = [p for p in points if p.payload["doc_id"] == "q-1"]
    assert q1 and all(p.payload["metadata"]["topic"] == "hybrid" for p in q1)
    assert second.chunks == first.chunks - first_bread + len(bread)


def test_injected_failure_then_resume_stores_each_chunk_once(
    client: BGEM3Store, encoder: Any, corpus: Path
) -> None:
    class Failing:
        """The real encoder, failing on its third call (a crash in the middle of a run)."""

        def __init__(self) -> None:
            self.calls = 0
            self.tokenizer, self.hidden_size, self.model_id = encoder.tokenizer, encoder.hidden_size, "tiny"

        def encode_corpus(self, texts: list[str], **kw: Any) -> dict[str, Any]:
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("injected crash")
            return encoder.encode_corpus(texts, **kw)

        def encode_queries(self, texts: list[str], **kw: Any) -> dict[str, Any]:
            return encoder.encode_queries(texts, **kw)

    opts = IngestOptions(**{**OPTS, "batch_size": 4})
    with pytest.raises(RuntimeError, match="injected"):
        Ingestor(client, "docs", Failing(), options=opts).ingest_paths([corpus])
    partial = client.count("docs")
    assert partial == 8  # the two batches before the crash were written
    resumed = Ingestor(client, "docs", encoder, options=opts, model_id="tiny").ingest_paths([corpus])
    assert resumed.unchanged == partial and resumed.encoded == resumed.chunks - partial
    points = _all_points(client)
    keys = [(p.payload["doc_id"], p.payload["chunk_index"]) for p in points]
    assert len(keys) == len(set(keys)) == resumed.chunks


def test_malformed_jsonl_stops_and_keeps_what_is_stored(
    client: BGEM3Store, encoder: Any, corpus: Path
) -> None:
    bad = corpus / "records.jsonl"
    lines = bad.read_text().splitlines()
    bad.write_text("\n".join([lines[0], lines[1], '{"text": "broken', lines[2]]) + "\n")
    with pytest.raises(SourceError) as err:
        _ingestor(client, encoder).ingest_paths([corpus])
    assert f"{bad}:3" in str(err.value) and "invalid JSON" in str(err.value)
    stored = {p.payload["doc_id"] for p in _all_points(client)}
    # Everything read before the bad line is stored (the text files sort before records.jsonl).
    assert {"q-1", "q-2"} <= stored and "q-3" not in stored
    summary = _ingestor(client, encoder, skip_invalid=True).ingest_paths([corpus])
    assert len(summary.invalid) == 1 and "records.jsonl:3" in summary.invalid[0]
    assert "q-3" in {p.payload["doc_id"] for p in _all_points(client)}


def test_empty_texts_are_skipped_with_count(client: BGEM3Store, encoder: Any, tmp_path: Path) -> None:
    f = tmp_path / "e.jsonl"
    f.write_text(
        '{"id": 1, "text": ""}\n{"id": 2, "text": "   "}\n{"id": 3, "text": null}\n{"id": 4, "text": "ok"}\n'
    )
    (tmp_path / "blank.txt").write_text("\n\n")
    summary = _ingestor(client, encoder).ingest_paths([f, tmp_path / "blank.txt"])
    assert summary.empty == 4 and summary.chunks == 1 and client.count("docs") == 1
    assert "4 empty skipped" in summary.format()


def test_missing_collection_on_search(client: BGEM3Store, encoder: Any) -> None:
    with pytest.raises(CollectionNotFoundError, match="'nope' does not exist"):
        Searcher(client, "nope", encoder).search("anything")


def test_incompatible_collection_is_untouched(client: BGEM3Store, encoder: Any, corpus: Path) -> None:
    client.create_collection("docs", CollectionSchema(size=8))
    keep = StoredPoint(
        "00000000-0000-0000-0000-000000000001",
        {"keep": True},
        {
            "dense": np.full(8, 0.1, np.float32),
            "colbert": np.full((2, 8), 0.1, np.float32),
            "sparse": (np.array([1]), np.array([0.5], np.float32)),
        },
    )
    client.upsert("docs", [keep])
    with pytest.raises(SchemaMismatchError, match="Nothing was changed") as err:
        _ingestor(client, encoder).ingest_paths([corpus])
    assert "size 8" in str(err.value)
    assert client.count("docs") == 1
    assert client.stored_schema("docs").size == 8
    # A sparse-modifier mismatch is also refused.
    Ingestor(client, "other", encoder, options=IngestOptions(**OPTS)).ingest_paths([corpus / "bread.txt"])
    idf = CollectionSchema(size=32, sparse_modifier="idf")
    with pytest.raises(SchemaMismatchError, match="modifier 'none'"):
        Ingestor(client, "other", encoder, schema=idf, options=IngestOptions(**OPTS)).ingest_paths([corpus])


def test_filters_and_metadata(client: BGEM3Store, encoder: Any, corpus: Path) -> None:
    _ingestor(client, encoder).ingest_paths([corpus])
    searcher = Searcher(client, "docs", encoder)
    for mode in ("dense", "sparse", "hybrid", "rerank"):
        hits = searcher.search("ColBERT token", mode=mode, limit=10, filter={"lang": "fr"})
        # (the tiny checkpoint's sparse head may give these words no weight: no sparse hits then)
        assert {h.doc_id for h in hits} == {"q-3"} or (mode == "sparse" and not hits), mode
        assert all(h.metadata == {"lang": "fr", "topic": "rerank"} for h in hits)
    hits = searcher.search("ColBERT", limit=10, filter={"topic": ["search", "rerank"]})
    assert {h.doc_id for h in hits} == {"q-1", "q-2", "q-3"}


def test_points_round_trip_exactly(client: BGEM3Store) -> None:
    """What the writer builds from an encoded batch is what the engine gives back (float32 ColBERT)."""
    schema = CollectionSchema(size=4, colbert_dtype="float32")
    client.create_collection("rt", schema)
    rng = np.random.default_rng(0)
    batch = EncodedBatch(
        ids=["00000000-0000-0000-0000-000000000001"],
        payloads=[{"text": "t", "metadata": {"lang": "en"}}],
        vectors=EncodedTexts(
            dense=rng.random((1, 4), dtype=np.float32),
            sparse=[(np.array([3, 9]), np.array([0.5, 0.25], np.float32))],
            colbert=[rng.random((3, 4), dtype=np.float32)],
        ),
        tokens=5,
    )
    client.upsert("rt", to_points(batch, schema))
    (got,) = client.retrieve("rt", batch.ids, with_vectors=True)
    dense = batch.vectors.dense[0]
    unit = dense / np.linalg.norm(dense)  # cosine vectors are stored normalised
    np.testing.assert_allclose(got.vectors["dense"], unit, rtol=1e-6)
    rows = batch.vectors.colbert[0] / np.linalg.norm(batch.vectors.colbert[0], axis=1, keepdims=True)
    np.testing.assert_allclose(got.vectors["colbert"], rows, rtol=1e-6)
    np.testing.assert_array_equal(got.vectors["sparse"][0], [3, 9])
    np.testing.assert_array_equal(got.vectors["sparse"][1], np.array([0.5, 0.25], np.float32))
    assert got.payload == batch.payloads[0]
