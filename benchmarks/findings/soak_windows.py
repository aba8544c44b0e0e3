"""Read `bgem3 bench-serve --soak ... --json FILE` reports: RSS per window and drift per span, side by side.

The soak's own report fits one line through every sample after its warm-up. A long run asks more: does the
growth slow down (the slope per hour), and is the error honest (RSS moves in a sawtooth, so successive
2-second samples are not independent: the slope is also fitted through 5-minute means, which are). For each
FILE this prints the 10-minute means of VmRSS, then for each span the least-squares slope in MB per 10
minutes with +/- two standard errors, from the samples and from 5-minute means (docs/design/serve-memory.md).

    python benchmarks/findings/soak_windows.py /tmp/soak-default.json /tmp/soak-mmap.json \
        --spans 300-7200,3600-7200
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from bgem3_embeddings.serve.soak import slope_with_error  # the soak report's own fit

WINDOW_S = 600
BLOCK_S = 300
NO_FIT = (float("nan"), float("nan"))


def load_samples(path: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    """(seconds, rss_mb) of the readable samples, and the whole report."""
    report = json.loads(path.read_text())
    rows = [(s["seconds"], s["rss_mb"]) for s in report["samples"] if s.get("rss_mb") is not None]
    if len(rows) < 3:
        raise SystemExit(f"{path}: fewer than 3 samples with a readable RSS")
    seconds, rss = np.array(rows, dtype=float).T
    return seconds, rss, report


def block_means(seconds: np.ndarray, rss: np.ndarray, start: float, stop: float, size: float) -> np.ndarray:
    """(centre, mean) of each full block of `size` seconds in [start, stop)."""
    edges = np.arange(start, stop - size + 1e-9, size)
    rows = []
    for a in edges:
        inside = (seconds >= a) & (seconds < a + size)
        if inside.any():
            rows.append((a + size / 2, rss[inside].mean()))
    return np.array(rows).reshape(-1, 2)


def parse_spans(text: str) -> list[tuple[float, float]]:
    spans = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        spans.append((float(lo), float(hi)))
    return spans


def describe(path: Path, spans: list[tuple[float, float]]) -> list[str]:
    seconds, rss, report = load_samples(path)
    lines = [
        f"{path}: {report.get('requests', '?')} requests, {report.get('unexpected', '?')} unexpected, "
        f"exit {report.get('exit_code', '?')}, {len(seconds)} samples over {seconds.max():.0f} s",
        "10-minute means (MB): "
        + ", ".join(
            f"{c / 60:.0f} min {m:.1f}" for c, m in block_means(seconds, rss, 0, seconds.max() + 1, WINDOW_S)
        ),
        f"{'span (s)':>12} {'samples: MB/10 min':>22} {'5-min means: MB/10 min':>26}",
    ]
    for lo, hi in spans:
        inside = (seconds >= lo) & (seconds <= hi)
        s, se = slope_with_error(seconds[inside], rss[inside]) or NO_FIT
        blocks = block_means(seconds, rss, lo, hi, BLOCK_S)
        bs, bse = slope_with_error(blocks[:, 0], blocks[:, 1]) or NO_FIT
        lines.append(
            f"{lo:>5.0f}-{hi:<6.0f} {s * WINDOW_S:>+10.2f} +/- {2 * se * WINDOW_S:<9.2f} "
            f"{bs * WINDOW_S:>+12.2f} +/- {2 * bse * WINDOW_S:<6.2f} ({len(blocks)} blocks)"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="bench-serve --soak --json reports")
    parser.add_argument(
        "--spans", default="300-7200,300-3600,3600-7200,5400-7200", help="START-STOP seconds, comma-separated"
    )
    args = parser.parse_args()
    spans = parse_spans(args.spans)
    for path in args.files:
        print("\n".join(describe(path, spans)), end="\n\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
