"""One model per collection: another checkpoint is refused on ingest and search, the first model's points
untouched; the same weights at another precision or in another folder share the collection; collections
without a record are adopted from their payloads."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bgem3_qdrant import IngestOptions, Ingestor, Searcher, open_store, resolve_target
from bgem3_qdrant.identity import ModelMismatchError
from bgem3_qdrant.stores import BGEM3Store

from bgem3_embeddings.checkpoint.files import checkpoint_files_in
from bgem3_embeddings.checkpoint.fingerprint import checkpoint_fingerprint
from tests.support import assert_clean_failure, make_tiny_checkpoint, run_module

OPTS = {"chunk_size": 24, "chunk_overlap": 4, "batch_size": 8, "show_progress": False}


@pytest.fixture(scope="module")
def other_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny architecture with other weights (seed 1): same sizes, other vectors."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_seed1"), seed=1)


def _snapshot(store: BGEM3Store, name: str) -> dict[str, Any]:
    return {p.id: p for p in store.iter_points(name, with_vectors=True)}


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys() and a
    for pid, pa in a.items():
        pb = b[pid]
        assert pa.payload == pb.payload
        for key in ("dense", "colbert"):
            np.testing.assert_array_equal(pa.vectors[key], pb.vectors[key])
        np.testing.assert_array_equal(pa.vectors["sparse"][1], pb.vectors["sparse"][1])


def test_fingerprint_names_the_weights_not_the_folder(
    tmp_path: Path, tiny_checkpoint: Path, other_checkpoint: Path
) -> None:
    copy = shutil.copytree(tiny_checkpoint, tmp_path / "copy")
    a = checkpoint_fingerprint(checkpoint_files_in(tiny_checkpoint))
    assert a == checkpoint_fingerprint(checkpoint_files_in(copy))
    assert a != checkpoint_fingerprint(checkpoint_files_in(other_checkpoint))
    # Every part counts: the tokenizer alone changed gives another fingerprint.
    (copy / "tokenizer_config.json").write_text('{"model_max_length": 7}', encoding="utf-8")
    assert a != checkpoint_fingerprint(checkpoint_files_in(copy))


def test_cli_refuses_a_second_model_and_keeps_the_first(
    tmp_path: Path, corpus: Path, tiny_checkpoint: Path, other_checkpoint: Path
) -> None:
    store = str(tmp_path / "store")
    common = ("-c", "kb", "--path", store, "--no-progress")
    first = run_module("bgem3_qdrant", "ingest", str(corpus), "--model", str(tiny_checkpoint), *common)
    assert first.returncode == 0, first.stderr
    with open_store(resolve_target(path=store)) as st:
        before = _snapshot(st, "kb")
    second = run_module("bgem3_qdrant", "ingest", str(corpus), "--model", str(other_checkpoint), *common)
    assert_clean_failure(
        second, 1, "holds vectors of another model", str(tiny_checkpoint), str(other_checkpoint),
        "another --collection", "may share a collection",
    )
    search = run_module("bgem3_qdrant", "search", "bread", "--model", str(other_checkpoint), *common[:4])
    assert_clean_failure(search, 1, "holds vectors of another model")
    third = run_module("bgem3_qdrant", "ingest", str(corpus), "--model", str(tiny_checkpoint), *common)
    assert third.returncode == 0 and "0 encoded" in third.stdout, third.stderr + third.stdout
    with open_store(resolve_target(path=store)) as st:
        _same(before, _snapshot(st, "kb"))
        record = st.read_model_record("kb")
    assert record is not None and record["model"] == str(tiny_checkpoint)
    assert record["fingerprint"] == checkpoint_fingerprint(checkpoint_files_in(tiny_checkpoint))


def test_precisions_and_copies_share_a_collection(
    client: BGEM3Store, tmp_path: Path, corpus: Path, tiny_checkpoint: Path, encoder: Any
) -> None:
    from bgem3_embeddings import BGEM3Encoder

    Ingestor(client, "kb", encoder, options=IngestOptions(**OPTS)).ingest_paths([corpus])
    copy = shutil.copytree(tiny_checkpoint, tmp_path / "copy")
    bf16 = BGEM3Encoder(copy, precision="bfloat16", device="cpu")
    hits = Searcher(client, "kb", bf16).search("sourdough starter", limit=3)
    assert hits
    again = Ingestor(client, "kb", bf16, options=IngestOptions(**OPTS)).ingest_paths([corpus])
    # Same weights: nothing re-encoded; payloads now name the folder this run used.
    assert again.encoded == 0 and again.payload_updated == again.chunks


def test_collection_without_record_is_adopted_from_payloads(
    client: BGEM3Store, corpus: Path, encoder: Any, other_checkpoint: Path
) -> None:
    from bgem3_embeddings import BGEM3Encoder

    Ingestor(client, "old", encoder, options=IngestOptions(**OPTS), model_id="m").ingest_paths([corpus])
    _forget_record(client, "old")  # as written before records existed
    assert client.read_model_record("old") is None
    # A search with the same model name reads, and records nothing (a search does not write).
    Searcher(client, "old", _named(encoder, "m")).search("bread", limit=2)
    assert client.read_model_record("old") is None
    other = BGEM3Encoder(other_checkpoint, precision="float32", device="cpu")
    with pytest.raises(ModelMismatchError, match="m \\(recorded in its points\\)"):
        Ingestor(client, "old", other, options=IngestOptions(**OPTS)).ingest_paths([corpus])
    same = Ingestor(client, "old", encoder, options=IngestOptions(**OPTS), model_id="m")
    summary = same.ingest_paths([corpus])
    assert summary.encoded == 0
    record = client.read_model_record("old")
    assert record is not None and record["model"] == "m"
    with pytest.raises(ModelMismatchError):
        Searcher(client, "old", other).search("bread")


def _named(encoder: Any, name: str) -> Any:
    """The encoder as if loaded under another model id (what payloads record)."""

    class Named:
        def __getattr__(self, attr: str) -> Any:
            return name if attr == "model_id" else getattr(encoder, attr)

    return Named()


def _forget_record(store: BGEM3Store, name: str) -> None:
    if store.kind == "edge":
        (store.path / "collections" / name / "model.json").unlink()  # type: ignore[attr-defined]
    else:
        store.write_model_record(name, None)  # type: ignore[arg-type]
