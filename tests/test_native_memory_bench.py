"""benchmarks/findings/native_memory_shapes.py: random batch shapes; RSS and glibc's bytes in use after each
trim."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim / mallinfo2")
def test_bench_prints_memory_after_each_trim_and_the_slopes(tiny_checkpoint: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "findings" / "native_memory_shapes.py"), "--model",
         str(tiny_checkpoint), "--calls", "600", "--settled-after", "200"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines() if re.fullmatch(r"\s*\d+( +[\d.]+){3}", line)]
    assert [int(r[0]) for r in rows] == list(range(200, 601, 200))  # one row per 200 calls (a trim)
    rss, in_use = [float(r[1]) for r in rows], [float(r[2]) for r in rows]
    assert all(r > 100 for r in rss) and all(0 < u < r for u, r in zip(in_use, rss, strict=True))
    slopes = r"after 200 calls: VmRSS [\d.]+-[\d.]+ MB, slope [+-][\d.]+ MB per 10,000 calls; in use"
    assert re.search(slopes, done.stdout), done.stdout
