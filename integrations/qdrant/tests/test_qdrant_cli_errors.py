"""What a person sees when `bgem3-qdrant` fails as expected: one or two lines naming cause and fix, exit
non-zero, no traceback (only with --debug), no TensorFlow start-up lines. Each case runs the command in a
fresh process, as a user does; migrating an old local-mode store is tested here too."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from bgem3_qdrant import open_store, resolve_target
from bgem3_qdrant.schema import CollectionSchema
from bgem3_qdrant.stores import StoredPoint

from tests.support import assert_clean_failure, run_module


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_module("bgem3_qdrant", *args, env=env)


def test_checkpoint_not_found(tmp_path: Path, corpus: Path) -> None:
    done = run("ingest", str(corpus), "--model", str(tmp_path / "nope"), "--path", str(tmp_path / "s"))
    assert_clean_failure(done, 1, "does not exist")


def test_hub_unreachable_vs_offline(tmp_path: Path, corpus: Path) -> None:
    common = ("ingest", str(corpus), "--model", "BAAI/bge-m3", "--path", str(tmp_path / "s"))
    off = run(*common, env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})
    assert_clean_failure(off, 1, "HF_HUB_OFFLINE=1")
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}
    unreachable = run(*common, env=env)
    assert_clean_failure(unreachable, 1, "cannot reach the Hugging Face hub")


def test_bad_arguments(tmp_path: Path, corpus: Path, tiny_checkpoint: Path) -> None:
    common = ("--model", str(tiny_checkpoint), "--path", str(tmp_path / "s"))
    assert_clean_failure(run("ingest", str(corpus), "--chunk-size", "many", *common), 2, "--chunk-size")
    assert_clean_failure(
        run("ingest", str(corpus), "--chunk-size", "8", "--chunk-overlap", "8", *common), 1, "overlap"
    )
    assert_clean_failure(run("ingest", str(corpus), "--colbert-dtype", "int4", *common), 1, "--colbert-dtype")
    assert_clean_failure(run("search", "q", "--store-engine", "ram", *common), 1, "--store-engine")


def test_missing_store_and_collection(tmp_path: Path, tiny_checkpoint: Path) -> None:
    store = tmp_path / "s"
    assert_clean_failure(
        run("search", "q", "--path", str(store), "--model", str(tiny_checkpoint)), 1, "no store at"
    )
    with open_store(resolve_target(path=str(store))) as st:
        st.create_collection("other", CollectionSchema(size=32))
    done = run("search", "q", "-c", "kb", "--path", str(store), "--model", str(tiny_checkpoint))
    assert_clean_failure(done, 1, "collection 'kb' does not exist", "bgem3-qdrant ingest")


def test_unreadable_and_malformed_files(tmp_path: Path, tiny_checkpoint: Path) -> None:
    common = ("--model", str(tiny_checkpoint), "--path", str(tmp_path / "s"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": \n')
    # Each names the way past it: --skip-invalid (and, for text in another encoding, --encoding).
    assert_clean_failure(run("ingest", str(bad), *common), 1, f"{bad}:2: invalid JSON", "--skip-invalid")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    done = run("ingest", str(latin), *common)
    assert_clean_failure(done, 1, "not valid utf-8", "--encoding", "--skip-invalid")
    assert_clean_failure(run("ingest", str(tmp_path / "nowhere.txt"), *common), 1, "no such file")


def test_store_in_use_by_another_process(tmp_path: Path, corpus: Path, tiny_checkpoint: Path) -> None:
    store = str(tmp_path / "s")
    with open_store(resolve_target(path=store)):  # this test process holds the store
        done = run("ingest", str(corpus), "--path", store, "--model", str(tiny_checkpoint))
    assert_clean_failure(done, 1, "open in another process", "--url")


def test_debug_shows_the_traceback(tmp_path: Path, corpus: Path) -> None:
    done = run(
        "ingest", str(corpus), "--model", str(tmp_path / "nope"), "--path", str(tmp_path / "s"), "--debug"
    )
    assert done.returncode == 1 and "Traceback" in done.stderr and "does not exist" in done.stderr


def _local_store(path: Path, n: int = 5) -> list[StoredPoint]:
    """A store as earlier releases wrote it (qdrant-client local mode), with a few points."""
    rng = np.random.default_rng(1)
    pts = [
        StoredPoint(
            f"00000000-0000-0000-0000-00000000000{i}",
            {"text": f"t{i}", "doc_id": f"d{i}", "metadata": {"lang": "en"}},
            {
                "dense": rng.standard_normal(8).astype(np.float32),
                "colbert": rng.standard_normal((3, 8)).astype(np.float32),
                # each point's own weights (not one pair for all), so a migration that lost them shows
                "sparse": (np.array([1, 4 + i]), rng.uniform(0.01, 3.0, 2).astype(np.float32)),
            },
        )
        for i in range(1, n + 1)
    ]
    with open_store(resolve_target(path=str(path), engine="local")) as st:
        st.create_collection("kb", CollectionSchema(size=8, colbert_dtype="float32"))
        st.upsert("kb", pts)
    return pts


def test_old_local_mode_store_is_refused_then_migrated_without_loss(tmp_path: Path) -> None:
    path = tmp_path / "old"
    pts = _local_store(path)
    done = run("search", "q", "-c", "kb", "--path", str(path), "--model", str(tmp_path / "unused"))
    assert_clean_failure(done, 1, "local mode", f"bgem3-qdrant migrate {path}")

    done = run("migrate", str(path))
    assert done.returncode == 0, done.stderr
    assert "kb: 5 points" in done.stdout and "local-mode-backup" in done.stdout
    assert (path / "local-mode-backup" / "meta.json").is_file()
    with open_store(resolve_target(path=str(path))) as st:
        assert st.kind == "edge" and st.count("kb") == 5
        got = {p.id: p for p in st.iter_points("kb", with_vectors=True)}
        assert st.stored_schema("kb").size == 8
    for p in pts:
        g = got[p.id]
        assert g.payload == p.payload
        unit = p.vectors["dense"] / np.linalg.norm(p.vectors["dense"])
        np.testing.assert_allclose(g.vectors["dense"], unit, rtol=1e-6, atol=1e-7)
        rows = p.vectors["colbert"] / np.linalg.norm(p.vectors["colbert"], axis=1, keepdims=True)
        np.testing.assert_allclose(g.vectors["colbert"], rows, rtol=1e-6, atol=1e-7)
        indices, values = g.vectors["sparse"]
        np.testing.assert_array_equal(indices, p.vectors["sparse"][0])
        np.testing.assert_array_equal(values, p.vectors["sparse"][1])  # float32 weights, bit for bit
    again = run("migrate", str(path))
    assert_clean_failure(again, 1, "already a Qdrant Edge store")


@pytest.mark.parametrize("engine", ["local"])
def test_old_store_opens_as_is_with_local_engine(tmp_path: Path, engine: str) -> None:
    path = tmp_path / "old"
    _local_store(path, n=2)
    with open_store(resolve_target(path=str(path), engine=engine)) as st:  # type: ignore[arg-type]
        assert st.count("kb") == 2
