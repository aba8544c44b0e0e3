"""One lock per encoder object, shared by the integrations (bgem3_embeddings.concurrency)."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time

from bgem3_embeddings.concurrency import _LOCKS, encoder_lock


class FakeEncoder:
    pass


def test_one_lock_per_encoder() -> None:
    a, b = FakeEncoder(), FakeEncoder()
    assert encoder_lock(a) is encoder_lock(a)
    assert encoder_lock(a) is not encoder_lock(b)


def test_encoders_without_weak_references_share_the_fallback_lock() -> None:
    assert encoder_lock(1) is encoder_lock("x")  # ints and strs cannot be weakly referenced


def test_a_lock_lives_as_long_as_its_encoder() -> None:
    encoder = FakeEncoder()
    encoder_lock(encoder)
    gc.collect()  # earlier tests' encoders go first, so only this one can leave below
    before = len(_LOCKS)
    del encoder
    gc.collect()
    assert len(_LOCKS) == before - 1


def test_the_lock_serialises_threads() -> None:
    encoder, active, peak = FakeEncoder(), [0], [0]

    def call() -> None:
        with encoder_lock(encoder):
            active[0] += 1
            peak[0] = max(peak[0], active[0])
            time.sleep(0.01)
            active[0] -= 1

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 1


def test_importing_it_does_not_import_tensorflow() -> None:
    code = "import sys, bgem3_embeddings.concurrency; assert 'tensorflow' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
