"""The long-running servers fix glibc's mmap threshold at 1 MiB by default (a 2-hour soak: +0.25 MB per 10
minutes against +1.39 with glibc's sliding default, at 0.988x passage throughput; docs/performance/serve.md),
and `--malloc-mmap-threshold 0` keeps glibc's default: `bgem3 serve`, `bgem3-qdrant mcp` over HTTP and
`bgem3-qdrant ui`, each started as a user starts it. That the setting keeps large blocks out of the heap is
tests/test_serve_memory.py's check; here, that each server applies it (the line it prints comes from
`fix_mmap_threshold`'s answer: "set" only when glibc's mallopt accepted it)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bgem3_embeddings.serve.memory import _libc_function
from tests.optional import require_module
from tests.support import tiny_server

FIXED = "glibc's mmap threshold fixed at 1 MiB so memory stays flat over weeks"
START_TIMEOUT_S = 240

pytestmark = pytest.mark.skipif(_libc_function("mallopt") is None, reason="glibc's mallopt (Linux) only")


def started_output(args: list[str], ready: str) -> str:
    """`python ARGS` until its output (stdout and stderr) matches `ready`, then stopped: all it printed."""
    proc = subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while not re.search(ready, "".join(lines)):
            assert proc.poll() is None, f"exited {proc.returncode}:\n{''.join(lines)}"
            assert time.monotonic() < deadline, f"no {ready!r} in {START_TIMEOUT_S} s:\n{''.join(lines)}"
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        reader.join(timeout=10)
    return "".join(lines)


@pytest.fixture(scope="module")
def encoder_url(tiny_checkpoint: Path) -> Iterator[str]:
    """A tiny `bgem3 serve` app in this process: mcp and ui encode through it (no model of their own)."""
    with tiny_server(tiny_checkpoint) as url:
        yield url


@pytest.mark.parametrize("threshold", [None, "0"])
def test_bgem3_serve(tiny_checkpoint: Path, threshold: str | None) -> None:
    extra = [] if threshold is None else ["--malloc-mmap-threshold", threshold]
    # the --precision auto line comes after the threshold is applied and before the model loads
    out = started_output(
        ["-m", "bgem3_embeddings.cli", "serve", "--model", str(tiny_checkpoint), "--port", "0", *extra],
        r"--precision auto: ",
    )
    assert (f"bgem3 serve: {FIXED}" in out) == (threshold is None), out


@pytest.mark.parametrize("threshold", [None, "0"])
def test_bgem3_qdrant_mcp_over_http(encoder_url: str, tmp_path: Path, threshold: str | None) -> None:
    require_module("bgem3_qdrant")
    require_module("mcp", reason="the mcp extra")
    extra = [] if threshold is None else ["--malloc-mmap-threshold", threshold]
    args = ["-m", "bgem3_qdrant", "mcp", "--transport", "streamable-http", "--port", "0"]
    args += ["--path", str(tmp_path), "--encoder-url", encoder_url, *extra]
    out = started_output(args, r"http://127\.0\.0\.1:\d+/mcp")
    assert (f"bgem3-qdrant mcp: {FIXED}" in out) == (threshold is None), out


def test_bgem3_qdrant_mcp_over_stdio_leaves_glibc_alone(encoder_url: str, tmp_path: Path) -> None:
    """stdio lives as long as its client's session: no threshold, nothing on stderr about it."""
    require_module("bgem3_qdrant")
    require_module("mcp", reason="the mcp extra")
    args = ["-m", "bgem3_qdrant", "mcp", "--path", str(tmp_path), "--encoder-url", encoder_url]
    done = subprocess.run(
        [sys.executable, *args], input="", capture_output=True, text=True, timeout=START_TIMEOUT_S
    )
    assert "mmap threshold" not in done.stderr, done.stderr


@pytest.mark.parametrize("threshold", [None, "0"])
def test_bgem3_qdrant_ui(encoder_url: str, tmp_path: Path, threshold: str | None) -> None:
    require_module("bgem3_qdrant")
    extra = [] if threshold is None else ["--malloc-mmap-threshold", threshold]
    args = ["-m", "bgem3_qdrant", "ui", "--port", "0", "--path", str(tmp_path), "--encoder-url", encoder_url]
    out = started_output([*args, *extra], r"bgem3-qdrant ui: http://127\.0\.0\.1:\d+/")
    assert (f"bgem3-qdrant ui: {FIXED}" in out) == (threshold is None), out
