"""Ray Data engine on a local Ray instance: same point ids, payloads and vectors as the plain engine, ColBERT
pooling included (one Ray instance for the module: its start is most of a test's time)."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil  # the dev extra's: a missing psutil fails the loopback check instead of skipping it
import pytest
from bgem3_qdrant import IngestOptions, Ingestor, open_store, resolve_target
from bgem3_qdrant.identity import stored_pooling
from bgem3_qdrant.ingest.ray import RayEncoding
from bgem3_qdrant.ingest.ray_connect import join_ray
from bgem3_qdrant.stores import BGEM3Store

from tests.optional import require_module

ray = require_module("ray", "the ray extra is not installed")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    # Light on purpose: 2 CPUs, a small object store, no dashboard. Started as the engine starts one
    # (join_ray with no address): on loopback only.
    join_ray(
        ray,
        None,
        num_cpus=2,
        object_store_memory=200 * 1024**2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}},
    )
    yield ray
    ray.shutdown()


def test_a_local_instance_listens_on_loopback_only(local_ray: Any) -> None:
    """Ray's servers (GCS, raylet, workers) run whatever code reaches them; on Linux Ray binds a fresh
    instance to every interface unless its node address is loopback (ingest/ray_connect.py)."""
    assert [n["NodeManagerAddress"] for n in local_ray.nodes()] == ["127.0.0.1"]
    listening = {}
    for process in psutil.Process().children(recursive=True):  # the instance this driver started
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            for conn in process.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    listening[f"{process.name()}:{conn.laddr.port}"] = conn.laddr.ip
    assert any(name.startswith(("gcs_server", "raylet")) for name in listening), listening
    assert set(listening.values()) <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, listening


def _vectors(client: BGEM3Store) -> dict[str, Any]:
    return {r.id: r for r in client.iter_points("docs", with_vectors=True)}


def _colbert_rows(client: BGEM3Store, name: str) -> dict[str, np.ndarray]:
    points = client.iter_points(name, with_vectors=["colbert"])
    return {p.id: np.asarray(p.vectors["colbert"]) for p in points}


def test_ray_engine_matches_plain(
    local_ray: Any, tmp_path: Path, tiny_checkpoint: Path, encoder: Any, corpus: Path
) -> None:
    opts = {"chunk_size": 24, "chunk_overlap": 4, "batch_size": 8, "show_progress": False}
    model = str(tiny_checkpoint)
    plain = open_store(resolve_target(path=str(tmp_path / "plain")))
    viaray = open_store(resolve_target(path=str(tmp_path / "ray")))
    try:
        s1 = Ingestor(plain, "docs", encoder, options=IngestOptions(**opts), model_id=model).ingest_paths(
            [corpus]
        )
        encoding = RayEncoding(model, concurrency=1)
        assert encoding.hidden_size == encoder.hidden_size
        ing = Ingestor(viaray, "docs", encoding, options=IngestOptions(**opts))
        s2 = ing.ingest_paths([corpus])
        assert s2.encoded == s1.encoded == s2.chunks == s1.chunks and s2.tokens == s1.tokens
        a, b = _vectors(plain), _vectors(viaray)
        assert len(a) == s1.chunks and a.keys() == b.keys()
        for pid, ra in a.items():
            rb = b[pid]
            assert ra.payload == rb.payload and rb.payload["text"]
            np.testing.assert_allclose(ra.vectors["dense"], rb.vectors["dense"], atol=1e-5)
            # ColBERT is stored in float16: float32 results a few ulps apart (a batch run eagerly in one
            # process and traced in the other) may round to neighbouring float16 values, 2^-11 apart.
            np.testing.assert_allclose(ra.vectors["colbert"], rb.vectors["colbert"], rtol=2**-10, atol=1e-5)
            np.testing.assert_array_equal(ra.vectors["sparse"][0], rb.vectors["sparse"][0])
            np.testing.assert_allclose(ra.vectors["sparse"][1], rb.vectors["sparse"][1], atol=1e-5)
        # A re-run through Ray finds everything stored and starts no encoding.
        s3 = ing.ingest_paths([corpus])
        assert s3.encoded == 0 and s3.unchanged == s3.chunks
        # ColBERT pooling (factor 2) through the same Ray encoding (its actors already up): the Ray engine
        # pools as the plain engine does, and the collection records the factor.
        pooled = IngestOptions(**opts, colbert_pooling=2)
        Ingestor(plain, "pooled", encoder, options=pooled).ingest_paths([corpus])
        Ingestor(viaray, "pooled", encoding, options=pooled).ingest_paths([corpus])
        assert stored_pooling(viaray, "pooled") == 2
        pa, pb = _colbert_rows(plain, "pooled"), _colbert_rows(viaray, "pooled")
        assert pa.keys() == pb.keys() == a.keys()
        assert sum(map(len, pb.values())) < sum(len(r.vectors["colbert"]) for r in a.values())
        for pid, rows in pa.items():
            # Float16 storage of float32 rows a few ulps apart (another process encoded them): one float16
            # step at most (rtol 2**-10); atol only for float16's subnormals.
            np.testing.assert_allclose(pb[pid], rows, rtol=2**-10, atol=2**-14, err_msg=pid)
    finally:
        plain.close()
        viaray.close()


def test_ray_driver_imports_no_model_framework(tiny_checkpoint: Path) -> None:
    """The driver chunks with BGEM3Tokenizer (the plain engine's tokenizer) and never loads a framework."""
    code = (
        "import sys\n"
        "from bgem3_qdrant.ingest.ray import RayEncoding\n"
        f"enc = RayEncoding({str(tiny_checkpoint)!r})\n"
        "from bgem3_embeddings.tokenizer import BGEM3Tokenizer\n"
        "assert isinstance(enc.tokenizer, BGEM3Tokenizer), type(enc.tokenizer)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'tensorflow', 'keras') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("rows", "batch"), [(3469, 8), (46, 8), (100_000, 32), (1601, 8), (5, 8)])
def test_ray_blocks_hold_whole_batches(rows: int, batch: int) -> None:
    """The rows are cut into at most 200 blocks (Ray Data's default) so that no encoder call gets the one
    or two rows Ray Data's even split leaves at the end of a block (it splits 3,469 rows 17 or 18 a block:
    batches of 8, 8 and 1 or 2)."""
    from bgem3_qdrant.ingest.ray import _blocks

    n = _blocks(rows, batch)
    assert 1 <= n <= 200
    sizes = [rows // n + (i < rows % n) for i in range(n)]  # how from_items splits them
    calls = [min(batch, size - start) for size in sizes for start in range(0, size, batch)]
    assert sum(calls) == rows and min(calls) >= min(rows, batch) // 2


# The one line a Ray ingest still prints, explained in docs/qdrant-scale.md ("What a Ray ingest prints"): the
# driver's core worker on Ray Data's actor pools (ray-project/ray#53727).
CORE_WORKER_LINE = re.compile(
    r"^\[[\d\- :,]+ E \d+ \d+\] core_worker\.cc:\d+: Actor with class name: 'MapWorker"
)


def test_ray_ingest_prints_no_unexplained_lines(tmp_path: Path, tiny_checkpoint: Path, corpus: Path) -> None:
    """`ingest --engine ray` on a local Ray, as a user runs it: Ray's token-authentication notice is not
    shown, more actors than the corpus has blocks are not started (Ray Data's "minimum number of concurrent
    actors" warning), and what stderr holds is the documented core_worker line only."""
    from tests.support import run_module

    done = run_module(
        "bgem3_qdrant", "ingest", str(corpus), "-c", "docs", "--path", str(tmp_path / "store"),
        "--model", str(tiny_checkpoint), "--engine", "ray", "--concurrency", "3", "--batch-size", "64",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "chunks" in done.stdout
    assert "Token authentication" not in done.stderr
    assert "minimum number of concurrent actors" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert [line for line in lines if not CORE_WORKER_LINE.match(line)] == [], done.stderr


def test_pool_size_is_at_most_the_blocks() -> None:
    from bgem3_qdrant.ingest.ray import pool_size

    assert [pool_size(4, blocks) for blocks in (1, 3, 4, 200)] == [1, 3, 4, 4]
    assert pool_size(2, 0) == 1
