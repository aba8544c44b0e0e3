"""benchmarks/profile_layer.py runs every piece of one full-size layer and reports a time for each."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_profile_layer_times_every_piece() -> None:
    spec = importlib.util.spec_from_file_location("profile_layer", ROOT / "benchmarks" / "profile_layer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    times = module.main(["--batch", "1", "--length", "8", "--repeats", "1"])
    assert "WHOLE LAYER (block_forward)" in times and "FFN in + exact GELU" in times
    assert all(t > 0 for t in times.values()), times
