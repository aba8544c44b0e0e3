"""A server command (`bgem3 serve`, `bgem3-qdrant ui`) started as a user starts it, connected to the moment it
prints its address: no retry, no polling, so a command that prints before it listens fails the test with
"connection refused".

    with started_command(["-m", "bgem3_embeddings.cli", "serve", ...], "stderr") as (proc, url, output):
        httpx.get(url + "/health")
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from tests.support import user_env

ADDRESS = re.compile(r"(http://(?:\[[0-9a-f:]+\]|[\w.-]+):\d+)")
START_TIMEOUT_S = 240  # TensorFlow's import and the model's warm-up on a loaded 2-core machine


@contextmanager
def started_command(
    args: list[str], stream: str, env: dict[str, str] | None = None, first_path: str = "/"
) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """`python ARGS` in a user's environment plus `env`; reads `stream` ("stdout" or "stderr") up to the line
    with the address, then GETs `first_path` at once (one attempt; it may wait while the model warms up).
    Yields the process, the printed base URL and the output lines so far (filled on by a thread)."""
    proc = subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=user_env(env)
    )
    lines: list[str] = []
    try:
        source = proc.stdout if stream == "stdout" else proc.stderr
        other = proc.stderr if stream == "stdout" else proc.stdout
        assert source is not None and other is not None
        threading.Thread(target=lambda: lines.extend(other), daemon=True).start()
        url = None
        for line in source:
            lines.append(line)
            found = ADDRESS.search(line)
            if found:
                url = found.group(1)
                break
        assert url is not None, f"no address printed; exit {proc.wait(30)}:\n{''.join(lines)}"
        threading.Thread(target=lambda: lines.extend(source), daemon=True).start()
        try:
            first = httpx.get(url + first_path, timeout=START_TIMEOUT_S)
        except httpx.ConnectError as err:  # printed before listening
            raise AssertionError(f"{url} printed but refused the connection: {err}") from err
        assert first.status_code == 200, first.text
        yield proc, url, lines
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
