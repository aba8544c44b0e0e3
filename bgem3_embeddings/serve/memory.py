"""Hand freed heap memory back to the system (glibc's `malloc_trim`), for a process that runs for days.

Requests of every length leave the C heap fragmented: TensorFlow and oneDNN allocate and free buffers of
each batch's shape, and glibc keeps the freed pages mapped, so a server's resident memory creeps up long
after its caches have filled (docs/serve.md#memory-under-sustained-traffic). `malloc_trim(0)` returns the
free pages inside the heaps too (madvise), in a few milliseconds. Elsewhere (macOS, musl) it is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from collections.abc import Callable

logger = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
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
