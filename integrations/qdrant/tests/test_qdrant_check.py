"""`bgem3-qdrant check [--repair]`: damage in a store's files is found, repaired to what a clean store of
the same documents answers, and every search on a damaged store says so in one line instead of ranking
by garbage. Each CLI case runs in a fresh process, as a user runs it."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bgem3_qdrant import Searcher, open_store, resolve_target
from bgem3_qdrant.check import (
    check_collection,
    colbert_problem,
    dense_problem,
    payload_problem,
    sparse_problem,
)
from bgem3_qdrant.ids import content_hash, point_id
from bgem3_qdrant.ingest import IngestOptions, Ingestor
from bgem3_qdrant.payload import chunk_payload
from bgem3_qdrant.repair import repair_collection
from bgem3_qdrant.schema import CollectionSchema
from bgem3_qdrant.stores.base import MODES

from tests.support import assert_clean_failure, run_module

CHUNKS = ("--chunk-size", "48", "--chunk-overlap", "8")
# Latin script: the tiny test tokenizer reads some Cyrillic letters as <unk>, so Russian chunks can tie.
QUERIES = ["sourdough flour water", "bike lanes Paris", "Windkraft Photovoltaik", "espresso pressione crema"]
EXIT_DAMAGED = 3


@pytest.fixture(scope="module")
def clean(
    tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path, long_corpus: Path
) -> tuple[Path, Path]:
    """(corpus folder, a store with collection 'kb' of it), ingested by the CLI as a user does."""
    corpus = long_corpus
    store = tmp_path_factory.mktemp("check") / "store"
    done = run_module(
        "bgem3_qdrant", "ingest", str(corpus), "-c", "kb", "--path", str(store),
        "--model", str(tiny_checkpoint), *CHUNKS,
    )
    assert done.returncode == 0, done.stderr
    return corpus, store


@pytest.fixture
def store_copy(clean: tuple[Path, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(clean[1], tmp_path / "store"))


def _segment_file(store: Path, *candidates: str) -> Path:
    """A vector file of the collection's segment: appendable (chunk files) or optimized (matrix.dat)."""
    for name in candidates:
        found = sorted((store / "collections" / "kb" / "shard").rglob(name))
        if found:
            return found[0]
    raise AssertionError(f"none of {candidates} in {store}")


def _damage(store: Path, how: str) -> None:
    if how == "truncated dense file":
        dense = ("vector_storage-dense/matrix.dat", "vector_storage-dense/vectors/chunk_0.mmap")
        f = _segment_file(store, *dense)
        os.truncate(f, 3000)  # 32-d float32 vectors: the first 23 survive
    elif how == "random bytes in ColBERT vectors":
        f = _segment_file(store, "vector_storage-colbert/vectors/chunk_0.mmap")
        with open(f, "r+b") as fh:
            fh.seek(2048)
            fh.write(np.random.default_rng(0).bytes(4096))
    elif how == "deleted vector file":
        _segment_file(store, "vector_storage-colbert/vectors/chunk_0.mmap").unlink()
    else:
        raise AssertionError(how)


def _check(store: Path, *extra: str, model: Path | None = None) -> Any:
    args = ["check", "-c", "kb", "--path", str(store), *extra]
    if model is not None:
        args += ["--model", str(model)]
    return run_module("bgem3_qdrant", *args)


def _answers(store: Path, encoder: Any) -> dict[tuple[str, str], list[tuple[str, float]]]:
    """Every mode's hits (id, score) for every query."""
    with open_store(resolve_target(path=str(store))) as s:
        searcher = Searcher(s, "kb", encoder)
        return {
            (q, mode): [(h.id, h.score) for h in searcher.search(q, mode=mode, limit=8, prefetch_limit=100)]
            for q in QUERIES
            for mode in MODES
        }


# Scores this close are a tie: a re-encoded point's scores differ from the original's by float32 rounding
# (~1e-8), so comparing scores rounded to 5 decimals failed when one fell on a rounding boundary (-0.092235).
TIE = 1e-5


def _assert_same_ranking(got: list[tuple[str, float]], want: list[tuple[str, float]], key: Any) -> None:
    """The hits above the last score (a tie group the limit may cut) are all in `got`, and every pair that
    `want` orders by more than TIE is in the same order: engines order equal scores by storage position,
    which a rebuild changes."""
    if not want:
        assert not got, key
        return
    last = want[-1][1]
    keep = [pid for pid, score in want if score - last > TIE]
    got_score, want_score = dict(got), dict(want)
    assert set(keep) <= got_score.keys(), key
    for a in keep:
        for b in keep:
            if want_score[a] - want_score[b] > TIE:
                assert got_score[a] > got_score[b], (key, a, b)


def _unique(hits: list[tuple[str, float]]) -> list[str]:
    """Ids, in hit order, of the hits whose score no other hit shares (within TIE)."""
    return [pid for pid, score in hits if sum(abs(score - other) <= TIE for _, other in hits) == 1]


def _assert_same_answers(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, hits in want.items():
        assert len(got[key]) == len(hits), key
        np.testing.assert_allclose(
            sorted(s for _, s in got[key]), sorted(s for _, s in hits), rtol=1e-5, atol=1e-5, err_msg=str(key)
        )
        if key[1] == "hybrid":
            # RRF scores are ranks: equal dense or sparse scores (ranked by storage position) swap which
            # document gets which rank, so only documents of a score no other hit has must be the same.
            assert _unique(got[key]) == _unique(hits), key
        else:
            _assert_same_ranking(got[key], hits, key)


def test_clean_store_passes(clean: tuple[Path, Path]) -> None:
    done = _check(clean[1])
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 damaged" in done.stdout
    points = int(done.stdout.split(" points checked")[0].rsplit(" ", 1)[1])
    assert points > 11  # 10 documents, the long one of several chunks


@pytest.mark.parametrize(
    "how", ["truncated dense file", "random bytes in ColBERT vectors", "deleted vector file"]
)
def test_damage_is_found_and_repaired(
    how: str, store_copy: Path, clean: tuple[Path, Path], tiny_checkpoint: Path, encoder: Any
) -> None:
    want = _answers(clean[1], encoder)
    _damage(store_copy, how)

    found = _check(store_copy, "--json")
    assert found.returncode == EXIT_DAMAGED, found.stderr
    report = __import__("json").loads(found.stdout)
    assert report["damaged"] > 0 and not report["ok"]
    kind = {"truncated dense file": "unreadable", "random bytes in ColBERT vectors": "colbert"}.get(how)
    assert kind is None or kind in report["by_kind"], report["by_kind"]

    repaired = _check(store_copy, "--repair", model=tiny_checkpoint)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert f"{report['damaged']} re-encoded" in repaired.stdout
    assert (store_copy / "damaged").is_dir()  # the damaged files are set aside, not deleted

    again = _check(store_copy)
    assert again.returncode == 0 and " 0 damaged" in again.stdout
    _assert_same_answers(_answers(store_copy, encoder), want)


def test_search_on_a_damaged_store_says_run_check(store_copy: Path, tiny_checkpoint: Path) -> None:
    _damage(store_copy, "truncated dense file")
    done = run_module(
        "bgem3_qdrant", "search", "sourdough", "-c", "kb", "--path", str(store_copy),
        "--model", str(tiny_checkpoint), "--mode", "dense", "-k", "100",
    )
    assert_clean_failure(done, 1, "damaged", f"bgem3-qdrant check -c kb --path {store_copy}")


def test_absurd_scores_are_refused(store_copy: Path, tiny_checkpoint: Path) -> None:
    """Random bytes in ColBERT rows read as huge or NaN scores: the search refuses to rank by them."""
    _damage(store_copy, "random bytes in ColBERT vectors")
    done = run_module(
        "bgem3_qdrant", "search", "sourdough flour", "-c", "kb", "--path", str(store_copy),
        "--model", str(tiny_checkpoint), "-k", "100", "--prefetch-limit", "200",
    )
    assert_clean_failure(done, 1, "impossible for unit vectors", "bgem3-qdrant check -c kb")


def test_engine_abort_on_open_is_one_line(store_copy: Path, tiny_checkpoint: Path) -> None:
    """8 bytes overwritten in the id tracker: the engine panics or aborts (exit 134) opening the segment.
    `check` opens it in a child process first; a search after an abort says what happened."""
    mappings = _segment_file(store_copy, "mutable_id_tracker.mappings", "id_tracker.mappings")
    with open(mappings, "r+b") as fh:
        fh.seek(100)
        fh.write(b"\xff" * 8)
    done = _check(store_copy)
    assert_clean_failure(done, 1, "cannot be read at all", "kb", str(store_copy))
    search = ("search", "q", "-c", "kb", "--path", str(store_copy), "--model", str(tiny_checkpoint))
    first = run_module("bgem3_qdrant", *search)
    assert first.returncode in (1, -6, 134), first.stderr  # SIGABRT (shell: 134): the engine aborted
    assert_clean_failure(run_module("bgem3_qdrant", *search), 1, "damaged", "bgem3-qdrant check -c kb")


def test_damaged_payload_reingests_the_source(
    store_copy: Path, clean: tuple[Path, Path], encoder: Any
) -> None:
    """A point whose text no longer matches its hash is replaced by re-reading its source file (same
    chunk options); a document whose source is gone is named."""
    want = _answers(clean[1], encoder)
    with open_store(resolve_target(path=str(store_copy))) as s:
        points = list(s.iter_points("kb"))
        from_file = next(p for p in points if p.payload["source"].endswith("bread.txt"))
        s.overwrite_payload("kb", [from_file.id], {**from_file.payload, "text": "changed on disk"})
        report = check_collection(s, "kb")
        assert [d.id for d in report.damaged] == [from_file.id]
        assert "content_hash" in report.damaged[0].problems["payload"]
        result = repair_collection(
            s, "kb", report, encoder, options=IngestOptions(chunk_size=48, chunk_overlap=8)
        )
        assert result.reingested == [from_file.payload["source"]] and result.complete
        assert check_collection(s, "kb").ok
    _assert_same_answers(_answers(store_copy, encoder), want)

    with open_store(resolve_target(path=str(store_copy))) as s:
        gone = next(p for p in s.iter_points("kb") if p.payload["source"].endswith("bikes.md"))
        s.overwrite_payload("kb", [gone.id], {**gone.payload, "source": "/nowhere/bikes.md", "text": "x"})
        result = repair_collection(s, "kb", check_collection(s, "kb"), encoder)
        assert not result.complete and result.lost == [gone.payload["doc_id"]]
        assert s.retrieve("kb", [gone.id]) == []  # the damaged point is gone, the rest stays
        assert check_collection(s, "kb").ok


def test_local_mode_store_is_repaired_in_place(
    tmp_path: Path, clean: tuple[Path, Path], encoder: Any
) -> None:
    """Stores that cannot be rebuilt (a server, local mode) get the damaged points replaced in place."""
    target = resolve_target(path=str(tmp_path / "local"), engine="local")
    with open_store(target) as s:
        Ingestor(s, "kb", encoder, options=IngestOptions(chunk_size=48, chunk_overlap=8)).ingest_paths(
            [clean[0]]
        )
        want = {q: [(h.id, h.score) for h in Searcher(s, "kb", encoder).search(q, limit=8)] for q in QUERIES}
        victim = next(iter(s.iter_points("kb", with_vectors=True)))
        rows = victim.vectors["colbert"]
        victim.vectors["colbert"] = rows[: max(1, len(rows) // 2)]  # rows lost
        s.upsert("kb", [victim])
        report = check_collection(s, "kb")
        assert [d.id for d in report.damaged] == [victim.id]
        assert "rows for a chunk of" in report.damaged[0].problems["colbert"]
        assert not s.can_rebuild
        result = repair_collection(s, "kb", report, encoder)
        assert result.reencoded == 1 and result.set_aside is None
        assert check_collection(s, "kb").ok
        got = {q: [(h.id, h.score) for h in Searcher(s, "kb", encoder).search(q, limit=8)] for q in QUERIES}
    _assert_same_answers(got, want)


# -- the per-point checks, on vectors made to be wrong in one way each
SCHEMA = CollectionSchema(size=4)


def _unit(n: int) -> np.ndarray:
    m = np.random.default_rng(1).normal(size=(n, 4)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def test_vector_checks() -> None:
    assert dense_problem(_unit(1)[0], SCHEMA) is None
    assert "missing" in dense_problem(None, SCHEMA)
    assert "norm" in dense_problem(_unit(1)[0] * 0, SCHEMA)
    assert "shape" in dense_problem(np.ones(3), SCHEMA)
    assert "finite" in dense_problem(np.array([np.nan, 0, 0, 1]), SCHEMA)
    assert colbert_problem(_unit(6), SCHEMA, n_tokens=5) is None
    assert "expected 6" in colbert_problem(_unit(5), SCHEMA, n_tokens=5)
    assert colbert_problem(_unit(3), SCHEMA, n_tokens=5, pooling=2) is None  # max(6 // 2, 1) rows
    assert "pooled by 2" in colbert_problem(_unit(4), SCHEMA, n_tokens=5, pooling=2)
    assert "norm" in colbert_problem(_unit(6) * 1.1, SCHEMA, n_tokens=5)
    ok = (np.array([3, 7]), np.array([0.2, 0.1], np.float32))
    assert sparse_problem(ok, vocab_size=8) is None
    assert "vocabulary" in sparse_problem((np.array([3, 8]), ok[1]), vocab_size=8)
    assert "<= 0" in sparse_problem((ok[0], np.array([0.2, 0.0], np.float32)), vocab_size=8)
    assert "repeated" in sparse_problem((np.array([3, 3]), ok[1]), vocab_size=8)


def test_payload_checks() -> None:
    text = "some chunk"
    payload = chunk_payload(
        text=text, source="a.txt", doc_id="a.txt", chunk_index=0, chunk_count=1, char_start=0,
        char_end=len(text), n_tokens=3, content_hash=content_hash(text), model="m", metadata={},
    )
    pid = point_id("a.txt", 0, content_hash(text))
    assert payload_problem(pid, payload) is None
    assert "missing" in payload_problem(pid, {})
    assert "n_tokens" in payload_problem(pid, {k: v for k, v in payload.items() if k != "n_tokens"})
    assert "wrong type of chunk_index" in payload_problem(pid, {**payload, "chunk_index": "0"})
    assert "content_hash" in payload_problem(pid, {**payload, "text": "other"})
    assert "point id" in payload_problem(point_id("b.txt", 0, content_hash(text)), payload)


# -- the rest of issue 21's newcomer path: warnings, progress, help
def test_filter_key_no_point_has_warns(clean: tuple[Path, Path], tiny_checkpoint: Path) -> None:
    args = ("search", "sourdough", "-c", "kb", "--path", str(clean[1]), "--model", str(tiny_checkpoint))
    done = run_module("bgem3_qdrant", *args, "-f", "lnag=en")
    assert done.returncode == 0 and "no hits" in done.stdout
    assert done.stderr.strip().startswith("warning: no point of 'kb' has the filter key 'lnag' (--filter)")
    known = run_module("bgem3_qdrant", *args, "-f", "source=" + str(clean[0] / "bread.txt"))
    assert known.returncode == 0 and "warning" not in known.stderr and "bread.txt" in known.stdout


def test_ingest_progress_has_total_and_eta(
    tmp_path: Path, clean: tuple[Path, Path], tiny_checkpoint: Path
) -> None:
    done = run_module(
        "bgem3_qdrant", "ingest", str(clean[0]), "-c", "kb", "--path", str(tmp_path / "s"),
        "--model", str(tiny_checkpoint), *CHUNKS, "--progress",
    )
    assert done.returncode == 0, done.stderr
    # The summary line's "N chunks, N encoded" (the storage line before it may name "10,000 chunks").
    chunks = int(re.search(r"([\d,]+) chunks, [\d,]+ encoded", done.stdout)[1].replace(",", ""))
    final = [part for part in done.stderr.split("\r") if f"{chunks}/{chunks} [" in part]
    assert final, done.stderr  # "N/N [elapsed<remaining" : a total and an ETA


@pytest.mark.parametrize("command", ["", "ingest", "search", "check"])
def test_help_fits_80_columns(command: str) -> None:
    done = run_module("bgem3_qdrant", *([command] if command else []), "--help", env={"COLUMNS": "80"})
    assert done.returncode == 0
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
    if command == "":
        assert "--debug" in done.stdout and "One process at a time" in done.stdout
    if command in ("ingest", "check"):
        assert "--progress" in done.stdout and "ETA" in done.stdout


def test_pooled_collection_is_repaired_pooled(tmp_path: Path, clean: tuple[Path, Path], encoder: Any) -> None:
    """A collection storing ColBERT rows pooled by 2: check knows the row bound, repair pools the rows it
    re-encodes by the recorded factor, and the repaired collection answers as the clean one."""
    store = tmp_path / "pooled"
    opts = IngestOptions(chunk_size=48, chunk_overlap=8, colbert_pooling=2)
    with open_store(resolve_target(path=str(store))) as s:
        Ingestor(s, "kb", encoder, options=opts).ingest_paths([clean[0]])
        assert check_collection(s, "kb").ok
    want = _answers(store, encoder)
    _damage(store, "random bytes in ColBERT vectors")
    with open_store(resolve_target(path=str(store))) as s:
        report = check_collection(s, "kb")
        assert report.damaged and report.identity is not None and report.identity.colbert_pooling == 2
        result = repair_collection(s, "kb", report, encoder)
        assert result.reencoded == len(report.damaged)
        assert check_collection(s, "kb").ok
    _assert_same_answers(_answers(store, encoder), want)


def test_rebuilds_within_one_second_keep_both_backups(
    store_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bgem3_qdrant.stores import edge

    monkeypatch.setattr(edge.time, "strftime", lambda fmt: "20261124-000000")  # the same second twice
    with open_store(resolve_target(path=str(store_copy))) as s:
        count = s.count("kb")
        first = s.rebuild("kb", list(s.iter_points("kb", with_vectors=True)))
        second = s.rebuild("kb", list(s.iter_points("kb", with_vectors=True)))
        assert first != second and Path(first).is_dir() and Path(second).is_dir()
        assert s.count("kb") == count and check_collection(s, "kb").ok
