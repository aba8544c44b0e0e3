"""The server hands freed heap pages back to the system: under traffic at most every 10 s, and once when the
batcher goes idle after work (serve/memory.py, serve/batcher.py). glibc's own `malloc_trim` is checked to
return the pages a burst freed; the batcher's use of it is checked with a counting trim function."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np
import pytest

from bgem3_embeddings.serve.batcher import IDLE_TRIM_S, Batcher
from bgem3_embeddings.serve.memory import HeapTrimmer
from bgem3_embeddings.serve.settings import ServeSettings


class CountingEncoder:
    """Answers `encode_token_ids` with one dense row per text (its length), counting calls."""

    def __init__(self) -> None:
        self.calls = 0

    def encode_token_ids(
        self, token_ids: list[list[int]], batch_size: Any, **outputs: bool
    ) -> dict[str, Any]:
        self.calls += 1
        return {
            "dense_vecs": np.array([[float(len(ids))] for ids in token_ids]),
            "lexical_weights": None,
            "colbert_vecs": None,
        }


class CountingTrim:
    """Stands in for glibc's `malloc_trim`: records when it was called."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.pads: list[int] = []

    def __call__(self, pad: int) -> int:
        self.times.append(time.monotonic())
        self.pads.append(pad)
        return 1

    def __len__(self) -> int:
        return len(self.times)

    def __getitem__(self, n: int) -> float:
        return self.times[n]


def _wait_until(condition: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_the_batcher_trims_once_when_it_goes_idle_after_work() -> None:
    trims = CountingTrim()
    trimmer = HeapTrimmer(every_s=3600, trim=trims)
    batcher = Batcher(CountingEncoder(), ServeSettings(), trimmer=trimmer)
    batcher.start()

    async def one(ids: list[list[int]]) -> dict[str, Any]:
        return await batcher.submit(ids, (True, False, False))

    try:
        # The first call trims at once (the 10 s interval starts there); nothing else is due for an hour.
        first = asyncio.run(one([[1, 2, 3]]))
        assert first["dense_vecs"].tolist() == [[3.0]]
        assert _wait_until(lambda: len(trims) == 1, 5)
        time.sleep(2 * IDLE_TRIM_S)
        assert len(trims) == 1  # already trimmed after that work: idle adds nothing
        done = time.monotonic()
        second = asyncio.run(one([[1, 2], [4, 5, 6, 7]]))
        assert second["dense_vecs"].tolist() == [[2.0], [4.0]]
        # within the hour, so only the idle trim can hand the second call's pages back
        assert _wait_until(lambda: len(trims) == 2, 5 + IDLE_TRIM_S), trims.times
        assert trims[1] - done >= IDLE_TRIM_S * 0.9
        time.sleep(3 * IDLE_TRIM_S)
        assert len(trims) == 2  # idle without work: no more trims
        assert not trimmer.pending
    finally:
        batcher.stop(5)
    assert not batcher.running


def test_a_request_during_the_idle_wait_is_served_at_once() -> None:
    """The idle wait is a timed wait on the queue's condition: a request arriving in it does not wait out
    IDLE_TRIM_S, and the trim is put off until the batcher is idle again."""
    trims = CountingTrim()
    trimmer = HeapTrimmer(every_s=3600, trim=trims)
    batcher = Batcher(CountingEncoder(), ServeSettings(), trimmer=trimmer)
    batcher.start()

    async def burst() -> list[float]:
        seconds = []
        for n in range(4):
            t0 = time.perf_counter()
            await batcher.submit([[1] * (n + 1)], (True, False, False))
            seconds.append(time.perf_counter() - t0)
            await asyncio.sleep(IDLE_TRIM_S / 4)
        return seconds

    try:
        seconds = asyncio.run(burst())
        assert max(seconds) < IDLE_TRIM_S / 2, seconds
        assert len(trims) == 1  # the first call's; the burst never left the batcher idle for IDLE_TRIM_S
        assert _wait_until(lambda: len(trims) == 2, 5 + IDLE_TRIM_S)
    finally:
        batcher.stop(5)


def test_heap_trimmer_idle_trim_only_after_work() -> None:
    trim = CountingTrim()
    calls = trim.pads
    trimmer = HeapTrimmer(every_s=10, trim=trim)
    assert trimmer.available and not trimmer.pending
    assert not trimmer.trim_idle(0.0)  # nothing ran yet
    trimmer.note_work()
    assert trimmer.pending and trimmer.trim_idle(1.0) and calls == [0]
    assert not trimmer.trim_idle(2.0)
    trimmer.note_work()
    assert trimmer.maybe_trim(20.0) and not trimmer.pending  # a traffic trim covers the work too
    assert not trimmer.trim_idle(21.0) and calls == [0, 0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_an_idle_trim_hands_a_bursts_freed_pages_back() -> None:
    """With glibc: 200 MB of small blocks freed behind one block still in use stay resident (glibc can only
    shrink the heap from its top), and the idle trim hands them back (in a fresh process)."""
    script = textwrap.dedent(
        """
        import ctypes, re
        from pathlib import Path
        from bgem3_embeddings.serve.memory import HeapTrimmer

        def rss_mb():
            status = Path("/proc/self/status").read_text()
            return int(re.search(r"VmRSS:\\s+(\\d+)", status).group(1)) / 1024

        libc = ctypes.CDLL("libc.so.6")
        libc.malloc.restype = ctypes.c_void_p
        libc.malloc.argtypes = [ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        trimmer = HeapTrimmer(every_s=10)
        assert trimmer.available
        base = rss_mb()
        blocks = [libc.malloc(4000) for _ in range(50_000)]
        for b in blocks:
            ctypes.memset(b, 1, 4000)
        keep = libc.malloc(4000)  # pins the top of the heap
        peak = rss_mb()
        for b in blocks:
            libc.free(b)
        freed = rss_mb()
        trimmer.note_work()
        assert trimmer.trim_idle(0.0)
        print(f"{base:.1f} {peak:.1f} {freed:.1f} {rss_mb():.1f}")
        libc.free(keep)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    base, peak, freed, trimmed = map(float, done.stdout.split())
    assert peak - base > 150  # the burst was resident
    assert freed - base > 150  # free() alone kept it
    assert trimmed - base < 50, (base, peak, freed, trimmed)  # the idle trim handed it back


MMAP_SCRIPT = textwrap.dedent(
    """
    import ctypes, os, sys
    from bgem3_embeddings.serve.memory import fix_mmap_threshold

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                    "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallinfo2.restype = MallInfo2
    done = fix_mmap_threshold(int(sys.argv[1]))
    libc.free(libc.malloc(8 << 20))  # glibc's own rule slides its threshold up to 8 MiB here
    before = libc.mallinfo2().hblks
    block = libc.malloc(2 << 20)
    # whether the 2 MiB block got its own mapping, and what the processes of --workers would inherit
    print(done, libc.mallinfo2().hblks - before, os.environ.get("MALLOC_MMAP_THRESHOLD_", "-"))
    libc.free(block)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and mallinfo2")
@pytest.mark.parametrize(("threshold", "expected"), [(1 << 20, "set 1 1048576"), (0, "off 0 -")])
def test_a_fixed_mmap_threshold_keeps_large_blocks_out_of_the_heap(threshold: int, expected: str) -> None:
    """After a large block is freed, glibc's default cuts the next 2 MiB block from the heap (where it can
    leave a hole); with the threshold fixed at 1 MiB (`bgem3 serve --malloc-mmap-threshold 1048576`) it is
    mapped on its own. In fresh processes: the setting is process-wide."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    command = [sys.executable, "-c", MMAP_SCRIPT, str(threshold)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == expected.split(), done.stdout


def test_a_threshold_the_user_set_wins() -> None:
    from bgem3_embeddings.serve.memory import fix_mmap_threshold

    env = {"MALLOC_MMAP_THRESHOLD_": "65536"}
    assert fix_mmap_threshold(1 << 20, env) == "kept-env"
    assert env == {"MALLOC_MMAP_THRESHOLD_": "65536"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim, /proc")
def test_the_system_allocator_lets_the_trim_reach_onednns_buffers() -> None:
    """What docs/design/serve-memory.md says of TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1: TensorFlow's own pool for
    oneDNN keeps what a burst of matmuls took, out of the trim's reach; with the variable set the same work
    leaves little resident after a trim (fresh processes: TensorFlow reads it once)."""
    script = textwrap.dedent(
        """
        import re, sys
        from pathlib import Path
        from bgem3_embeddings.serve.memory import HeapTrimmer
        from bgem3_embeddings.cli_support import start_tensorflow_quietly
        start_tensorflow_quietly()
        import tensorflow as tf

        def rss_mb():
            status = Path("/proc/self/status").read_text()
            return int(re.search(r"VmRSS:\\s+(\\d+)", status).group(1)) / 1024

        weights = tf.random.normal((1024, 1024))
        base = rss_mb()
        for rows in (1024, 2048, 4096):
            x = tf.random.normal((rows, 1024))
            _ = tf.matmul(tf.nn.gelu(tf.matmul(x, weights)), weights).numpy()
            del x, _
        trimmer = HeapTrimmer(every_s=10)
        trimmer.note_work()
        trimmer.trim_idle(0.0)
        print(f"{rss_mb() - base:.1f}")
        """
    )

    def kept_mb(mode: str) -> float:
        env = {k: v for k, v in os.environ.items() if k != "TF_ONEDNN_USE_SYSTEM_ALLOCATOR"}
        if mode == "malloc":
            env["TF_ONEDNN_USE_SYSTEM_ALLOCATOR"] = "1"
        done = subprocess.run(
            [sys.executable, "-c", script, mode], capture_output=True, text=True, timeout=300, env=env
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return float(done.stdout.split()[-1])

    pool, malloc = kept_mb("pool"), kept_mb("malloc")
    assert pool > 60, (pool, malloc)  # the pool kept the burst's buffers
    assert malloc < pool / 2, (pool, malloc)


def test_without_glibc_the_threshold_says_unsupported(monkeypatch: pytest.MonkeyPatch) -> None:
    """macOS, musl: nothing to set, and the caller is told (bgem3 serve prints that the option is ignored);
    the environment is left alone."""
    from bgem3_embeddings.serve import memory

    monkeypatch.setattr(memory, "_libc_function", lambda name: None)
    env: dict[str, str] = {}
    assert memory.fix_mmap_threshold(1 << 20, env) == "unsupported"
    assert env == {}
