"""The driver joining a Ray cluster (`--ray-address`): reachable first, then connected where the nodes listen.

Ray replaces a loopback host in the address it is given (127.0.0.1, localhost, ::1) with this machine's
interface address before connecting, so that the address can be handed on to other nodes
(ray-project/ray#1556, #59110). A cluster whose nodes advertise loopback (`ray start --node-ip-address
127.0.0.1`, every node of a one-machine test cluster) listens on loopback only, so that rewritten address
is refused and `ray.init` retries it for minutes. Here the driver checks where the cluster answers before
Ray is involved: at the rewritten address (a cluster on the interface, Ray's own path), else on loopback,
where Ray is told to keep it; and an address that answers nowhere is one clear error, not a hang. A new
local instance (no address, no cluster to join) is started on loopback too: on Linux Ray's servers would
otherwise listen on every interface of the machine.

    >>> ray = import_ray()                                # doctest: +SKIP
    >>> join_ray(ray, "127.0.0.1:6379")                   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

from ..errors import BGEM3QdrantError

logger = logging.getLogger(__name__)
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# Addresses Ray resolves itself (the last `ray start` on this machine, a fresh local instance, Ray Client).
SPECIAL_ADDRESSES = frozenset({"auto", "local"})
CONNECT_TIMEOUT_S = 5.0


class RayClusterUnreachableError(BGEM3QdrantError):
    """--ray-address names no Ray cluster this machine can reach."""


def split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of a `host:port` GCS address (IPv6 in brackets); None for the forms Ray resolves itself
    (auto, local, ray://...)."""
    if address in SPECIAL_ADDRESSES or "://" in address:
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise RayClusterUnreachableError(
            f"--ray-address {address!r} is not host:port: give the head's GCS address as `ray start --head` "
            "prints it (e.g. 10.0.0.5:6379), or auto for the cluster started on this machine"
        )
    return host.strip("[]"), int(port)


def answers(host: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> bool:
    """Whether something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def loopback_kept(ray: Any) -> Iterator[None]:
    """Ray keeps loopback addresses as they are while connecting (its behaviour on one-machine platforms,
    macOS and Windows, where `ray_constants.ENABLE_RAY_CLUSTER` is off)."""
    constants = ray._private.ray_constants
    if not hasattr(constants, "ENABLE_RAY_CLUSTER"):  # pragma: no cover - a Ray without the switch
        raise RayClusterUnreachableError(
            f"this Ray ({ray.__version__}) cannot be told to keep a loopback --ray-address: start the "
            "cluster on the machine's interface address (ray start --node-ip-address <ip>) and pass that"
        )
    before = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = before


def starts_a_local_instance(ray: Any, address: str | None) -> bool:
    """Whether `ray.init(address)` starts a new Ray instance on this machine: "local", or None with no
    cluster to join (RAY_ADDRESS unset, no `ray start` running here), decided as Ray decides it."""
    if address not in (None, "local"):
        return False
    services = getattr(getattr(ray, "_private", None), "services", None)
    canonical = getattr(services, "canonicalize_bootstrap_address", None)
    if canonical is None:  # pragma: no cover - a Ray without it: only "local" is known to start one
        return address == "local"
    return canonical(address) is None


def join_ray(ray: Any, address: str | None, **init_kwargs: Any) -> None:
    """`ray.init(address=address, **init_kwargs)`, reaching a cluster wherever its nodes listen.

    None, auto and local are Ray's own (a local instance); ray://host:port is Ray Client. A new local
    instance listens on loopback only. A host:port that accepts no connection raises
    RayClusterUnreachableError at once (Ray would retry it for minutes).
    """
    parts = None if address is None else split_address(address)
    if parts is None:
        if starts_a_local_instance(ray, address):
            # Ray's servers run whatever code reaches them; on Linux a fresh instance listens on every
            # interface. Kept on loopback (as Ray does on macOS and Windows), it is this machine's alone.
            with loopback_kept(ray):
                ray.init(address=address, **init_kwargs)
        else:
            ray.init(address=address, **init_kwargs)
        return
    host, port = parts
    if host not in LOOPBACK_HOSTS:
        if not answers(host, port):
            raise RayClusterUnreachableError(
                f"no Ray cluster answers at {address} (--ray-address): start its head with "
                "`ray start --head --port 6379` and pass the address it prints, or check the host, port "
                "and firewall"
            )
        ray.init(address=address, **init_kwargs)
        return
    # Loopback: where Ray would send it (this machine's interface) or, failing that, loopback itself.
    interface = ray.util.get_node_ip_address()
    if interface not in LOOPBACK_HOSTS and answers(interface, port):
        ray.init(address=address, **init_kwargs)
    elif answers(host, port):
        logger.info("the Ray cluster at %s listens on loopback only: joining it there", address)
        with loopback_kept(ray):
            ray.init(address=address, **init_kwargs)
    else:
        raise RayClusterUnreachableError(
            f"no Ray cluster answers at {address} (--ray-address) nor at {interface}:{port}: start one with "
            "`ray start --head --port 6379` (add --node-ip-address 127.0.0.1 to keep it on loopback)"
        )
