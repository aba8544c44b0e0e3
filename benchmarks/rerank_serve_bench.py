"""Rerank latency through `bgem3 serve --reranker` against the same reranking in process (p50 / p95).

The work is rerank_bench.py's: one query and N passages of about T tokens (100 x 256 by default) on a
random-weight bge-reranker-v2-m3 layout checkpoint. In process, `BGEM3Reranker.rerank(query, passages)`;
through the server, one `POST /rerank` with the same texts (`truncate: true`, `raw_scores: true`) from a
plain httpx client, one request at a time: the difference is what the server adds (HTTP, JSON, the
batcher's queue and thread hop). The server runs in its own process, started as a user starts it; the
in-process side runs in this process while the server is not running, so the two never share the CPU.
Each side is warmed up by one call first; the server's scores are checked against the in-process ones.

    python benchmarks/rerank_serve_bench.py                              # full size, 100 x 256, 5 requests
    python benchmarks/rerank_serve_bench.py --size tiny --passages 8 --requests 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# A sibling script (its folder is on sys.path when run as a script, and under tests.support.load_benchmark):
# its checkpoint, passages, query and CPU name, so both benchmarks time the same work.
import rerank_bench  # noqa: E402

ADDRESS = re.compile(r"on (http://127\.0\.0\.1:\d+)")
START_TIMEOUT_S = 900


def percentiles(walls: list[float]) -> dict[str, float]:
    return {
        "p50_ms": float(np.percentile(walls, 50) * 1000),
        "p95_ms": float(np.percentile(walls, 95) * 1000),
    }


def in_process(model: Path, texts: list[str], requests: int, precision: str) -> tuple[list[float], list[int]]:
    """Wall times of `rerank` (after one warm-up call) and the order it gives."""
    from bgem3_embeddings import BGEM3Reranker

    reranker = BGEM3Reranker(model, precision=precision, device="cpu", show_progress=False)
    order = [i for i, _ in reranker.rerank(rerank_bench.QUERY, texts)]
    walls = []
    for _ in range(requests):
        start = time.perf_counter()
        reranker.rerank(rerank_bench.QUERY, texts)
        walls.append(time.perf_counter() - start)
    return walls, order


def through_server(
    model: Path, texts: list[str], requests: int, precision: str
) -> tuple[list[float], list[int]]:
    """Wall times of `POST /rerank` to `bgem3 serve --reranker` (after one warm-up request) and its order."""
    import httpx

    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    cmd = [sys.executable, "-m", "bgem3_embeddings.cli", "serve", "--reranker", str(model), "--precision",
           precision, "--port", "0", "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        assert proc.stderr is not None
        url = None
        for line in proc.stderr:
            found = ADDRESS.search(line)
            if found:
                url = found.group(1)
                break
        if url is None:
            raise RuntimeError(f"bgem3 serve printed no address (exit {proc.wait(30)})")
        body = {"query": rerank_bench.QUERY, "texts": texts, "truncate": True, "raw_scores": True}
        with httpx.Client(base_url=url, timeout=START_TIMEOUT_S) as client:
            first = client.post("/rerank", json=body)  # waits for the warm-up; warms the route up
            first.raise_for_status()
            order = [item["index"] for item in first.json()]
            walls = []
            for _ in range(requests):
                start = time.perf_counter()
                client.post("/rerank", json=body).raise_for_status()
                walls.append(time.perf_counter() - start)
        return walls, order
    finally:
        proc.terminate()
        proc.wait(60)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a reranker checkpoint folder (default: a random one of --size)")
    parser.add_argument("--size", choices=("tiny", "full"), default="full")
    parser.add_argument("--passages", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--requests", type=int, default=5, help="timed requests per side")
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--cache", type=Path, default=REPO / ".cache" / "bench")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    options = parser.parse_args(argv)
    model = Path(options.model) if options.model else rerank_bench.checkpoint(options.size, options.cache)
    texts = rerank_bench.passages(model, options.passages, options.tokens)
    local, local_order = in_process(model, texts, options.requests, options.precision)
    served, served_order = through_server(model, texts, options.requests, options.precision)
    if served_order != local_order:
        raise SystemExit("the server's order differs from the library's: not a latency question")
    result = {
        "cpu": rerank_bench.cpu_model(),
        "model": str(model),
        "precision": options.precision,
        "passages": options.passages,
        "tokens_per_passage": options.tokens,
        "requests": options.requests,
        "in_process": percentiles(local),
        "server": percentiles(served),
    }
    result["server_over_in_process_p50"] = result["server"]["p50_ms"] / result["in_process"]["p50_ms"]
    for side in ("in_process", "server"):
        print(f"{side:<11} p50 {result[side]['p50_ms']:9.1f} ms   p95 {result[side]['p95_ms']:9.1f} ms")
    print(f"server / in-process at p50: {result['server_over_in_process_p50']:.3f} ({result['cpu']})")
    if options.json:
        options.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
