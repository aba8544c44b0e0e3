"""A Spark standalone cluster on this machine for tests and benchmarks: a master and one-core workers started
with pyspark's own `bin/spark-class`, every process on loopback (SPARK_LOCAL_IP=127.0.0.1).

    with spark_cluster(tmp, workers=2) as cluster:     # master + 2 workers of 1 core
        run([..., "--spark-master", cluster.master_url])
        cluster.kill_worker(1)                          # SIGKILL: the worker, its executor, its Pythons

Each daemon runs in a session of its own (its process group holds the executors and Python workers it
starts), with its output in a log file under the cluster's folder; at the end every group is killed.
Whether the cluster is up is read from the master's JSON page; where tasks ran is read from the workers'
own executor logs (work dir: <app id>/<executor id>/stderr), never from the code under test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 180.0  # three JVMs on a loaded 2-vCPU machine
# The master declares a worker dead after this many seconds without a heartbeat (Spark's default: 60); a
# worker sends one every quarter of its own setting, so both daemons take it.
WORKER_TIMEOUT_S = 20
# What an executor logs (Spark's default log4j profile, level INFO) for each task it finished.
TASK_DONE = "Finished task"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_class() -> Path:
    """pyspark's `bin/spark-class` (the pip package is a Spark distribution)."""
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    work_dir: Path
    web_port: int

    def apps(self) -> set[str]:
        """Application ids this worker started executors for."""
        return {p.name for p in self.work_dir.iterdir()} if self.work_dir.exists() else set()

    def tasks_done(self, app_id: str) -> int:
        """Tasks this worker's executors of `app_id` finished (from their own logs)."""
        return sum(
            (d / "stderr").read_text(errors="replace").count(TASK_DONE)
            for d in (self.work_dir / app_id).iterdir()
            if (d / "stderr").exists()
        )


@dataclass
class SparkCluster:
    master_url: str  # spark://127.0.0.1:port, for --spark-master
    web_url: str  # the master's web UI (JSON at /json/)
    master: subprocess.Popen[bytes]
    workers: list[Worker]
    root: Path
    killed: list[int] = field(default_factory=list)

    def state(self) -> dict[str, Any]:
        """The master's JSON page: workers (with state), alive workers, applications."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=10) as r:
            data: dict[str, Any] = json.load(r)
        return data

    def alive_workers(self) -> int:
        return int(self.state().get("aliveworkers", 0))

    def kill_worker(self, index: int) -> None:
        """SIGKILL a worker's process group: the worker daemon, its executors and their Python workers."""
        _kill_group(self.workers[index].proc)
        self.killed.append(index)

    def close(self) -> None:
        for w in self.workers:
            _kill_group(w.proc)
        _kill_group(self.master)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [str(spark_class()), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


def cluster_env(root: Path) -> dict[str, str]:
    """The daemons' environment: loopback, logs and scratch under `root`, small JVMs."""
    return {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(root / "logs"),
        "SPARK_LOCAL_DIRS": str(root / "scratch"),
        "SPARK_DAEMON_MEMORY": "512m",
        "SPARK_MASTER_OPTS": f"-Dspark.worker.timeout={WORKER_TIMEOUT_S}",
        "SPARK_WORKER_OPTS": f"-Dspark.worker.timeout={WORKER_TIMEOUT_S}",
    }


@contextmanager
def spark_cluster(
    root: Path, workers: int = 2, cores: int = 1, memory: str = "2g", env: dict[str, str] | None = None
) -> Iterator[SparkCluster]:
    """A master and `workers` workers of `cores` cores on 127.0.0.1, killed at the end. `env`: more
    environment for every daemon (their executors inherit it)."""
    root.mkdir(parents=True, exist_ok=True)
    daemon_env = {**cluster_env(root), **(env or {})}
    port, web = free_port(), free_port()
    master = _start(
        ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
         "--webui-port", str(web)],
        root / "master.log",
        daemon_env,
    )  # fmt: skip
    cluster = SparkCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web}", master, [], root)
    try:
        for i in range(workers):
            work, wport = root / f"worker{i}", free_port()
            proc = _start(
                ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", str(cores),
                 "--memory", memory, "--work-dir", str(work), "--webui-port", str(wport),
                 cluster.master_url],
                root / f"worker{i}.log",
                daemon_env,
            )  # fmt: skip
            cluster.workers.append(Worker(proc, work, wport))
        _wait_alive(cluster, workers)
        yield cluster
    finally:
        cluster.close()


def _wait_alive(cluster: SparkCluster, workers: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for p in (cluster.master, *(w.proc for w in cluster.workers)):
            if p.poll() is not None:
                raise RuntimeError(f"a Spark daemon exited ({p.returncode}); logs in {cluster.root}")
        with suppress(OSError, ValueError):
            if cluster.alive_workers() == workers:
                return
        time.sleep(1.0)
    raise TimeoutError(f"{workers} Spark workers not alive within {START_TIMEOUT_S}s; logs in {cluster.root}")
