"""The benchmarks behind docs/design/serve-batching.md's call-size ceiling: benchmarks/call_size_cost.py (what
a call costs by its number of texts) and the call schedules benchmarks/serve_regather.py encodes in
process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("clients, texts", [(16, 128), (4, 10), (16, 7)])
def test_call_schedules_cover_every_text_in_sizes_the_clients_allow(clients: int, texts: int) -> None:
    schedules = load_benchmark("serve_regather").call_schedules(clients, texts)
    best, burst = schedules[f"calls of {clients}"], schedules[f"burst: 1, {clients - 1}, then {clients}"]
    for sizes in schedules.values():
        assert sum(sizes) == texts and all(s > 0 for s in sizes), schedules
    assert all(s <= clients for s in best) and best[:-1] == [clients] * (len(best) - 1)
    assert burst[:2] == [1, min(clients - 1, texts - 1)] and all(s <= clients for s in burst)


def test_serve_regather_reference_schedule_is_two_calls_of_half() -> None:
    schedules = load_benchmark("serve_regather").call_schedules(16, 128)
    assert schedules["calls of 64"] == [64, 64]


def test_line_fit_recovers_fixed_and_per_text_cost() -> None:
    fit = load_benchmark("call_size_cost").line_fit
    assert fit([1, 2, 4, 8], [50.0 + 3.0 * n for n in (1, 2, 4, 8)]) == pytest.approx((50.0, 3.0))
    fixed, per_text = fit([1, 16, 64], [110.0, 770.0, 2750.0])  # calls that cost more than their texts
    assert fixed > 50 and 40 < per_text < 43


def test_call_size_cost_times_every_size(tiny_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "sizes.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "call_size_cost.py"), "--model", str(tiny_checkpoint),
         "--sizes", "1,4,8", "--texts", "8", "--rounds", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert sorted(int(k) for k in report["per_call_ms"]) == [1, 4, 8]
    assert all(len(ms) == 2 and all(t > 0 for t in ms) for ms in report["per_call_ms"].values())
    assert "least squares:" in done.stdout and " 8 " in done.stdout.replace("\n", " ")
