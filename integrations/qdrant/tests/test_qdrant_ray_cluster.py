"""`bgem3-qdrant ingest --engine ray --ray-address` on a real multi-node Ray cluster on this machine.

A head and two worker nodes of one CPU each (tests/ray_cluster.py: Ray's `Cluster`, every node on
127.0.0.1), a tiny checkpoint and a small corpus. Where actors ran is read from Ray's state API through the
head's dashboard. What the cluster stores is compared with what the plain engine stores. Slow (several
minutes on 2 vCPUs: every run starts TensorFlow in each encoder actor); `.ci/run` runs it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bgem3_qdrant import open_store, resolve_target
from bgem3_qdrant.identity import stored_identity
from engine_support import (
    CHUNKING,
    RUN_TIMEOUT_S,
    assert_same_points,
    check_report,
    cli,
    plain_points,
    stored,
)

from tests.optional import require_module
from tests.ray_cluster import IngestRun, LocalCluster, local_cluster, write_synthetic_corpus
from tests.tiny_checkpoint import make_tiny_checkpoint

require_module("ray", "the ray extra is not installed")
# The state API these tests read is the head's dashboard, which needs ray[default] (aiohttp_cors is one of
# its packages): checked here, so that only a missing package skips, never an error of the set-up.
require_module("aiohttp_cors", "Ray's dashboard needs it: pip install 'ray[default]'")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HUB_ID = "BAAI/bge-m3"
ENCODER_CLASS = "EncodeActor"  # Ray Data names the pool's actors MapWorker(MapBatches(EncodeActor))


def _hub_cache(root: Path, checkpoint: Path) -> Path:
    """A Hugging Face cache holding `checkpoint` as the snapshot of HUB_ID (read offline)."""
    repo = root / ("models--" + HUB_ID.replace("/", "--"))
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(checkpoint, repo / "snapshots" / commit)
    return root


@pytest.fixture(scope="module")
def hub_caches(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> tuple[Path, Path]:
    """Two hub caches for the same id: the test checkpoint, and other weights (seed 1) for one node."""
    root = tmp_path_factory.mktemp("hub")
    other = make_tiny_checkpoint(root / "other_weights", seed=1)
    return _hub_cache(root / "same", tiny_checkpoint), _hub_cache(root / "other", other)


@pytest.fixture(scope="module")
def cluster(hub_caches: tuple[Path, Path]) -> Iterator[LocalCluster]:
    """Head + 2 workers, 1 CPU each. Worker 2 finds other weights under the hub id in its own cache."""
    same, other = hub_caches
    offline = {"HF_HUB_OFFLINE": "1"}
    node_env = {
        0: {**offline, "HF_HUB_CACHE": str(same)},
        1: {**offline, "HF_HUB_CACHE": str(same)},
        2: {**offline, "HF_HUB_CACHE": str(other)},
    }
    with local_cluster(workers=2, cpus=1, node_env=node_env) as c:
        yield c


@pytest.fixture(scope="module")
def synthetic_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 500 chunks of 24 tokens: long enough to lose a node or the driver while encoding runs."""
    return write_synthetic_corpus(tmp_path_factory.mktemp("synthetic"), docs=30)


@pytest.fixture(scope="module")
def plain_synthetic(
    tmp_path_factory: pytest.TempPathFactory, synthetic_corpus: Path, encoder: Any, tiny_checkpoint: Path
) -> dict[str, Any]:
    """The synthetic corpus as the plain engine stores it."""
    return plain_points(tmp_path_factory.mktemp("plain"), synthetic_corpus, encoder, tiny_checkpoint, None)


def _ingest_args(
    corpus: Path, store: Path, model: str, cluster: LocalCluster, *extra: str, collection: str = "docs"
) -> list[str]:
    return cli(
        "ingest", str(corpus), "--path", str(store), "-c", collection, "--model", model,
        "--engine", "ray", "--ray-address", cluster.address, *CHUNKING, *extra,
    )  # fmt: skip


def test_cluster_stores_what_the_plain_engine_stores_with_actors_on_two_nodes(
    cluster: LocalCluster, tmp_path: Path, long_corpus: Path, encoder: Any, tiny_checkpoint: Path
) -> None:
    """A loopback cluster joined by --ray-address; encoder actors on two nodes, each loading the one shared
    checkpoint folder; the same points as the plain engine, unpooled and pooled."""
    store = tmp_path / "store"
    model = str(tiny_checkpoint)
    for collection, pooling in (("docs", None), ("pooled", 2)):
        extra = ["--json"] + ([] if pooling is None else ["--colbert-pooling", str(pooling)])
        run = IngestRun(_ingest_args(long_corpus, store, model, cluster, *extra, collection=collection))
        summary = run.summary()
        assert summary["encoded"] == summary["chunks"] > 10
        actors = cluster.actors(ENCODER_CLASS, cluster.job_of(run.pid))
        assert len(actors) == 2 and len({a.node_id for a in actors}) == 2, actors
        expected = plain_points(
            tmp_path / f"plain_{collection}", long_corpus, encoder, tiny_checkpoint, pooling
        )
        # pooled rows in float16, a few float32 ulps apart before rounding: one float16 step at most,
        # which rtol 2**-10 covers; atol only for float16's subnormals (spacing 2**-24)
        colbert_atol = 1e-5 if pooling is None else 2**-14
        assert_same_points(expected, stored(store, collection), colbert_atol=colbert_atol)
    # The collection records the checkpoint the actors checked theirs against (the shared folder's).
    with open_store(resolve_target(path=str(store))) as s:
        recorded = stored_identity(s, "docs")
    assert recorded is not None and recorded.fingerprint == encoder.fingerprint()


def test_a_node_with_other_checkpoint_files_stops_the_run(
    cluster: LocalCluster, tmp_path: Path, synthetic_corpus: Path, plain_synthetic: dict[str, Any],
    hub_caches: tuple[Path, Path],
) -> None:  # fmt: skip
    """The hub id resolves in each node's own cache, and worker 2's holds other weights: its actor refuses
    to encode (one line naming its node), so the collection never mixes two models."""
    same, _ = hub_caches
    store = tmp_path / "store"
    args = _ingest_args(synthetic_corpus, store, HUB_ID, cluster, "--concurrency", "3")
    env = {**os.environ, "HF_HUB_CACHE": str(same), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(args, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: the encoder on Ray node 127.0.0.1 (id "), last
    assert "other checkpoint files" in last and "Traceback" not in done.stderr
    # What the two other actors encoded before the refusal, if anything, is the right model's (the plain
    # engine's) and kept.
    partial_store = stored(store)
    assert len(partial_store) < len(plain_synthetic)
    if partial_store:
        assert_same_points({pid: plain_synthetic[pid] for pid in partial_store}, partial_store, model=HUB_ID)


def test_driver_killed_mid_ingest_then_rerun_encodes_only_the_rest(
    cluster: LocalCluster, tmp_path: Path, synthetic_corpus: Path, plain_synthetic: dict[str, Any],
    tiny_checkpoint: Path,
) -> None:  # fmt: skip
    """kill -9 of the driver while the cluster encodes: what was written stays; the same command again
    encodes only the chunks missing, and the collection ends as the plain engine's."""
    store = tmp_path / "store"
    args = _ingest_args(synthetic_corpus, store, str(tiny_checkpoint), cluster, "--json")
    run = IngestRun([*args, "--progress"])
    run.wait_for(40)
    run.proc.send_signal(signal.SIGKILL)
    code, _, _ = run.finish()
    assert code == -signal.SIGKILL
    partial = stored(store)
    total = len(plain_synthetic)
    assert 0 < len(partial) < total
    summary = IngestRun(args).summary()
    assert summary["unchanged"] == len(partial) and summary["encoded"] == total - len(partial)
    assert_same_points(plain_synthetic, stored(store))
    assert check_report(store)["damaged"] == 0


def test_worker_node_lost_mid_ingest_ray_finishes_it(
    cluster: LocalCluster, tmp_path: Path, synthetic_corpus: Path, plain_synthetic: dict[str, Any],
    tiny_checkpoint: Path,
) -> None:  # fmt: skip
    """Cluster.remove_node on a worker whose encoder actor has batches: Ray restarts the actor on a node
    left and retries them; every chunk ends stored once, as the plain engine stores it. Last in this
    module: the cluster keeps one worker."""
    store = tmp_path / "store"
    run = IngestRun(
        [*_ingest_args(synthetic_corpus, store, str(tiny_checkpoint), cluster, "--json"), "--progress"]
    )
    run.wait_for(40)
    job = cluster.job_of(run.pid)
    workers = {n.node_id for n in cluster.workers}
    busy = [a for a in cluster.actors(ENCODER_CLASS, job) if a.state == "ALIVE" and a.node_id in workers]
    assert busy, "no encoder actor alive on a worker node"
    lost = busy[0]
    cluster.remove(lost.node_id)
    assert run.done() < len(plain_synthetic), "the ingest ended before the node was removed"
    summary = run.summary()
    assert summary["encoded"] == summary["chunks"] == len(plain_synthetic)
    # The lost node's actor was started again elsewhere (state API), and finished the work.
    again = {a.actor_id: a for a in cluster.actors(ENCODER_CLASS, job)}[lost.actor_id]
    assert again.num_restarts >= 1 and again.node_id != lost.node_id
    assert_same_points(plain_synthetic, stored(store))
    report = check_report(store)
    assert report["damaged"] == 0 and report["points"] == len(plain_synthetic)
