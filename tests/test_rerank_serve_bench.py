"""benchmarks/rerank_serve_bench.py on the tiny reranker checkpoint: both sides run, the server's order is the
library's (the script refuses otherwise) and the figures are written."""

from __future__ import annotations

import json
from pathlib import Path

from tests.optional import require_module
from tests.support import load_benchmark

require_module("fastapi", reason="the server needs the serve extra")


def test_server_and_in_process_figures(tiny_reranker_checkpoint: Path, tmp_path: Path) -> None:
    bench = load_benchmark("rerank_serve_bench")
    out = tmp_path / "figures.json"
    args = ["--model", str(tiny_reranker_checkpoint), "--passages", "4", "--tokens", "32", "--requests", "2"]
    result = bench.main([*args, "--json", str(out)])
    assert json.loads(out.read_text()) == result
    for side in ("in_process", "server"):
        assert 0 < result[side]["p50_ms"] <= result[side]["p95_ms"]
    assert result["server_over_in_process_p50"] > 0 and result["passages"] == 4
