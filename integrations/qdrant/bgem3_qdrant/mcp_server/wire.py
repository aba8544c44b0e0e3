"""stdout kept for the protocol: over stdio, fd 1 carries JSON-RPC messages and nothing else."""

from __future__ import annotations

import io
import os
from typing import Any


class ProtocolStdout:
    """fd 1 kept for the protocol alone: a duplicate of it carries the messages, and fd 1 itself points at
    stderr from the start, so nothing else (a library's print, TensorFlow's C++ log, a progress bar) can
    reach the client's stdout, not even while the model loads before the transport starts."""

    def __init__(self) -> None:
        self.fd = os.dup(1)
        os.dup2(2, 1)

    def stream(self) -> Any:
        """The protocol's stdout as the SDK's stdio transport takes it (an anyio text file)."""
        import anyio

        raw = os.fdopen(self.fd, "wb", closefd=True)
        return anyio.wrap_file(io.TextIOWrapper(raw, encoding="utf-8", newline="\n"))
