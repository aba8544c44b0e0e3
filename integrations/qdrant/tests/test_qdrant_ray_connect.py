"""How the driver joins a Ray cluster (ingest/ray_connect.py): where it answers, loopback kept only when the
cluster listens on loopback alone, and an address nobody answers at as one line at once (Ray would retry it
for minutes). The real multi-node runs are in test_qdrant_ray_cluster.py."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from bgem3_qdrant.ingest.ray_connect import RayClusterUnreachableError, join_ray, split_address

from tests.optional import require_module
from tests.support import assert_clean_failure, run_module


@contextmanager
def listening(host: str) -> Iterator[int]:
    """A TCP port accepting connections on `host` only (0.0.0.0: every address of the machine)."""
    with socket.socket() as s:
        s.bind((host, 0))
        s.listen()
        yield int(s.getsockname()[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeRay:
    """The parts of `ray` join_ray uses; records each init and whether Ray kept loopback during it."""

    def __init__(self, interface: str, running: str | None = None) -> None:
        self.__version__ = "test"
        # `running`: the cluster Ray would join for address None (RAY_ADDRESS, the last `ray start` here)
        services = SimpleNamespace(
            canonicalize_bootstrap_address=lambda address: None if address == "local" else running
        )
        self._private = SimpleNamespace(
            ray_constants=SimpleNamespace(ENABLE_RAY_CLUSTER=True), services=services
        )
        self.util = SimpleNamespace(get_node_ip_address=lambda: interface)
        self.calls: list[tuple[str | None, bool, dict[str, Any]]] = []

    def init(self, address: str | None = None, **kwargs: Any) -> None:
        kept = not self._private.ray_constants.ENABLE_RAY_CLUSTER
        self.calls.append((address, kept, kwargs))


@pytest.mark.parametrize(
    ("address", "parts"),
    [
        ("10.0.0.5:6379", ("10.0.0.5", 6379)),
        ("head.example:6379", ("head.example", 6379)),
        ("[::1]:6379", ("::1", 6379)),
        ("auto", None),
        ("local", None),
        ("ray://10.0.0.5:10001", None),
    ],
)
def test_split_address(address: str, parts: tuple[str, int] | None) -> None:
    assert split_address(address) == parts


@pytest.mark.parametrize("address", ["10.0.0.5", "10.0.0.5:", ":6379", "head:port"])
def test_an_address_without_a_port_is_one_clear_error(address: str) -> None:
    with pytest.raises(RayClusterUnreachableError, match="is not host:port"):
        split_address(address)


def test_a_cluster_on_loopback_only_is_joined_on_loopback() -> None:
    # The machine's interface (127.0.0.2 stands for it here) does not answer: Ray must keep 127.0.0.1.
    ray = FakeRay(interface="127.0.0.2")
    with listening("127.0.0.1") as port:
        join_ray(ray, f"127.0.0.1:{port}", log_to_driver=False)
    assert ray.calls == [(f"127.0.0.1:{port}", True, {"log_to_driver": False})]
    assert ray._private.ray_constants.ENABLE_RAY_CLUSTER is True  # restored after init


def test_a_cluster_on_the_interface_is_left_to_ray() -> None:
    # It answers at the interface too (bound to every address): Ray's own rewrite of 127.0.0.1 works.
    ray = FakeRay(interface="127.0.0.2")
    with listening("0.0.0.0") as port:
        join_ray(ray, f"localhost:{port}")
        join_ray(ray, f"127.0.0.2:{port}")
    assert ray.calls == [(f"localhost:{port}", False, {}), (f"127.0.0.2:{port}", False, {})]


def test_ray_own_addresses_pass_through_and_a_new_local_instance_keeps_to_loopback() -> None:
    ray = FakeRay(interface="127.0.0.2")
    for address in (None, "local", "auto", "ray://127.0.0.1:1"):
        join_ray(ray, address)
    # None and local start an instance here (no cluster to join): on loopback only
    assert [c[:2] for c in ray.calls] == [
        (None, True),
        ("local", True),
        ("auto", False),
        ("ray://127.0.0.1:1", False),
    ]
    # a cluster started with `ray start` on this machine: None joins it, Ray's own way
    running = FakeRay(interface="127.0.0.2", running="127.0.0.2:6379")
    join_ray(running, None)
    join_ray(running, "local")
    assert [c[:2] for c in running.calls] == [(None, False), ("local", True)]


def test_nobody_answering_fails_at_once() -> None:
    ray = FakeRay(interface="127.0.0.2")
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(RayClusterUnreachableError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        join_ray(ray, f"127.0.0.1:{port}")
    with pytest.raises(RayClusterUnreachableError, match="ray start --head"):
        join_ray(ray, f"127.0.0.2:{port}")
    assert not ray.calls and time.monotonic() - t0 < 30


@pytest.mark.skipif(sys.platform == "win32", reason="loopback addresses")
def test_ingest_with_an_address_nobody_answers_at_is_one_line(
    tmp_path: Path, tiny_checkpoint: Path, corpus: Path
) -> None:
    require_module("ray", reason="the ray extra is not installed")
    port = free_port()
    done = run_module(
        "bgem3_qdrant", "ingest", str(corpus), "--path", str(tmp_path / "store"),
        "--model", str(tiny_checkpoint), "--engine", "ray", "--ray-address", f"127.0.0.1:{port}",
    )  # fmt: skip
    assert_clean_failure(done, 1, f"no Ray cluster answers at 127.0.0.1:{port} (--ray-address)")
