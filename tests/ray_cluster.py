"""A multi-node Ray cluster on this machine for tests and benchmarks: Ray's own `ray.cluster_utils.Cluster`
(a head and worker nodes, each a real raylet with its own CPUs and object store), every node on loopback.

    with local_cluster(workers=2) as cluster:          # head + 2 workers, 1 CPU each
        run(["bgem3-qdrant", "ingest", ..., "--ray-address", cluster.address])
        cluster.remove(node_id)                        # Cluster.remove_node: kills that node's processes

The cluster runs in a child process of its own (this module run as a script) and session: this process
never becomes a Ray driver, and at the end the whole process group is killed and the cluster's private
temporary folder (RAY_TMPDIR: sessions, logs, the "current cluster" file) removed, so nothing outlives a
test and no other Ray user on the machine finds the cluster by `ray.init()`. Where actors and tasks ran is
read from Ray's state API (the head's dashboard), never from the code under test.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 120.0  # three raylets and a dashboard on a loaded 2-vCPU machine take 10-30 s
COMMAND_TIMEOUT_S = 60.0


@dataclass
class Node:
    node_id: str  # hex, as the state API reports it
    head: bool


@dataclass
class LocalCluster:
    """Handle on a running cluster (see local_cluster)."""

    address: str  # GCS address for --ray-address / ray.init
    dashboard: str  # http://host:port, for ray.util.state
    nodes: list[Node]
    proc: subprocess.Popen[str]
    tmp: Path
    removed: list[str] = field(default_factory=list)

    @property
    def workers(self) -> list[Node]:
        return [n for n in self.nodes if not n.head and n.node_id not in self.removed]

    def _command(self, line: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return _read_reply(self.proc, COMMAND_TIMEOUT_S)

    def remove(self, node_id: str) -> float:
        """Remove a worker node (Cluster.remove_node, not graceful: its raylet and workers are killed);
        returns time.time() when it was gone."""
        reply = self._command(f"remove {node_id}")
        self.removed.append(node_id)
        return float(reply["removed_at"])

    def actors(self, class_part: str, job_id: str | None = None) -> list[Any]:
        """Actors (alive or dead) whose class name contains class_part, from the state API."""
        from ray.util.state import list_actors

        found = list_actors(address=self.dashboard, detail=True, limit=10_000, raise_on_missing_output=False)
        return [a for a in found if class_part in a.class_name and (job_id is None or a.job_id == job_id)]

    def job_of(self, driver_pid: int, timeout: float = 30.0) -> str:
        """The job id of the driver process `driver_pid` (state API)."""
        from ray.util.state import list_jobs

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for job in list_jobs(address=self.dashboard, raise_on_missing_output=False):
                info = getattr(job, "driver_info", None)
                if info is not None and int(info.pid) == driver_pid and job.job_id:
                    return str(job.job_id)
            time.sleep(0.5)
        raise TimeoutError(f"no Ray job with driver pid {driver_pid} within {timeout}s")

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self._command("quit")
                self.proc.wait(timeout=COMMAND_TIMEOUT_S)
        except Exception:  # whatever went wrong, the kill below still runs
            pass
        finally:
            _kill_group(self.proc)
            shutil.rmtree(self.tmp, ignore_errors=True)


class IngestRun:
    """A running `bgem3-qdrant ingest` (a process of its own, killed if it outlives `timeout`); with
    --progress, the chunks done so far are read from its progress bar on stderr."""

    def __init__(self, args: list[str], timeout: float = 420.0, env: dict[str, str] | None = None) -> None:
        self.timeout = timeout
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        assert self.proc.stderr is not None
        os.set_blocking(self.proc.stderr.fileno(), False)
        self.err = b""
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def done(self) -> int:
        """Chunks stored so far (the progress bar's count)."""
        assert self.proc.stderr is not None
        self.err += self.proc.stderr.read() or b""
        counts = re.findall(rb"(\d+)/\d+ \[", self.err[-2000:])
        return int(counts[-1]) if counts else 0

    def _still_running(self) -> None:
        assert self.proc.poll() is None, self.err.decode(errors="replace")[-3000:]
        assert time.monotonic() - self.started < self.timeout, "no progress"
        time.sleep(0.2)

    def total(self) -> int:
        """The chunks the run will store, once its progress bar shows it."""
        while not (found := re.findall(rb"\d+/(\d+) \[", self.err[-2000:])):
            self.done()
            self._still_running()
        return int(found[-1])

    def wait_for(self, chunks: int) -> int:
        """Chunks done once at least `chunks` are (fails if the run ends or takes too long first)."""
        while (n := self.done()) < chunks:
            self._still_running()
        return n

    def finish(self) -> tuple[int, str, str]:
        """Exit code, stdout and stderr once the command ends."""
        assert self.proc.stdout is not None
        deadline = self.started + self.timeout
        try:
            while self.proc.poll() is None:
                self.done()  # keep draining stderr (a full pipe would block the command)
                assert time.monotonic() < deadline, "the ingest did not finish"
                time.sleep(0.2)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.done()
        return self.proc.returncode, self.proc.stdout.read().decode(), self.err.decode(errors="replace")

    def summary(self) -> dict[str, Any]:
        code, out, err = self.finish()
        assert code == 0, err[-3000:]
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result


SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "de", "fi", "gu", "ho"]


def write_synthetic_corpus(root: Path, docs: int, words: int = 60, seed: int = 0) -> Path:
    """`docs` text files of `words` made-up words each (about 17 chunks of 24 tokens per file with the tiny
    test tokenizer): a corpus of any size, the same for every run."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for d in range(docs):
        text = " ".join(
            "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(words)
        )
        (root / f"doc{d:04d}.txt").write_text(f"Document {d}. {text}.", encoding="utf-8")
    return root


def _read_reply(proc: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The next JSON line the cluster process prints (its other output goes to its log file)."""
    import selectors

    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                break
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the Ray cluster process exited ({proc.poll()})")
            if line.startswith("{"):
                reply: dict[str, Any] = json.loads(line)
                if "error" in reply:
                    raise RuntimeError(f"Ray cluster process: {reply['error']}")
                return reply
    finally:
        sel.close()
    raise TimeoutError(f"the Ray cluster process did not answer within {timeout}s")


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill the cluster's process group (the child and every Ray process it started)."""
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


@contextmanager
def local_cluster(
    workers: int = 2, cpus: int = 1, node_env: dict[int, dict[str, str]] | None = None
) -> Iterator[LocalCluster]:
    """A head and `workers` worker nodes with `cpus` CPUs each, all on 127.0.0.1, with a dashboard.

    node_env: environment variables of the processes of node i (0 is the head), e.g. a per-node cache.
    """
    tmp = Path(tempfile.mkdtemp(prefix="bgr-", dir="/tmp"))  # short: Ray's socket paths live below it
    spec = {"workers": workers, "cpus": cpus, "node_env": {str(k): v for k, v in (node_env or {}).items()}}
    env = {**os.environ, "RAY_TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1"}
    log = (tmp / "cluster.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.ray_cluster", json.dumps(spec)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
        start_new_session=True,
    )
    cluster: LocalCluster | None = None
    try:
        info = _read_reply(proc, START_TIMEOUT_S)
        cluster = LocalCluster(
            address=info["address"],
            dashboard=info["dashboard"],
            nodes=[Node(n["node_id"], n["head"]) for n in info["nodes"]],
            proc=proc,
            tmp=tmp,
        )
        yield cluster
    finally:
        log.close()
        if cluster is not None:
            cluster.close()
        else:
            _kill_group(proc)
            shutil.rmtree(tmp, ignore_errors=True)


def _serve(spec: dict[str, Any]) -> None:  # pragma: no cover - runs in the cluster's own process
    """The cluster process: start the nodes, print their description, then obey `remove ID` and `quit`."""
    from ray.cluster_utils import Cluster

    def out(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    node_env = spec["node_env"]
    loopback = {"node_ip_address": "127.0.0.1", "num_cpus": spec["cpus"]}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            **loopback,
            "include_dashboard": True,
            "dashboard_host": "127.0.0.1",
            "dashboard_port": 0,
            "env_vars": node_env.get("0"),
        },
    )
    nodes = {cluster.head_node.node_id: cluster.head_node}
    for i in range(1, spec["workers"] + 1):
        node = cluster.add_node(**loopback, env_vars=node_env.get(str(i)))
        nodes[node.node_id] = node
    cluster.wait_for_nodes()
    out(
        {
            "address": cluster.address,
            "dashboard": f"http://{cluster.webui_url}",
            "nodes": [{"node_id": k, "head": n is cluster.head_node} for k, n in nodes.items()],
        }
    )
    try:
        for line in sys.stdin:
            cmd, _, arg = line.strip().partition(" ")
            if cmd == "quit":
                break
            if cmd == "remove" and arg in nodes and nodes[arg] is not cluster.head_node:
                cluster.remove_node(nodes.pop(arg), allow_graceful=False)
                out({"removed_at": time.time()})
            else:
                out({"error": f"unknown command or node: {line.strip()!r}"})
    finally:
        cluster.shutdown()
        out({"quit": True})


if __name__ == "__main__":  # pragma: no cover
    _serve(json.loads(sys.argv[1]))
