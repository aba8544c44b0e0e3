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
    """Calls `malloc_trim(0)` at most once per `every_s` seconds (`maybe_trim(now)`)."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._trim = _malloc_trim()
        self._last = float("-inf")

    @property
    def available(self) -> bool:
        return self._trim is not None

    def maybe_trim(self, now: float) -> bool:
        """Trim if `every_s` has passed since the last trim; whether it trimmed."""
        if self._trim is None or now - self._last < self.every_s:
            return False
        self._last = now
        self._trim(0)
        return True
