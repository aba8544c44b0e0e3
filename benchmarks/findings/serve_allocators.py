"""Allocator settings for `bgem3 serve`, side by side: speed and resident memory of one server per setting.

Each setting (`--settings NAME=ENV,...`; default: TensorFlow's own pool, oneDNN on malloc, and oneDNN
on malloc with a fixed glibc mmap threshold) gets its own `bgem3 serve` process on the same checkpoint,
started with that environment. Then, `--rounds` times, every server in turn answers 16 clients of
short queries and 4 clients of passages (all three outputs). The report: each setting's tokens/s per
round and its median ratio to the first setting, the server's VmRSS after each round, its peak (VmHWM),
and its VmRSS after `--idle` seconds without requests (the batcher's idle trim). The settings share the
machine's load alike.

    python benchmarks/findings/serve_allocators.py --model /tmp/bgem3-full --rounds 3 --json /tmp/alloc.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

ALL = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
DEFAULT_SETTINGS = (
    "tf-pool=;"
    "onednn-malloc=TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1;"
    "onednn-malloc+mmap1m=TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1,MALLOC_MMAP_THRESHOLD_=1048576"
)


def parse_settings(text: str) -> dict[str, dict[str, str]]:
    """ "a=;b=X=1,Y=2" -> {"a": {}, "b": {"X": "1", "Y": "2"}}."""
    settings: dict[str, dict[str, str]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, _, env = part.partition("=")
        settings[name] = dict(kv.split("=", 1) for kv in env.split(",") if kv)
    return settings


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Any:
    """os.environ with `env` added while the block runs (a server started in it inherits it)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--settings", default=DEFAULT_SETTINGS, help="NAME=ENV=VALUE,...;NAME=...")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds idle before the last RSS reading")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    settings = parse_settings(args.settings)

    from bgem3_embeddings.bench.run import usable_cpu_count
    from bgem3_embeddings.serve.bench import (
        PASSAGE_TOKENS,
        QUERY_TOKENS,
        cpu_model,
        make_texts,
        server_process,
        through_server,
    )
    from bgem3_embeddings.serve.soak import load_average, rss_mb
    from bgem3_embeddings.tokenizer import BGEM3Tokenizer

    tokenizer = BGEM3Tokenizer.from_dir(args.model)
    workloads = {
        "queries": (make_texts(tokenizer, 64, QUERY_TOKENS, seed=1), 16, 32),
        "passages": (make_texts(tokenizer, 16, PASSAGE_TOKENS, seed=2), 4, 512),
    }
    figures: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": usable_cpu_count(),  # what this process may use (taskset), not the machine
        "settings": settings,
        "load": [load_average()],
        "rounds": {name: {w: [] for w in workloads} for name in settings},
        "rss_mb": {name: [] for name in settings},
    }
    with contextlib.ExitStack() as stack:
        servers = {}
        for name, env in settings.items():
            with environment(env):
                # glibc's own threshold unless the setting's MALLOC_MMAP_THRESHOLD_ fixes it (read at start):
                # the server's 1 MiB default would otherwise be in every setting
                glibc_default = ["--malloc-mmap-threshold", "0"]
                proc, url = stack.enter_context(server_process(args.model, "float32", glibc_default))
            for texts, clients, length in workloads.values():  # warm-up
                through_server(url, texts[:16], "warm-up", clients, ALL, length)
            servers[name] = (proc, url)
        for rnd in range(args.rounds):
            for workload, (texts, clients, length) in workloads.items():
                for name, (_proc, url) in servers.items():
                    row = through_server(url, texts, workload, clients, ALL, length)
                    figures["rounds"][name][workload].append(row.tokens_per_s)
                    print(f"round {rnd} {workload:8} {name:22} {row.tokens_per_s:8.1f} tokens/s", flush=True)
            for name, (proc, _) in servers.items():
                figures["rss_mb"][name].append(rss_mb(proc.pid)[0])
            figures["load"].append(load_average())
        time.sleep(args.idle)
        figures["idle_rss_mb"] = {name: rss_mb(proc.pid)[0] for name, (proc, _) in servers.items()}
        figures["peak_rss_mb"] = {name: rss_mb(proc.pid)[1] for name, (proc, _) in servers.items()}
    first = next(iter(settings))
    print(f"\n{figures['cpu']}, {figures['cores']} cores; load average {figures['load']}")
    print(
        f"{'setting':22} {'queries x':>9} {'passages x':>10} {'RSS MB per round':>30} {'idle':>7} {'peak':>7}"
    )
    for name in settings:
        ratios = {
            w: statistics.median(
                a / b for a, b in zip(figures["rounds"][name][w], figures["rounds"][first][w], strict=True)
            )
            for w in workloads
        }
        figures.setdefault("median_ratio", {})[name] = ratios
        rss = " ".join(f"{v:.0f}" for v in figures["rss_mb"][name])
        print(
            f"{name:22} {ratios['queries']:>9.3f} {ratios['passages']:>10.3f} {rss:>30} "
            f"{figures['idle_rss_mb'][name]:>7.0f} {figures['peak_rss_mb'][name] or float('nan'):>7.0f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
