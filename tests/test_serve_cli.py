"""`bgem3 serve` as a process: graceful SIGTERM with a request in flight, `--workers`, one-line errors."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.optional import require_module

require_module("fastapi", reason="the server needs the serve extra")

from bgem3_embeddings.cli_support import CommandError  # noqa: E402
from tests.support import ReferenceM3, assert_clean_failure, clone_pip_install, run_module  # noqa: E402
from tests.tolerances import UNIT_VECTORS  # noqa: E402

START_TIMEOUT_S = 180


@contextlib.contextmanager
def server_process(tmp_path: Path, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`bgem3 serve --port 0 ARGS` in a fresh process; yields it and its URL once /health says ok."""
    log = tmp_path / f"serve-{time.monotonic_ns()}.log"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bgem3_embeddings.cli",
                "serve",
                "--port",
                "0",
                "--log-level",
                "warning",
                *args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env=env,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        url = None
        while url is None:
            found = re.search(r"on (http://127\.0\.0\.1:\d+)", log.read_text(errors="replace"))
            url = found.group(1) if found else None
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_finishes_the_request_in_flight_and_exits_0(tiny_checkpoint: Path, tmp_path: Path) -> None:
    reference = ReferenceM3(tiny_checkpoint)
    # Every encoder call waits 1.5 s for company: the request is surely in flight when SIGTERM comes.
    args = ("--model", str(tiny_checkpoint), "--precision", "float32", "--batch-wait-ms", "1500")
    with server_process(tmp_path, *args) as (proc, url):
        answer: dict[str, Any] = {}

        def send() -> None:
            answer["r"] = httpx.post(f"{url}/v1/embeddings", json={"input": ["in flight"]}, timeout=60)

        thread = threading.Thread(target=send)
        thread.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        thread.join(60)
        assert proc.wait(60) == 0
    response = answer["r"]
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(
        response.json()["data"][0]["embedding"],
        reference.encode(["in flight"])["dense_vecs"][0],
        **UNIT_VECTORS,
    )


def test_workers_each_serve_the_same_model(tiny_checkpoint: Path, tmp_path: Path) -> None:
    reference = ReferenceM3(tiny_checkpoint)
    texts = [f"worker text {i}" for i in range(8)]
    args = ("--model", str(tiny_checkpoint), "--precision", "float32",  # the reference's
            "--workers", "2", "--malloc-mmap-threshold", "1048576")  # fmt: skip
    with server_process(tmp_path, *args) as (proc, url):
        # one connection per request: the kernel spreads them over both workers' accept queues
        answers = [httpx.post(f"{url}/embed", json={"inputs": [t]}, timeout=60) for t in texts]
        if sys.platform.startswith("linux"):  # the workers start with glibc's threshold fixed (memory.py)
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            environs = [Path(f"/proc/{c}/environ").read_bytes().split(b"\0") for c in children]
            fixed = [e for e in environs if b"MALLOC_MMAP_THRESHOLD_=1048576" in e]
            assert len(fixed) >= 2, (children, [e[-3:] for e in environs])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    want = reference.encode(texts)["dense_vecs"]
    for i, r in enumerate(answers):
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()[0], want[i], **UNIT_VECTORS)


def test_binding_beyond_loopback_needs_a_key(tiny_checkpoint: Path) -> None:
    done = run_module("bgem3_embeddings.cli", "serve", "--host", "0.0.0.0", "--model", str(tiny_checkpoint))
    assert_clean_failure(done, 1, "(--host)", "--api-key", "--insecure-no-auth")


def test_port_in_use_is_one_line(tiny_checkpoint: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = run_module("bgem3_embeddings.cli", "serve", "--port", port, "--model", str(tiny_checkpoint))
    assert_clean_failure(done, 1, f"port {port}", "is in use (--port)")


def test_missing_model_is_one_line(tmp_path: Path) -> None:
    done = run_module("bgem3_embeddings.cli", "serve", "--port", "0", "--model", str(tmp_path / "nothing"))
    assert_clean_failure(done, 1, "nothing")


def test_missing_serve_extra_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from bgem3_embeddings.serve.cli import check_serve_extra

    monkeypatch.setitem(sys.modules, "fastapi", None)  # `import fastapi` now raises ImportError
    with pytest.raises(CommandError, match=re.escape(clone_pip_install(".", "serve"))):
        check_serve_extra()
