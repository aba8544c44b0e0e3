"""Short queries through `bgem3 serve` with and without the batcher's regathering, beside in-process encode.

In one run: the encoder in this process, and two `bgem3 serve` processes on the same checkpoint, one with
`--regather-share 0` (every call starts as soon as a request waits) and one with the default (after a call
that answered several requests, wait up to a share of its time for them to come back). Then `--rounds`
times, in turn: 64 short queries (8-16 tokens, all three outputs) encoded in this process in one call (the
throughput reference) and one per call (the lone-query latency reference), then each server answering
them from 16 clients (each query sent twice) and 16 of them from one client (lone-query latency). The
report: per round and as medians, tokens/s and the ratio to in-process one call of the same round, p50 of a
lone query, the CPU seconds the server and the clients (threads of this process) used, and the encoder
calls of each 16-client pass from the server's /metrics (how many, texts per call, the share of calls of at
most 4 texts): the figures the machine's other load disturbs least; and the share of the pass the encoder was
busy (bgem3_batch_seconds), the rest being time with no call running while the clients turn around.

Beside them, in this process and in the same rounds, the same 128 queries encoded in the call sizes a server
can at best give 16 clients of one query each (`--clients` texts per call), and in the sizes it gives them
when they all start at once (a call of 1, then `clients - 1`, then `clients` per call): what those call
sizes cost without any HTTP, the ceiling of the server's ratio on this machine. The same 128 in two calls
of 64 is measured the same way (one timing, pre-tokenized), beside the reference's best of two one-call
`encode` timings.

    python benchmarks/serve_regather.py --model /tmp/bgem3-full --rounds 3 --json /tmp/regather.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path
from typing import Any

from serve_query_profile import ALL, cpu_seconds  # the same reading of a process's CPU time

SERVERS = {"regather 0": ["--regather-share", "0"], "default": []}


def call_schedules(clients: int, texts: int) -> dict[str, list[int]]:
    """Call sizes for `texts` queries: the reference's (two calls of half), the best `clients` one-query
    clients allow, and their burst start (the first request alone, the others meanwhile queued).

    >>> call_schedules(16, 40)
    {'calls of 20': [20, 20], 'calls of 16': [16, 16, 8], 'burst: 1, 15, then 16': [1, 15, 16, 8]}
    """

    def fill(pattern: list[int]) -> list[int]:
        sizes: list[int] = []
        while sum(sizes) < texts:
            want = pattern[len(sizes)] if len(sizes) < len(pattern) else clients
            sizes.append(min(want, texts - sum(sizes)))
        return sizes

    half = texts // 2 if texts % 2 == 0 else texts  # the in-process reference's call size (each query twice)
    return {
        f"calls of {half}": [half] * (texts // half),
        f"calls of {clients}": fill([]),
        f"burst: 1, {clients - 1}, then {clients}": fill([1, clients - 1]),
    }


def encode_in_calls(encoder: Any, token_ids: list[list[int]], sizes: list[int]) -> float:
    """Seconds to encode `token_ids` (all three outputs) in calls of these sizes, one after the other."""
    start, taken = time.perf_counter(), 0
    for size in sizes:
        chunk = token_ids[taken : taken + size]
        encoder.encode_token_ids(chunk, return_dense=True, return_sparse=True, return_colbert_vecs=True)
        taken += size
    return time.perf_counter() - start


def batch_calls(url: str) -> tuple[float, float, float, float]:
    """(calls, texts, calls of at most 4 texts, seconds in encoder calls) so far, from the server's
    bgem3_batch_texts and bgem3_batch_seconds histograms."""
    import httpx

    values = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("bgem3_batch_texts_count"):
            values["count"] = float(line.split()[-1])
        elif line.startswith("bgem3_batch_texts_sum"):
            values["sum"] = float(line.split()[-1])
        elif line.startswith('bgem3_batch_texts_bucket{le="4.0"}'):
            values["small"] = float(line.split()[-1])
        elif line.startswith("bgem3_batch_seconds_sum"):
            values["busy"] = float(line.split()[-1])
    count, texts, small, busy = (values.get(key, 0.0) for key in ("count", "sum", "small", "busy"))
    return count, texts, small, busy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--baseline",
        type=Path,
        help="also a default server running the bgem3_embeddings of this checkout (another commit)",
    )
    args = parser.parse_args()
    servers_to_start = {name: (extra, None) for name, extra in SERVERS.items()}
    if args.baseline is not None:
        servers_to_start["baseline"] = ([], args.baseline.resolve())

    from bgem3_embeddings.bench.run import usable_cpu_count
    from bgem3_embeddings.cli_support import start_tensorflow_quietly
    from bgem3_embeddings.serve import bench
    from bgem3_embeddings.serve.soak import load_average

    start_tensorflow_quietly()
    from bgem3_embeddings.encoder import BGEM3Encoder

    encoder = BGEM3Encoder(args.model, precision="float32", show_progress=False)
    texts = bench.make_texts(encoder.tokenizer, 64, bench.QUERY_TOKENS, seed=1)
    length = encoder.query_max_length
    token_ids = encoder.tokenize(texts * 2, length)  # what the servers encode: each query twice
    tokens_128 = sum(len(ids) for ids in token_ids)
    schedules = call_schedules(args.clients, len(token_ids))
    figures: dict[str, Any] = {
        "cpu": bench.cpu_model(),
        "cores": usable_cpu_count(),  # what this process may use (taskset), not the machine
        "load": [load_average()],
        "in_process_one_call": [],
        "in_process_lone_p50_ms": [],
        "in_process_calls": {name: {"sizes": sizes, "ratio": []} for name, sizes in schedules.items()},
        "servers": {
            name: {
                "calls": [],
                "busy_share": [],
                "texts_per_call": [],
                "small_call_share": [],
                "tokens_per_s": [],
                "ratio": [],
                "lone_p50_ms": [],
                "server_cpu_s": [],
                "clients_cpu_s": [],
            }
            for name in servers_to_start
        },
    }
    with contextlib.ExitStack() as stack:
        servers = {}
        for name, (extra, source) in servers_to_start.items():
            proc, url = stack.enter_context(bench.server_process(args.model, "float32", extra, source))
            bench.through_server(url, texts[:16], "warm-up", 4, ALL, length)
            servers[name] = (proc, url)
        for rnd in range(args.rounds):
            in_process = bench.in_process(encoder, texts, "queries", ALL)
            one_call = next(r for r in in_process if r.how == "one call").tokens_per_s
            lone = next(r for r in in_process if r.how != "one call").percentile(50)
            figures["in_process_one_call"].append(one_call)
            figures["in_process_lone_p50_ms"].append(lone)
            print(
                f"round {rnd} in-process one call {one_call:8.1f} tokens/s, one per call p50 {lone:.1f} ms",
                flush=True,
            )
            for name, sizes in schedules.items():
                rate = tokens_128 / encode_in_calls(encoder, token_ids, sizes)
                figures["in_process_calls"][name]["ratio"].append(rate / one_call)
                print(f"round {rnd} in-process {name:22} {rate:8.1f} tokens/s ({rate / one_call:.2f}x)")
            for name, (proc, url) in servers.items():
                calls0 = batch_calls(url)
                server0, clients0 = cpu_seconds(proc.pid), time.process_time()
                row = bench.through_server(url, texts * 2, "queries", args.clients, ALL, length)
                server1, clients1 = cpu_seconds(proc.pid), time.process_time()
                calls, texts_in, small, busy = (b - a for a, b in zip(calls0, batch_calls(url), strict=True))
                single = bench.through_server(url, texts[:16], "queries", 1, ALL, length)
                got = figures["servers"][name]
                got["calls"].append(calls)
                got["busy_share"].append(busy / row.seconds)  # the rest: no call running (clients turning)
                got["texts_per_call"].append(texts_in / max(calls, 1))
                got["small_call_share"].append(small / max(calls, 1))
                got["tokens_per_s"].append(row.tokens_per_s)
                got["ratio"].append(row.tokens_per_s / one_call)
                got["lone_p50_ms"].append(single.percentile(50))
                got["server_cpu_s"].append(server1 - server0)
                got["clients_cpu_s"].append(clients1 - clients0)
                print(
                    f"round {rnd} {name:10} {args.clients} clients {row.tokens_per_s:8.1f} tokens/s "
                    f"({row.tokens_per_s / one_call:.2f}x), lone p50 {single.percentile(50):.1f} ms; "
                    f"CPU server {server1 - server0:.1f} s, clients {clients1 - clients0:.1f} s "
                    f"for {2 * len(texts)} requests; {calls:.0f} calls, {texts_in / max(calls, 1):.1f} texts "
                    f"per call, {small / max(calls, 1):.0%} of at most 4; busy {busy / row.seconds:.0%}",
                    flush=True,
                )
            figures["load"].append(load_average())
    print(f"\n{args.model}; {figures['cpu']}, {figures['cores']} cores; load average {figures['load']}")
    print(
        f"in-process one call: median {statistics.median(figures['in_process_one_call']):.1f} tokens/s; "
        f"one per call p50 median {statistics.median(figures['in_process_lone_p50_ms']):.1f} ms"
    )
    for name, got in figures["in_process_calls"].items():
        rounds = ", ".join(f"{r:.2f}" for r in got["ratio"])
        print(f"in-process, {name}: median {statistics.median(got['ratio']):.2f}x (rounds {rounds})")
    for name, got in figures["servers"].items():
        rounds = ", ".join(f"{r:.2f}" for r in got["ratio"])
        print(
            f"{name:10} {args.clients} clients: median {statistics.median(got['tokens_per_s']):.1f} "
            f"tokens/s, {statistics.median(got['ratio']):.2f}x (rounds {rounds}); "
            f"lone p50 median {statistics.median(got['lone_p50_ms']):.1f} ms; server CPU per pass "
            f"{statistics.median(got['server_cpu_s']):.1f} s; encoder busy "
            f"{statistics.median(got['busy_share']):.0%} of the pass; texts per call "
            f"{statistics.median(got['texts_per_call']):.1f}, calls of <= 4 texts "
            f"{statistics.median(got['small_call_share']):.0%}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
