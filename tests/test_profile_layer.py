"""benchmarks/profile_layer.py runs every piece of one full-size layer and reports a time for each."""

from __future__ import annotations

from tests.support import load_benchmark


def test_profile_layer_times_every_piece() -> None:
    module = load_benchmark("profile_layer")
    times = module.main(["--batch", "1", "--length", "8", "--repeats", "1"])
    assert "WHOLE LAYER (block_forward)" in times and "FFN in + exact GELU" in times
    assert all(t > 0 for t in times.values()), times
