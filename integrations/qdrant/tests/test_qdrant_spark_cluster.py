"""`bgem3-qdrant ingest --engine spark --spark-master` on a real Spark standalone cluster on this machine.

A master and two one-core workers started once for the module with pyspark's `bin/spark-class`
(tests/spark_cluster.py), every process on 127.0.0.1, a tiny checkpoint and a small synthetic corpus. Where
tasks ran is read from the workers' own executor logs; what the cluster stores is compared with what the
plain engine stores. Slow (minutes on 2 vCPUs: JVMs, and TensorFlow in every Python worker); `.ci/run`
runs it (`make test-spark-cluster`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bgem3_qdrant import IngestOptions
from engine_support import (
    CHUNKING,
    OPTS,
    RUN_TIMEOUT_S,
    assert_same_points,
    check_report,
    cli,
    plain_points,
    stored,
)

from tests.optional import require_module, skip_or_fail
from tests.ray_cluster import IngestRun, write_synthetic_corpus
from tests.spark_cluster import SparkCluster, free_port, spark_cluster
from tests.support import user_install_pythonpath

require_module("pyspark", reason="the spark extra is not installed")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

# A Python start-up hook for the workers' Python: these packages cannot be found there, as on a worker where
# they were never installed.
HIDE_PACKAGES = """\
import sys
HIDDEN = {hidden!r}
class _Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Hide())
"""
ROOT = Path(__file__).resolve().parents[3]
JOB = ROOT / "examples" / "spark_savedmodel" / "bgem3_savedmodel_job.py"


def python_without(where: Path, *packages: str) -> Path:
    """A `python` for PYSPARK_PYTHON: this interpreter, unable to import `packages`."""
    hook = where / "hook"
    hook.mkdir(parents=True)
    (hook / "sitecustomize.py").write_text(HIDE_PACKAGES.format(hidden=set(packages)), encoding="utf-8")
    python = where / "python-without"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{hook}" exec "{sys.executable}" "$@"\n', encoding="utf-8")
    python.chmod(0o755)
    return python


def _has_java() -> bool:
    home = os.environ.get("JAVA_HOME")
    return bool(home and Path(home, "bin", "java").is_file()) or shutil.which("java") is not None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """Master + 2 workers of one core each, for the whole module (the last test kills a worker)."""
    if not _has_java():
        skip_or_fail("Spark needs Java: apt-get install openjdk-17-jre-headless", ".ci/run installs it")
    # The executors' Python workers are a user's TensorFlow install: no JAX, no scikit-learn, each of which
    # TensorFlow or Keras would import at every worker start (tests/support.py)
    pythonpath = user_install_pythonpath(os.environ.get("PYTHONPATH", ""))
    with spark_cluster(
        tmp_path_factory.mktemp("spark"), workers=2, cores=1, env={"PYTHONPATH": pythonpath}
    ) as c:
        yield c


@pytest.fixture(scope="module")
def synthetic_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 200 chunks of 24 tokens: several waves of Spark jobs, long enough to lose a worker midway."""
    return write_synthetic_corpus(tmp_path_factory.mktemp("synthetic"), docs=12)


@pytest.fixture(scope="module")
def plain_synthetic(
    tmp_path_factory: pytest.TempPathFactory, synthetic_corpus: Path, encoder: Any, tiny_checkpoint: Path
) -> dict[str, Any]:
    """The synthetic corpus as the plain engine stores it."""
    return plain_points(tmp_path_factory.mktemp("plain"), synthetic_corpus, encoder, tiny_checkpoint)


def _ingest_args(corpus: Path, store: Path, model: Path, cluster: SparkCluster, *extra: str) -> list[str]:
    return cli(
        "ingest", str(corpus), "--path", str(store), "-c", "docs", "--model", str(model),
        "--engine", "spark", "--spark-master", cluster.master_url, *CHUNKING, *extra,
    )  # fmt: skip


def _one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The error line of a command that failed as expected: exit 1, no traceback, no JVM output."""
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "WARN" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


def test_cluster_stores_what_the_plain_engine_stores_with_tasks_on_both_workers(
    cluster: SparkCluster, tmp_path: Path, synthetic_corpus: Path, plain_synthetic: dict[str, Any],
    tiny_checkpoint: Path,
) -> None:  # fmt: skip
    """Both workers run encoding tasks (their executor logs say so); the points are the plain engine's;
    nothing of Spark's or the JVM's output reaches the terminal; a second run encodes nothing."""
    store = tmp_path / "store"
    before = set().union(*(w.apps() for w in cluster.workers))
    run = IngestRun(_ingest_args(synthetic_corpus, store, tiny_checkpoint, cluster, "--json"))
    summary = run.summary()
    assert summary["encoded"] == summary["chunks"] == len(plain_synthetic)
    assert run.err.strip() == b"", run.err.decode(errors="replace")[-3000:]
    apps = set().union(*(w.apps() for w in cluster.workers)) - before
    assert len(apps) == 1, apps
    app = apps.pop()
    assert all(w.tasks_done(app) > 0 for w in cluster.workers), [w.tasks_done(app) for w in cluster.workers]
    assert_same_points(plain_synthetic, stored(store))
    # Idempotent: the same command again finds every chunk stored.
    again = IngestRun(_ingest_args(synthetic_corpus, store, tiny_checkpoint, cluster, "--json")).summary()
    assert again["encoded"] == 0 and again["unchanged"] == len(plain_synthetic)
    report = check_report(store)
    assert report["damaged"] == 0 and report["points"] == len(plain_synthetic)


def test_expected_failures_are_one_line(
    cluster: SparkCluster, tmp_path: Path, corpus: Path, tiny_checkpoint: Path
) -> None:
    """No Java, a master that does not answer, a worker whose Python lacks the package: one line each."""
    store = tmp_path / "store"
    args = _ingest_args(corpus, store, tiny_checkpoint, cluster)

    def run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
        merged = {**os.environ, **env}
        for key in [k for k, v in env.items() if v == ""]:
            del merged[key]
        return subprocess.run(argv, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=merged)

    dead = f"spark://127.0.0.1:{free_port()}"
    line = _one_line_error(run([*args, "--spark-master", dead]))
    assert line.startswith(f"error: no Spark master answers at {dead} (--spark-master)"), line

    no_java = run(args, PATH=str(Path(sys.executable).parent), JAVA_HOME="")
    line = _one_line_error(no_java)
    assert "no java is on PATH" in line and "openjdk-17-jre-headless" in line, line

    python = python_without(tmp_path, "bgem3_qdrant")
    line = _one_line_error(run(args, PYSPARK_PYTHON=str(python)))
    assert line.startswith("error: a Spark worker's Python cannot import 'bgem3_qdrant'"), line
    assert "PYSPARK_PYTHON" in line


def test_dataframe_api_and_parquet_round_trip(
    cluster: SparkCluster, tmp_path: Path, synthetic_corpus: Path, plain_synthetic: dict[str, Any],
    tiny_checkpoint: Path, encoder: Any,
) -> None:  # fmt: skip
    """encode_dataframe adds the three outputs to any DataFrame (equal to the encoder's in this process);
    chunks_dataframe + encode_dataframe + write_parquet, then `load-parquet`, store what `ingest` stores
    (same ids, payloads, vectors); loading again writes nothing."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    from bgem3_qdrant.encoder import encode_texts
    from bgem3_qdrant.spark import chunks_dataframe, encode_dataframe, spark_session, write_parquet

    model = str(tiny_checkpoint)
    texts = ["What is BGE M3?", "Spark jobs meet Qdrant.", "a"]
    parquet = tmp_path / "chunks.parquet"
    with spark_session(cluster.master_url, "bgem3 dataframe test") as spark:
        df = spark.createDataFrame(list(enumerate(texts)), "n long, body string")
        got = encode_dataframe(df, model, text_col="body", batch_size=2).orderBy("n").toPandas()
        chunks = chunks_dataframe(spark, [str(synthetic_corpus)], model, IngestOptions(**OPTS))
        write_parquet(encode_dataframe(chunks, model, batch_size=8), str(parquet))
    ref = encode_texts(encoder, texts, query=False)
    assert list(got["body"]) == texts
    np.testing.assert_allclose(np.stack(got["dense"]), ref.dense, atol=1e-5)
    for i, (idx, val) in enumerate(ref.sparse):
        assert dict(zip(got["sparse_indices"][i], got["sparse_values"][i], strict=True)) == pytest.approx(
            dict(zip(idx.tolist(), val.tolist(), strict=True)), abs=1e-5
        )
        np.testing.assert_allclose(np.stack(got["colbert"][i]), ref.colbert[i], atol=1e-5)
    schema = ds.dataset(str(parquet), format="parquet").schema
    assert schema.field("dense").type == pa.list_(pa.float32())
    assert schema.field("sparse_indices").type == pa.list_(pa.int32())
    assert schema.field("colbert").type == pa.list_(pa.list_(pa.float32()))

    store = tmp_path / "store"
    load = cli("load-parquet", str(parquet), "--path", str(store), "-c", "docs", "--model", model, "--json")
    first = subprocess.run(load, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert first.returncode == 0 and first.stderr == "", first.stderr[-3000:]
    assert json.loads(first.stdout)["encoded"] == len(plain_synthetic)
    assert_same_points(plain_synthetic, stored(store))
    again = subprocess.run(load, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["unchanged"] == len(plain_synthetic)
    assert check_report(store)["damaged"] == 0


def test_savedmodel_job_without_this_library_equals_flagembedding(
    cluster: SparkCluster, tmp_path: Path, tiny_checkpoint: Path
) -> None:
    """examples/spark_savedmodel: `bgem3 export`'s SavedModel and tokenizer.json on the executors, whose
    Python cannot import bgem3_embeddings nor bgem3_qdrant; the Parquet it writes holds FlagEmbedding's
    dense vectors, lexical weights and ColBERT vectors."""
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from bgem3_embeddings.cli import app
    from tests.flagembedding_ref import flagembedding_m3

    export = tmp_path / "saved_model"
    result = CliRunner().invoke(
        app, ["export", str(export), "--format", "saved_model", "--model", str(tiny_checkpoint)]
    )
    assert result.exit_code == 0, result.output
    texts = [
        "What is BGE M3?",
        "BM25 is a bag-of-words retrieval function.",
        "a",
        "Spark jobs, one per cluster.",
    ]
    source = tmp_path / "texts.jsonl"
    source.write_text(
        "".join(json.dumps({"n": i, "text": t}) + "\n" for i, t in enumerate(texts)), encoding="utf-8"
    )
    out = tmp_path / "vectors.parquet"
    args = [sys.executable, str(JOB), "--export", str(export), "--input", str(source), "--output", str(out),
            "--master", cluster.master_url, "--batch-size", "3"]  # fmt: skip
    env = {**os.environ, "PYSPARK_PYTHON": str(python_without(tmp_path, "bgem3_embeddings", "bgem3_qdrant"))}
    done = subprocess.run(args, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    got = pq.read_table(str(out)).to_pandas().sort_values("n")
    assert list(got["text"]) == texts
    ref = flagembedding_m3(tiny_checkpoint).encode(
        texts, return_dense=True, return_sparse=True, return_colbert_vecs=True
    )
    np.testing.assert_allclose(np.stack(got["dense"]), ref["dense_vecs"], atol=1e-5)
    for i, text in enumerate(texts):
        lexical = dict(
            zip(map(str, got["sparse_indices"].iloc[i]), got["sparse_values"].iloc[i], strict=True)
        )
        expected = {k: float(v) for k, v in ref["lexical_weights"][i].items()}
        assert lexical == pytest.approx(expected, rel=1e-5, abs=1e-5), text
        np.testing.assert_allclose(np.stack(got["colbert"].iloc[i]), ref["colbert_vecs"][i], atol=1e-5)


def test_worker_killed_mid_ingest_every_chunk_stored_once(
    cluster: SparkCluster, tmp_path: Path, synthetic_corpus: Path, plain_synthetic: dict[str, Any],
    tiny_checkpoint: Path,
) -> None:  # fmt: skip
    """SIGKILL of a worker (its daemon, executor and Python workers) once some chunks are stored: Spark runs
    the lost tasks on the worker left, or the run stops with one line and a re-run finishes it; either way
    every chunk ends stored once, as the plain engine stores it, and `check` is clean. Last in the module:
    the cluster keeps one worker."""
    store = tmp_path / "store"
    args = _ingest_args(synthetic_corpus, store, tiny_checkpoint, cluster, "--json")
    run = IngestRun([*args, "--progress"], timeout=RUN_TIMEOUT_S)
    total = run.total()
    assert total == len(plain_synthetic)
    done = run.wait_for(1)
    assert done < total, "the ingest ended before the worker was killed"
    cluster.kill_worker(1)
    code, out, err = run.finish()
    if code != 0:  # the run gave up: one line, what was written is kept, one re-run finishes it
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: ") and "Traceback" not in err, err[-3000:]
        kept = len(stored(store))
        summary = IngestRun(args, timeout=RUN_TIMEOUT_S).summary()
        assert summary["unchanged"] == kept and summary["encoded"] == total - kept
    else:
        summary = IngestRun(args, timeout=RUN_TIMEOUT_S).summary()
        assert summary["encoded"] == 0 and summary["unchanged"] == total
    assert_same_points(plain_synthetic, stored(store))
    report = check_report(store)
    assert report["damaged"] == 0 and report["points"] == total
