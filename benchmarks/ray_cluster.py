"""`ingest --engine ray` on a 3-node Ray cluster of this machine against the plain engine, side by side:
tokens/s on the same corpus, and the time from a worker node lost to the ingest finished.

    python benchmarks/ray_cluster.py [--docs 200] [--size tiny|wide] [--model DIR] [--workdir DIR]

The cluster is tests/ray_cluster.py's: a head and two workers with one CPU each, every node on 127.0.0.1
(Ray's `Cluster`, as in the tests), two encoder actors. Both engines run as the `bgem3-qdrant ingest`
command into an embedded store; the corpus is made-up words (tests/ray_cluster.py), about 17 chunks of 24
tokens per document. Without --model a random checkpoint is generated (needs torch, the dev extra): the
tests' tiny one (hidden 32: encoding costs next to nothing, so the figure is Ray's overhead per batch) or
`wide`, BGE-M3's width with one layer (encoding dominates, as with the real model). The three nodes share
this machine's cores, so the cluster has no more of them than the plain engine: the ratio shows Ray's
overhead (on a machine other jobs load too, several processes may get a larger share than one). Figures: the
command's own summary (its tokens / seconds of ingest: for Ray that includes starting the actors, for plain
it excludes loading the model), the steady rate from the first stored chunk to the last (start-up left out
of both), and the whole command's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.ray_cluster import IngestRun, LocalCluster, local_cluster, write_synthetic_corpus  # noqa: E402

TIMEOUT_S = 1800.0


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def timed(args: list[str]) -> dict[str, Any]:
    """The command's JSON summary, its wall time, and its tokens/s from the first stored chunk to the last
    (start-up excluded: loading the model in plain, starting the actors in Ray)."""
    t0 = time.perf_counter()
    run = IngestRun([*args, "--progress"], timeout=TIMEOUT_S)
    total = run.total()
    first = run.wait_for(1)
    t_first = time.perf_counter()
    run.wait_for(total)
    t_last = time.perf_counter()
    summary = run.summary()
    wall = time.perf_counter() - t0
    steady = summary["tokens"] * (total - first) / total / max(t_last - t_first, 1e-9)
    return {"summary": summary, "wall_s": wall, "steady_tokens_per_s": steady, "startup_s": t_first - t0}


def node_lost(cluster: LocalCluster, args: list[str], at: float) -> dict[str, Any]:
    """Run `args` with --progress; once a fraction `at` of the chunks is stored, remove a worker node whose
    encoder actor is alive. Returns when it was removed and when the command ended."""
    t0 = time.perf_counter()
    run = IngestRun([*args, "--progress"], timeout=TIMEOUT_S)
    total = run.total()
    done = run.wait_for(max(1, int(total * at)))
    job = cluster.job_of(run.pid)
    workers = {n.node_id for n in cluster.workers}
    alive = [a for a in cluster.actors("EncodeActor", job) if a.state == "ALIVE" and a.node_id in workers]
    if not alive:
        raise RuntimeError("no encoder actor alive on a worker node")
    cluster.remove(alive[0].node_id)
    removed = time.perf_counter()
    summary = run.summary()
    end = time.perf_counter()
    return {
        "chunks_done_at_loss": done,
        "chunks": total,
        "loss_to_end_s": end - removed,
        "wall_s": end - t0,
        "summary": summary,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=200, help="Documents (about 17 chunks of 24 tokens each).")
    ap.add_argument("--model", help="Checkpoint folder (default: a generated one of --size).")
    ap.add_argument(
        "--size", choices=("tiny", "wide"), default="tiny",
        help="Generated checkpoint: tiny (the tests', hidden 32) or wide (BGE-M3's width, one layer).",
    )  # fmt: skip
    ap.add_argument("--chunk-size", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--workdir", default="bench-ray-cluster")
    ap.add_argument("--lose-at", type=float, default=0.3, help="Fraction stored when the node is lost.")
    args = ap.parse_args(argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    model = args.model or str(generated_checkpoint(work, args.size))
    corpus = write_synthetic_corpus(work / f"corpus-{args.docs}", docs=args.docs)
    for name in ("plain", "ray", "ray-lost"):
        shutil.rmtree(work / name, ignore_errors=True)

    def ingest_args(store: str, *extra: str) -> list[str]:
        return [
            sys.executable, "-m", "bgem3_qdrant", "ingest", str(corpus), "--path", str(work / store),
            "-c", "docs", "--model", model, "--json", "--chunk-size", str(args.chunk_size),
            "--chunk-overlap", "4", "--batch-size", str(args.batch_size), *extra,
        ]  # fmt: skip

    plain = timed(ingest_args("plain"))
    with local_cluster(workers=2, cpus=1) as cluster:
        on_ray = ["--engine", "ray", "--ray-address", cluster.address, "--concurrency", "2"]
        viaray = timed(ingest_args("ray", *on_ray))
        lost = node_lost(cluster, ingest_args("ray-lost", *on_ray), args.lose_at)
    check = subprocess.run(
        [sys.executable, "-m", "bgem3_qdrant", "check", "--path", str(work / "ray-lost"), "-c", "docs",
         "--json"],
        capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    report = json.loads(check.stdout) if check.returncode == 0 else {"error": check.stderr.strip()}

    ps, rs = plain["summary"], viaray["summary"]
    out = [
        f"CPU: {cpu_model()} ({os.cpu_count()} vCPUs)",
        f"corpus: {args.docs} documents, {ps['chunks']} chunks, {ps['tokens']} tokens; model {model}",
        f"{'engine':22} {'tok/s summary':>13} {'tok/s steady':>12} {'start-up s':>10} {'wall s':>7}",
    ]
    for name, r in (("plain (this process)", plain), ("ray, 3-node cluster", viaray)):
        s = r["summary"]
        out.append(
            f"{name:22} {s['tokens_per_second']:13.0f} {r['steady_tokens_per_s']:12.0f} "
            f"{r['startup_s']:10.1f} {r['wall_s']:7.1f}"
        )
    out += [
        f"ray / plain: summary {rs['tokens_per_second'] / ps['tokens_per_second']:.2f}x, steady "
        f"{viaray['steady_tokens_per_s'] / plain['steady_tokens_per_s']:.2f}x, wall "
        f"{plain['wall_s'] / viaray['wall_s']:.2f}x",
        f"worker node lost at {lost['chunks_done_at_loss']}/{lost['chunks']} chunks stored: ingest finished "
        f"{lost['loss_to_end_s']:.1f} s later; the run took {lost['wall_s']:.1f} s "
        f"({lost['wall_s'] - viaray['wall_s']:+.1f} s against the undisturbed one); "
        f"{lost['summary']['encoded']} chunks encoded; check: {report.get('points')} points, "
        f"{report.get('damaged')} damaged",
    ]
    sys.stdout.write("\n".join(out) + "\n")
    (work / "report.json").write_text(
        json.dumps(
            {"plain": plain, "ray": viaray, "lost": lost, "check": report, "cpu": cpu_model()}, indent=2
        )
        + "\n",
        encoding="utf-8",
    )


def generated_checkpoint(work: Path, size: str) -> Path:
    """A random checkpoint in `work` (needs torch): the tests' tiny one, or BGE-M3's width with one layer."""
    if size == "wide":
        from benchmarks.qdrant_eval import wide_checkpoint

        return wide_checkpoint(work / "wide-checkpoint")
    from tests.tiny_checkpoint import make_tiny_checkpoint

    out = work / "tiny-checkpoint"
    if not (out / "config.json").is_file():
        make_tiny_checkpoint(out, seed=0)
    return out


if __name__ == "__main__":
    main()
