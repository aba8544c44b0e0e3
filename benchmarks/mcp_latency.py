"""`bgem3-qdrant mcp`: `find` through the MCP SDK's stdio client against `Searcher.search` in-process, and
the start-up to the first answered `list_tools`.

    python benchmarks/mcp_latency.py [--model DIR] [--chunks 3000] [--queries 50] [--mode hybrid]

Both sides search the same 3,000-chunk Qdrant Edge store with the same checkpoint, one query at a time:
in-process is `bgem3-qdrant search`'s own call (`Searcher.search`: query encoding plus one Query API call);
through MCP it is `ClientSession.call_tool("find")` timed in the client, with the command started as a
client config starts it (`bgem3-qdrant mcp --path ... --model ...`). The in-process figures are taken
before and after the MCP ones (the store opens in one process at a time), and the ratio is against both.
Targets: find p50 and p95 within 1.2x of in-process; list_tools answered <= 2 s after the command starts
with --encoder-url (the model already loaded by a running `bgem3 serve`).

The store and the checkpoint are benchmarks/qdrant_ui_page.py's: without --model a generated checkpoint of
BGE-M3's width with one layer (1024-d dense and ColBERT vectors: the store's work per search is the real
one, the query encodes fast), points written directly with synthetic vectors of those sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_ui_page import COLLECTION, bench_checkpoint, corpus, write_collection

SCRIPT = Path(sys.executable).with_name("bgem3-qdrant")


def percentiles(ms: list[float]) -> dict[str, float]:
    q = statistics.quantiles(ms, n=20, method="inclusive")
    return {"p50": round(statistics.median(ms), 2), "p95": round(q[18], 2), "n": len(ms)}


def in_process(store: Path, model: str, queries: list[str], mode: str, k: int, warmup: int) -> list[float]:
    """`bgem3-qdrant search`'s call, one query at a time (ms each, after `warmup` untimed ones)."""
    from bgem3_qdrant import Searcher, open_store, resolve_target
    from bgem3_qdrant.encoder import load_encoder

    encoder = load_encoder(model, precision="float32", device="cpu")
    times: list[float] = []
    with open_store(resolve_target(path=str(store))) as s:
        searcher = Searcher(s, COLLECTION, encoder)
        for i, q in enumerate(queries):
            t0 = time.perf_counter()
            searcher.search(q, mode=mode, limit=k)  # type: ignore[arg-type]
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1000)
    return times


def command(*args: str) -> list[str]:
    base = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "bgem3_qdrant"]
    return [*base, "mcp", *args]


async def through_mcp(args: list[str], queries: list[str], mode: str, k: int, warmup: int) -> dict[str, Any]:
    """Start the command as a client does; seconds to the first list_tools, then find's ms per query."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    cmd = command(*args)
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=dict(os.environ))
    times: list[float] = []
    started = time.perf_counter()
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.list_tools()
        startup = time.perf_counter() - started
        for i, q in enumerate(queries):
            t0 = time.perf_counter()
            result = await session.call_tool("find", {"query": q, "mode": mode, "k": k})
            if result.is_error:
                raise SystemExit(f"find failed: {result.content[0].text}")  # type: ignore[union-attr]
            if i >= warmup:
                times.append((time.perf_counter() - t0) * 1000)
    return {"startup_s": round(startup, 3), "times": times}


async def startup_only(args: list[str]) -> float:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    cmd = command(*args)
    params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=dict(os.environ))
    started = time.perf_counter()
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.list_tools()
        return time.perf_counter() - started


def child_cpu_s() -> float:
    """CPU seconds (user + system) of the child processes that have ended so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def start_encoder_server(model: str) -> tuple[subprocess.Popen[str], str]:
    """`bgem3 serve` on a free port; returns once it answers /health."""
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("bgem3")), "serve", "--model", model, "--port", str(port),
         "--precision", "float32", "--device", "cpu"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"bgem3 serve stopped: {proc.stderr.read() if proc.stderr else ''}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("bgem3 serve did not answer /health in 600 s")


def main(argv: list[str] | None = None) -> None:
    import anyio

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="Checkpoint folder (default: a generated 1-layer 1024-d one).")
    ap.add_argument("--chunks", type=int, default=3000)
    ap.add_argument("--rows", type=int, default=128, help="ColBERT rows per chunk.")
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5, help="Searches not counted (graph tracing, caches).")
    ap.add_argument("--mode", default="hybrid", help="find's mode (hybrid: its default).")
    ap.add_argument("-k", type=int, default=5, help="Hits per query (find's default).")
    ap.add_argument("--startups", type=int, default=5, help="Start-ups timed with --encoder-url.")
    ap.add_argument("--workdir", default="bench-ui", help="Checkpoint and store (qdrant_ui_page.py's).")
    ap.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    args = ap.parse_args(argv)
    work = Path(args.workdir)
    texts = corpus(args.chunks)
    model = args.model or str(bench_checkpoint(work / "checkpoint", texts))
    store = work / f"store-{args.chunks}x{args.rows}"
    if not store.is_dir():
        t0 = time.perf_counter()
        write_collection(store, model, texts, args.rows)
        sys.stderr.write(f"wrote {args.chunks} chunks in {time.perf_counter() - t0:.0f} s\n")
    rng = np.random.default_rng(2)
    picks = rng.choice(len(texts), size=args.warmup + args.queries, replace=False)
    queries = [" ".join(rng.choice(texts[int(i)].split(), size=6, replace=False)) for i in picks]

    from bgem3_qdrant.tools.bench_store import cpu_model

    before = in_process(store, model, queries, args.mode, args.k, args.warmup)
    mcp = anyio.run(through_mcp, ["--path", str(store), "-c", COLLECTION, "--model", model, "--read-only"],
                    queries, args.mode, args.k, args.warmup)  # fmt: skip
    after = in_process(store, model, queries, args.mode, args.k, args.warmup)
    server, url = start_encoder_server(model)
    try:
        remote = ["--path", str(store), "-c", COLLECTION, "--encoder-url", url, "--read-only"]
        startups, cpu = [], []
        for _ in range(args.startups):
            before_cpu = child_cpu_s()
            startups.append(anyio.run(startup_only, remote))
            # the command's whole life: start, list_tools, the client closing its stdin
            cpu.append(child_cpu_s() - before_cpu)
    finally:
        server.terminate()
        server.wait(60)
    local = percentiles(before + after)
    through = percentiles(mcp["times"])
    report = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "chunks": args.chunks,
        "colbert_rows": args.rows,
        "mode": args.mode,
        "k": args.k,
        "queries": args.queries,
        "model": model,
        "in_process_ms": local,
        "in_process_before_ms": percentiles(before),
        "in_process_after_ms": percentiles(after),
        "mcp_find_ms": through,
        "ratio_p50": round(through["p50"] / local["p50"], 3),
        "ratio_p95": round(through["p95"] / local["p95"], 3),
        "startup_local_model_s": mcp["startup_s"],
        "startup_encoder_url_s": {
            "median": round(statistics.median(startups), 3),
            "max": round(max(startups), 3),
            "runs": [round(s, 3) for s in startups],
            "cpu_s_median": round(statistics.median(cpu), 3),
        },
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{report['cpu']} ({report['cores']} cores, load {report['load_avg']}), {args.chunks} chunks, "
          f"mode {args.mode}, k={args.k}, {args.queries} queries")  # fmt: skip
    print(f"  in-process search : p50 {local['p50']:.1f} ms  p95 {local['p95']:.1f} ms")
    print(f"  MCP find (stdio)  : p50 {through['p50']:.1f} ms  p95 {through['p95']:.1f} ms  "
          f"({report['ratio_p50']:.2f}x / {report['ratio_p95']:.2f}x; target <= 1.2x)")  # fmt: skip
    up = report["startup_encoder_url_s"]
    print(f"  start-up to list_tools: --encoder-url median {up['median']:.2f} s (target <= 2 s; "
          f"{up['cpu_s_median']:.2f} CPU s), local model {mcp['startup_s']:.2f} s (loads after)")
    sys.stderr.write(json.dumps(report) + "\n")  # every figure, for docs/mcp.md


if __name__ == "__main__":
    main()
