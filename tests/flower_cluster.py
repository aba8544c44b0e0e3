"""A Flower federation on this machine for tests: Flower's own Deployment Runtime, each part a real process
on loopback, in insecure mode (loopback only: TLS and node authentication are for real machines).

    with local_federation(tmp) as fed:                 # flower-superlink
        fed.start_node("a", 'collection="docs" path="/data/a"')   # flower-supernode --node-config ...
        done = fed.run(APP_DIR, {"num-server-rounds": 2})          # flwr run APP <superlink> --stream
        fed.kill_node("a"); fed.start_node("a")        # SIGKILL the SuperNode and what it started; restart

Every process starts in a session of its own with its own FLWR_HOME (a SuperNode installs the App into it,
as on its own machine); at the end each one, and every process it started (the SuperExec, the
ServerApp and ClientApp processes), is killed. The `flwr` CLI gets a Flower configuration naming this
SuperLink, in a folder of its own: the user's ~/.flwr is never read or written.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.spark_cluster import free_port

START_TIMEOUT_S = 60.0
CONNECTION = "loopback"  # the SuperLink connection's name in the CLI's Flower configuration


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ, FLWR_HOME=str(home), PYTHONUNBUFFERED="1")
    # flower-supernode and flower-superlink start flower-superexec, flwr-serverapp and flwr-clientapp by name
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _kill_tree(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL a process and every process it started (a SuperExec leaves its own session)."""
    try:
        family = [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        with suppress(psutil.NoSuchProcess):
            member.send_signal(signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _wait_for_port(port: int, proc: subprocess.Popen[Any], log: Path) -> None:
    import socket

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on {port} after {START_TIMEOUT_S:.0f} s:\n{log.read_text()[-3000:]}")


@dataclass
class SuperNode:
    name: str
    node_config: str
    log: Path
    proc: subprocess.Popen[Any]
    node_id: int  # the id the SuperLink gave it (a restarted SuperNode gets a new one)
    starts: int = 1


def _registered(log: Path, proc: subprocess.Popen[Any]) -> int:
    """The SuperNode's id, once it logs that it registered with the SuperLink."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if "SuperNode ID:" in line:
                return int(line.rsplit(":", 1)[1])
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError(f"the SuperNode did not register:\n{log.read_text()[-3000:]}")


@dataclass
class LocalFederation:
    root: Path
    address: str
    superlink: subprocess.Popen[Any]
    nodes: dict[str, SuperNode] = field(default_factory=dict)

    @property
    def cli_home(self) -> Path:
        return self.root / "cli-home"

    def start_node(self, name: str, node_config: str | None = None) -> SuperNode:
        """Start (or restart, with its previous node config) the SuperNode `name`."""
        previous = self.nodes.get(name)
        config = node_config if node_config is not None else previous.node_config if previous else ""
        starts = previous.starts + 1 if previous else 1
        home = self.root / f"node-{name}"
        home.mkdir(parents=True, exist_ok=True)
        log = self.root / f"node-{name}-{starts}.log"
        port = free_port()
        command = ["flower-supernode", "--insecure", "--superlink", self.address, "--port", str(port)]
        if config:
            command += ["--node-config", config]
        with open(log, "w") as out:
            proc = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=_env(home), start_new_session=True
            )
        _wait_for_port(port, proc, log)
        node = SuperNode(name, config, log, proc, _registered(log, proc), starts)
        self.nodes[name] = node
        return node

    def kill_node(self, name: str) -> None:
        _kill_tree(self.nodes[name].proc)

    def wait_for_log(self, name: str, text: str, timeout: float) -> None:
        """Until the current log of SuperNode `name` holds `text`."""
        node = self.nodes[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in node.log.read_text(errors="replace"):
                return
            time.sleep(0.2)
        raise AssertionError(
            f"{text!r} not in {node.log} after {timeout:.0f} s:\n{node.log.read_text()[-3000:]}"
        )

    def submit(self, app: Path, run_config: Mapping[str, Any], log: Path) -> subprocess.Popen[Any]:
        """`flwr run APP <this SuperLink> --stream --run-config ...` started (its output into `log`)."""
        overrides = " ".join(f"{key}={_toml(value)}" for key, value in run_config.items())
        command = ["flwr", "run", str(app), CONNECTION, "--stream"]
        if overrides:
            command += ["--run-config", overrides]
        with open(log, "w") as out:
            return subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=_env(self.cli_home), start_new_session=True
            )


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def write_cli_config(home: Path, address: str) -> None:
    """The flwr CLI's Flower configuration (FLWR_HOME/config.toml): one insecure connection to `address`."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
        f'address = "{address}"\ninsecure = true\n'
    )


@contextmanager
def local_federation(root: Path) -> Iterator[LocalFederation]:
    """A SuperLink on a free loopback port (no runtime dependency installation: nothing is downloaded)."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    address = f"127.0.0.1:{port}"
    log = root / "superlink.log"
    home = root / "superlink-home"
    home.mkdir(exist_ok=True)
    with open(log, "w") as out:
        superlink = subprocess.Popen(
            [
                "flower-superlink",
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--disable-runtime-dependency-installation",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(home),
            start_new_session=True,
        )
    fed = LocalFederation(root, address, superlink)
    try:
        _wait_for_port(port, superlink, log)
        write_cli_config(fed.cli_home, address)
        yield fed
    finally:
        for node in fed.nodes.values():
            _kill_tree(node.proc)
        _kill_tree(superlink)
