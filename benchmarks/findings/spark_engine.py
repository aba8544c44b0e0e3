"""`bgem3-qdrant ingest --engine spark` against the plain engine on one corpus, and where Spark's time goes.

    python benchmarks/findings/spark_engine.py [--docs 40] [--master 'local[2]'] [--model DIR] \
        [--ray] [--json]

Both engines run as commands on the same synthetic corpus (tests/ray_cluster.py's, chunks of 24 tokens,
batches of 8) into fresh embedded stores: wall time of the command and the summary's own seconds. Then,
in this process through the library, the parts of a Spark run: starting the JVM and the session; the first
job on one row per task slot (each Python worker starts and loads the encoder); the same job again (Spark's
cost per job once the workers are warm); the corpus's rows through the executors and back with vectors of
the right sizes but no encoder (Spark + Arrow transfer); and the corpus encoded on the warm workers.
Without --model a tiny checkpoint is generated (needs torch). --ray also runs `--engine ray` (a local Ray,
as many encoder actors as Spark has task slots) on the same corpus, for the two engines side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
CHUNKING = ["--chunk-size", "24", "--chunk-overlap", "4", "--batch-size", "8"]


def run_ingest(corpus: Path, store: Path, model: str, *extra: str) -> dict[str, Any]:
    args = [sys.executable, "-m", "bgem3_qdrant", "ingest", str(corpus), "--path", str(store), "-c", "docs",
            "--model", model, *CHUNKING, "--json", *extra]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall_s": round(wall, 1), "summary_s": round(summary["seconds"], 1), "tokens": summary["tokens"],
            "chunks": summary["chunks"]}  # fmt: skip


def fake_vectors(frames: Iterator[Any], hidden: int) -> Iterator[Any]:
    """The encoder's output columns with zeros of the right sizes: Spark and Arrow without the encoder."""
    import numpy as np

    for frame in frames:
        n = len(frame)
        rows = [int(t) for t in frame["tokens"]]
        yield frame.assign(
            dense=[np.zeros(hidden, np.float32) for _ in range(n)],
            sparse_idx=[np.zeros(t, np.int64).tobytes() for t in rows],
            sparse_val=[np.zeros(t, np.float32).tobytes() for t in rows],
            colbert=[np.zeros((t - 1, hidden), np.float32).tobytes() for t in rows],
        )


def spark_parts(corpus: Path, model: str, master: str) -> dict[str, float]:
    from bgem3_qdrant.ingest.options import IngestOptions
    from bgem3_qdrant.ingest.spark import SparkEncoding, encode_frames, waves
    from bgem3_qdrant.spark import chunk_rows, spark_session

    options = IngestOptions(chunk_size=24, chunk_overlap=4, batch_size=8)
    rows = chunk_rows([str(corpus)], model, options)
    encoding = SparkEncoding(model)
    identity = encoding.identity()
    encode = partial(encode_frames, model=model, options=options, encoder_kwargs={},
                     fingerprint=None if identity is None else identity.fingerprint)  # fmt: skip
    parts: dict[str, float] = {}
    t0 = time.perf_counter()
    with spark_session(
        master, "bgem3 spark benchmark", conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "8"}
    ) as spark:  # noqa: E501
        parts["jvm_and_session_s"] = time.perf_counter() - t0
        slots = spark.sparkContext.defaultParallelism
        one_each = [[r] for r in rows[:slots]]

        def job(wave: list[list[dict[str, Any]]], fn: Any) -> float:
            t = time.perf_counter()
            for _ in SparkEncoding._run_wave(spark, wave, fn):
                pass
            return time.perf_counter() - t

        parts["first_job_workers_and_model_load_s"] = job(one_each, encode)
        parts["warm_job_s"] = job(one_each, encode)
        transfer = partial(fake_vectors, hidden=encoding.hidden_size)
        parts["corpus_without_encoder_s"] = sum(job(w, transfer) for w in waves(rows, 8, slots))
        parts["corpus_encoded_warm_s"] = sum(job(w, encode) for w in waves(rows, 8, slots))
        parts["task_slots"] = slots
    return {k: round(v, 1) for k, v in parts.items()}


def local_slots(master: str) -> int:
    """Task slots of a local master (local[2] -> 2, local[*] -> the CPUs); 2 for a cluster's URL.

    >>> local_slots("local[3]"), local_slots("spark://127.0.0.1:7077")
    (3, 2)
    """
    if master.startswith("local[") and master.endswith("]"):
        inner = master[len("local[") : -1]
        return (os.cpu_count() or 1) if inner == "*" else int(inner)
    return 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=40)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--model", default=None)
    parser.add_argument("--ray", action="store_true", help="also time --engine ray on the same corpus")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from tests.ray_cluster import write_synthetic_corpus

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = args.model
        if model is None:
            from tests.tiny_checkpoint import make_tiny_checkpoint

            model = str(make_tiny_checkpoint(root / "tiny", seed=0))
        corpus = write_synthetic_corpus(root / "corpus", docs=args.docs)
        report: dict[str, Any] = {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                                  "load_avg_before": os.getloadavg()[0], "master": args.master}  # fmt: skip
        report["plain"] = run_ingest(corpus, root / "plain", model)
        report["spark"] = run_ingest(
            corpus, root / "spark", model, "--engine", "spark", "--spark-master", args.master
        )
        report["spark_over_plain_wall"] = round(report["spark"]["wall_s"] / report["plain"]["wall_s"], 2)
        if args.ray:
            slots = local_slots(args.master)
            ray_args = ("--engine", "ray", "--concurrency", str(slots))
            report["ray"] = run_ingest(corpus, root / "ray", model, *ray_args)
            report["ray_over_plain_wall"] = round(report["ray"]["wall_s"] / report["plain"]["wall_s"], 2)
        report["spark_parts"] = spark_parts(corpus, model, args.master)
        report["load_avg_after"] = os.getloadavg()[0]
    print(json.dumps(report, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
