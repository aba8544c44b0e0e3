"""What the distributed engines' tests share: the points the plain engine stores, the points a run stored,
and the comparison of the two (ids, payloads, vectors), plus `check` run as a command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from bgem3_qdrant import IngestOptions, Ingestor, open_store, resolve_target

# Small chunks, so a small corpus gives many of them.
CHUNKING = ["--chunk-size", "24", "--chunk-overlap", "4", "--batch-size", "8"]
OPTS = {"chunk_size": 24, "chunk_overlap": 4, "batch_size": 8, "show_progress": False}
RUN_TIMEOUT_S = 420


def plain_points(
    where: Path, corpus: Path, encoder: Any, checkpoint: Path, pooling: int | None = None
) -> dict[str, Any]:
    """The corpus as the plain engine stores it (ingested in this process into a store under `where`)."""
    with open_store(resolve_target(path=str(where / "store"))) as store:
        options = IngestOptions(**OPTS, colbert_pooling=pooling)
        Ingestor(store, "docs", encoder, options=options, model_id=str(checkpoint)).ingest_paths([corpus])
        return points(store, "docs")


def points(store: Any, collection: str) -> dict[str, Any]:
    return {p.id: p for p in store.iter_points(collection, with_vectors=True)}


def stored(path: Path, collection: str = "docs") -> dict[str, Any]:
    """The points of an embedded store's collection, by id."""
    with open_store(resolve_target(path=str(path))) as store:
        return points(store, collection)


def assert_same_points(
    expected: dict[str, Any], got: dict[str, Any], colbert_atol: float = 1e-5, model: str | None = None
) -> None:
    """Same ids and payloads; dense and sparse to 1e-5; ColBERT (float16) within one float16 step.
    `model`: the model name `got` was ingested under, when it differs from `expected`'s."""
    assert expected and got.keys() == expected.keys()
    for pid, a in expected.items():
        b = got[pid]
        assert (a.payload if model is None else {**a.payload, "model": model}) == b.payload, pid
        np.testing.assert_allclose(a.vectors["dense"], b.vectors["dense"], atol=1e-5, err_msg=pid)
        np.testing.assert_array_equal(a.vectors["sparse"][0], b.vectors["sparse"][0], err_msg=pid)
        np.testing.assert_allclose(a.vectors["sparse"][1], b.vectors["sparse"][1], atol=1e-5, err_msg=pid)
        np.testing.assert_allclose(
            a.vectors["colbert"], b.vectors["colbert"], rtol=2**-10, atol=colbert_atol, err_msg=pid
        )


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "bgem3_qdrant", *args]


def check_report(store: Path, collection: str = "docs") -> dict[str, Any]:
    """`bgem3-qdrant check --json` of an embedded store's collection (it must succeed)."""
    done = subprocess.run(
        cli("check", "--path", str(store), "-c", collection, "--json"),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report
