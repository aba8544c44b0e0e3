"""Keep a long-running process's C heap small: hand freed pages back (glibc's `malloc_trim`), and, when asked,
fix glibc's mmap threshold so large blocks never leave holes in the heap (`fix_mmap_threshold`; the servers
do it by default: `long_run_heap`).

Requests of every length leave the C heap fragmented: TensorFlow and oneDNN allocate and free buffers of
each batch's shape, and glibc keeps the freed pages mapped, so a server's resident memory creeps up long
after its caches have filled (docs/serve-operations.md#memory-under-sustained-traffic). `malloc_trim(0)`
returns the free pages inside the heaps too (madvise), in a few milliseconds. Elsewhere (macOS, musl) it
is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from collections.abc import Callable, MutableMapping
from typing import Any

logger = logging.getLogger(__name__)


def _libc_function(name: str) -> Any:
    """glibc's `name` through ctypes, or None off Linux or where the C library has none (musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return getattr(libc, name)
    except (OSError, AttributeError):  # not glibc
        return None


def _malloc_trim() -> Callable[[int], int] | None:
    trim = _libc_function("malloc_trim")
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class HeapTrimmer:
    """Calls `malloc_trim(0)` at most once per `every_s` seconds under traffic (`maybe_trim(now)`), and once
    when the process goes idle after work (`trim_idle()`), so the pages a burst freed do not stay with an
    idle server until its next request. `trim` replaces glibc's function (tests count the calls)."""

    def __init__(self, every_s: float, trim: Callable[[int], int] | None = None) -> None:
        self.every_s = every_s
        self._trim = trim if trim is not None else _malloc_trim()
        self._last = float("-inf")
        self._dirty = False  # work has run since the last trim

    @property
    def available(self) -> bool:
        return self._trim is not None

    @property
    def pending(self) -> bool:
        """Work has run since the last trim: an idle trim would hand pages back."""
        return self._trim is not None and self._dirty

    def note_work(self) -> None:
        """Work ran (and freed its buffers): the next idle moment should trim."""
        self._dirty = True

    def maybe_trim(self, now: float) -> bool:
        """Trim if `every_s` has passed since the last trim; whether it trimmed."""
        if self._trim is None or now - self._last < self.every_s:
            return False
        self._run(now)
        return True

    def trim_idle(self, now: float) -> bool:
        """Trim once after work, whenever called (the caller has seen no work for a while); whether it did."""
        if not self.pending:
            return False
        self._run(now)
        return True

    def _run(self, now: float) -> None:
        assert self._trim is not None
        self._last = now
        self._dirty = False
        self._trim(0)


# glibc reads MALLOC_MMAP_THRESHOLD_ when a process starts; mallopt(M_MMAP_THRESHOLD, n) makes the same
# setting from inside a running one. Both also turn off glibc's sliding threshold.
MMAP_THRESHOLD_ENV = "MALLOC_MMAP_THRESHOLD_"
M_MMAP_THRESHOLD = -3
# The servers' default (serve, bgem3-qdrant mcp over HTTP, bgem3-qdrant ui): a 2-hour soak grew +0.25 MB per
# 10 minutes with it against +1.39 with glibc's sliding default, at 0.988x passage throughput
# (docs/performance/serve.md).
LONG_RUN_MMAP_THRESHOLD = 1 << 20
MAX_MMAP_THRESHOLD = 32 << 20  # glibc's ceiling on 64-bit (HEAP_MAX_SIZE / 2); mallopt refuses more


def fix_mmap_threshold(nbytes: int, environ: MutableMapping[str, str] | None = None) -> str:
    """From now on, let glibc map every block of `nbytes` or more on its own (and unmap it when freed).

    glibc's default threshold slides up (to 32 MiB) each time a large mapped block is freed, so later
    large blocks are cut from the heaps and leave holes there: the slow creep of a server's memory under
    traffic (docs/serve-operations.md#memory-under-sustained-traffic). The value is also put in the
    environment, so the processes of `--workers` start with it. A value the user gave in
    MALLOC_MMAP_THRESHOLD_ wins; 0 keeps glibc's default. Returns what happened: "set", "kept-env", "off" or
    "unsupported" (not glibc).

        >>> fix_mmap_threshold(0)
        'off'
    """
    env = os.environ if environ is None else environ
    if nbytes <= 0:
        return "off"
    if env.get(MMAP_THRESHOLD_ENV):
        return "kept-env"
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return "unsupported"
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, int(nbytes)) != 1:
        return "unsupported"
    env[MMAP_THRESHOLD_ENV] = str(int(nbytes))
    return "set"


def long_run_heap(nbytes: int, command: str, environ: MutableMapping[str, str] | None = None) -> str | None:
    """A server's `--malloc-mmap-threshold` (default LONG_RUN_MMAP_THRESHOLD) applied, as the start-up line
    that says what it did; None when there is nothing to say (0, or the user's MALLOC_MMAP_THRESHOLD_).

        >>> long_run_heap(0, "bgem3 serve") is None
        True
    """
    done = fix_mmap_threshold(nbytes, environ)
    if done == "set":
        size = f"{nbytes >> 20} MiB" if nbytes % (1 << 20) == 0 else f"{nbytes} bytes"
        return (
            f"{command}: glibc's mmap threshold fixed at {size} so memory stays flat over weeks (about 1% "
            "slower on passages; --malloc-mmap-threshold 0 keeps glibc's default)"
        )
    if done == "unsupported":
        return (
            f"{command}: --malloc-mmap-threshold is a glibc setting and this C library is not glibc "
            "(macOS, musl): memory is left to it"
        )
    return None
