"""Running the app under uvicorn: the listening socket, graceful SIGTERM, one process or N workers.

The socket is bound before the model loads, so a port in use is reported at once, in one line; it listens
(`start_listening`) before the command prints its address, so a client that connects the moment it reads
the address waits in the kernel's queue until the server accepts, instead of being refused. SIGTERM
stops accepting connections, lets the requests in flight finish, stops the batcher and exits 0 (uvicorn
itself re-raises the signal after its graceful shutdown, which would end the process "killed by SIGTERM").
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import threading
from collections.abc import Generator, Iterator
from typing import Any

import uvicorn
from uvicorn.supervisors import Multiprocess

from bgem3_embeddings.cli_support import CommandError
from bgem3_embeddings.serve.app import CONFIG_ENV

logger = logging.getLogger(__name__)
FACTORY = "bgem3_embeddings.serve.app:create_app_from_env"
# A worker loads its model before it answers uvicorn's health ping; 5 s (uvicorn's default) is too short.
WORKER_START_TIMEOUT_S = 600
BACKLOG = 2048  # uvicorn's own default backlog


def display_url(host: str, port: int) -> str:
    """The address a command prints: http://HOST:PORT, an IPv6 address in brackets."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}"


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port), or a CommandError that says what to change."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise CommandError(
            f"cannot resolve host {host!r} ({err.strerror}) (--host): give an IP address"
        ) from err
    family, _, _, _, address = infos[0]
    # IPPROTO_TCP stated explicitly: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets
    # whose proto says TCP, and with it on a keep-alive client waits ~40 ms per response (delayed ACK).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise CommandError(
                f"port {port} on {host} is in use (--port): stop the process that holds it or choose "
                "another port"
            ) from err
        if err.errno == errno.EACCES:
            raise CommandError(
                f"no permission to listen on port {port} (--port): use a port above 1023"
            ) from err
        if err.errno == errno.EADDRNOTAVAIL:
            raise CommandError(
                f"{host} is not an address of this machine (--host): use 127.0.0.1, 0.0.0.0 or one of its "
                "addresses"
            ) from err
        raise CommandError(f"cannot listen on {host}:{port}: {err.strerror} (--host/--port)") from err
    sock.set_inheritable(True)  # handed to the worker processes with --workers
    return sock


def start_listening(sock: socket.socket) -> None:
    """Accept connections into the kernel's queue from now on (uvicorn answers them once it has started).

    Call it before printing the address: until listen() a connection to a bound port is refused."""
    sock.listen(BACKLOG)


class GracefulServer(uvicorn.Server):
    """uvicorn's Server; a SIGTERM it shut down on gracefully ends the process with exit status 0."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():
            try:
                yield
            finally:
                # uvicorn re-raises each captured signal once its own handlers are gone; SIGTERM has been
                # handled (requests finished, model released), so it is not raised again. SIGINT still is.
                captured = getattr(self, "_captured_signals", None)
                if isinstance(captured, list):
                    captured[:] = [s for s in captured if s != signal.SIGTERM]


def _config(app: Any, log_level: str, **kwargs: Any) -> uvicorn.Config:
    # timeout_graceful_shutdown None: requests in flight are always allowed to finish.
    return uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=None, **kwargs)


def serve_app(app: Any, sock: socket.socket, log_level: str = "info") -> None:
    """Serve `app` on the bound socket until SIGTERM / SIGINT."""
    server = GracefulServer(_config(app, log_level))
    server.run(sockets=[sock])
    if not server.started:
        raise CommandError("the server stopped before it started: see the log lines above")


def serve_workers(config_json: str, sock: socket.socket, workers: int, log_level: str = "info") -> None:
    """N worker processes on one socket, each loading its own model (`create_app_from_env`)."""
    os.environ[CONFIG_ENV] = config_json  # spawned workers inherit it
    config = _config(
        FACTORY, log_level, factory=True, workers=workers, timeout_worker_healthcheck=WORKER_START_TIMEOUT_S
    )
    Multiprocess(config, sockets=[sock]).run()


@contextlib.contextmanager
def serve_in_thread(
    app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
) -> Iterator[str]:
    """Run `app` on a background thread (tests, benchmarks); yields its base URL, stops on exit."""
    sock = bind_socket(host, port)
    server = uvicorn.Server(_config(app, log_level))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the server thread stopped before it started")
            thread.join(0.02)
        bound_host, bound_port = sock.getsockname()[:2]
        yield f"http://{bound_host}:{bound_port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
