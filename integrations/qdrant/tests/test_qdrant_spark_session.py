"""The Spark engine's checks and helpers that need no JVM (the cluster: test_qdrant_spark_cluster.py):
master URLs, loopback, Java found or not, a dead master refused at once, job errors turned into one line,
and how the chunks are cut into waves of whole batches."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from bgem3_qdrant.ingest.spark import MAX_BATCHES_PER_PARTITION, MIN_WAVES, PARTITIONS_PER_SLOT, waves
from bgem3_qdrant.ingest.spark_session import (
    SparkJobError,
    SparkSetupError,
    check_master,
    find_java,
    job_error,
    local_master,
    master_hosts,
    on_loopback,
)
from bgem3_qdrant.ingest.worker import CheckpointMismatchError


def test_master_urls_and_loopback() -> None:
    assert master_hosts("local[*]") == [] and master_hosts("yarn") == []
    assert master_hosts("spark://10.0.0.5:7077") == [("10.0.0.5", 7077)]
    assert master_hosts("spark://a:7077,b:7078") == [("a", 7077), ("b", 7078)]
    assert master_hosts("spark://host") == [("host", 7077)]
    with pytest.raises(SparkSetupError, match="is not spark://host:port"):
        master_hosts("spark://host:port")
    assert on_loopback("local[2]") and on_loopback("spark://127.0.0.1:7077")
    assert on_loopback("spark://localhost:7077,127.0.0.1:7078")
    assert not on_loopback("spark://10.0.0.5:7077") and not on_loopback("yarn")
    assert local_master(None) == "local[*]" and local_master(3) == "local[3]"


def test_a_master_nothing_answers_at_is_refused_at_once() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    with pytest.raises(SparkSetupError, match=rf"no Spark master answers at spark://127.0.0.1:{port}"):
        check_master(f"spark://127.0.0.1:{port}")
    check_master("local[*]")  # nothing to reach


def test_java_from_java_home_or_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(SparkSetupError, match="has no bin/java: install Java 17"):
        find_java()
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    assert find_java() == str(java)
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(
        SparkSetupError, match="no java is on PATH: install Java 17 .*openjdk-17-jre-headless"
    ):
        find_java()


class PythonException(Exception):  # noqa: N818 - pyspark's class name and module, what job_error reads
    __module__ = "pyspark.errors.exceptions.captured"


def test_job_errors_become_one_line() -> None:
    worker_trace = (
        "An exception was thrown from the Python worker:\nTraceback (most recent call last):\n"
        '  File "worker.py", line 1, in main\n'
        "ModuleNotFoundError: No module named 'bgem3_qdrant'\n SQLSTATE: 38000"
    )
    e = job_error(PythonException(worker_trace))
    assert isinstance(e, SparkJobError)
    assert str(e).startswith(
        "a Spark worker's Python cannot import 'bgem3_qdrant': install bgem3-qdrant[spark]"
    )
    ours = job_error(
        PythonException(
            "Traceback ...\nbgem3_qdrant.ingest.worker.CheckpointMismatchError: the encoder on Spark "
            "executor on h (Python worker pid 7) loaded other checkpoint files\n SQLSTATE: 38000"
        )
    )
    assert isinstance(ours, CheckpointMismatchError)
    assert (
        str(ours) == "the encoder on Spark executor on h (Python worker pid 7) loaded other checkpoint files"
    )
    other = job_error(PythonException("Job aborted.\n\tat org.apache.Foo(Foo.scala:1)\nOutOfMemoryError: x"))
    assert str(other) == "the Spark job failed: OutOfMemoryError: x"
    plain = ValueError("not Spark's")
    assert job_error(plain) is plain  # errors of our own code pass through


def test_waves_are_whole_batches_and_cover_every_row() -> None:
    rows = [{"id": str(i)} for i in range(75)]
    got = list(waves(rows, batch_size=8, slots=2))
    per_wave = 2 * PARTITIONS_PER_SLOT
    assert [len(w) for w in got] == [per_wave, 2]  # 10 partitions: 9 full batches and the last 3 rows
    parts = [p for w in got for p in w]
    assert all(len(p) == 8 for p in parts[:-1]) and len(parts[-1]) == 3
    assert [r for p in parts for r in p] == rows
    assert list(waves([], 8, 2)) == []


def test_a_large_run_puts_several_batches_in_a_partition_and_keeps_several_waves() -> None:
    per_wave = 2 * PARTITIONS_PER_SLOT
    rows = [{"id": str(i)} for i in range(8 * per_wave * MIN_WAVES * 3)]  # 3 batches per partition
    got = list(waves(rows, batch_size=8, slots=2))
    assert len(got) == MIN_WAVES and all(len(p) == 24 for w in got for p in w)
    assert [r for w in got for p in w for r in p] == rows
    huge = [{"id": str(i)} for i in range(8 * per_wave * MIN_WAVES * 100)]
    sizes = {len(p) for w in waves(huge, batch_size=8, slots=2) for p in w}
    assert sizes == {8 * MAX_BATCHES_PER_PARTITION}
