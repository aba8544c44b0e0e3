"""benchmarks/startup.py times a fresh process's import, construction and first vectors, warm or cold."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import load_benchmark

startup = load_benchmark("startup")


def test_startup_bench_times_each_step_in_a_fresh_process(tiny_checkpoint: Path) -> None:
    results = startup.main([str(tiny_checkpoint), "--runs", "1"])
    assert len(results) == 1
    assert set(results[0]) == set(startup.STEPS)
    assert all(results[0][step] > 0 for step in startup.STEPS), results


def test_cold_runs_need_a_writable_drop_caches(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "drop_caches"
    with pytest.raises(startup.StartupError, match="--cold needs root"):
        startup.drop_page_cache(missing)
    writable = tmp_path / "drop_caches"  # stands in for /proc/sys/vm/drop_caches
    startup.drop_page_cache(writable)
    assert writable.read_text() == "3\n"
