"""`bgem3-qdrant bench-store`: the store engines side by side on the same synthetic BGE-M3-size data.

Each engine is measured in fresh processes (one to write, one to reopen and search), so "resident
memory after open" is the memory of a process that opened the store and nothing else. Vectors are
synthetic but of the model's real sizes (1024-d dense, `tokens` x 1024 ColBERT rows per chunk, `sparse`
weights per chunk) and identical for every engine (seeded per batch). Queries are perturbed copies of
stored chunks, so rankings are meaningful and can be compared across engines and ColBERT dtypes.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..ingest.writer import ensure_payload_indexes
from ..pooling import pool_rows
from ..schema import CollectionSchema
from ..stores.base import MODES, BGEM3Store, Mode, QuerySpec, StoredPoint
from ..stores.layout import allocated_bytes
from ..stores.open import open_store, resolve_target

LANGS = ("en", "de", "fr", "ja")  # a filter on one of them keeps a quarter of the chunks
VOCAB = 250_002


@dataclass(frozen=True)
class BenchData:
    """The synthetic corpus: sizes and seed (every process regenerates the same vectors)."""

    chunks: int = 3000
    dim: int = 1024
    tokens: int = 128
    sparse: int = 40
    queries: int = 20
    query_tokens: int = 32
    batch: int = 64
    seed: int = 0

    def batch_points(self, b: int) -> list[StoredPoint]:
        """Points of batch b (ids b*batch ...), regenerated identically in any process."""
        rng = np.random.default_rng([self.seed, b])
        start, stop = b * self.batch, min((b + 1) * self.batch, self.chunks)
        n = stop - start
        dense = _unit(rng.standard_normal((n, self.dim), dtype=np.float32))
        colbert = _unit(rng.standard_normal((n, self.tokens, self.dim), dtype=np.float32))
        pts = []
        for i in range(n):
            idx = np.sort(rng.choice(VOCAB, self.sparse, replace=False)).astype(np.int64)
            val = rng.random(self.sparse, dtype=np.float32) * 0.3
            pid = start + i
            payload = {
                "text": f"chunk {pid}",
                "doc_id": f"doc-{pid // 8}",
                "source": f"doc-{pid // 8}.txt",
                "chunk_index": pid % 8,
                "metadata": {"lang": LANGS[pid % len(LANGS)]},
            }
            vec = {"dense": dense[i], "colbert": colbert[i], "sparse": (idx, val)}
            pts.append(StoredPoint(_bench_id(pid), payload, vec))
        return pts

    def batches(self) -> Iterator[list[StoredPoint]]:
        for b in range((self.chunks + self.batch - 1) // self.batch):
            yield self.batch_points(b)

    def query_specs(self, mode: Mode, filtered: bool, exact: bool = False) -> list[QuerySpec]:
        """Queries near stored chunks: noisy copies of their dense, ColBERT rows and sparse weights."""
        from qdrant_client import models

        rng = np.random.default_rng([self.seed, 10**6])
        targets = rng.choice(self.chunks, self.queries, replace=False)
        flt = None
        if filtered:
            flt = models.Filter(
                must=[models.FieldCondition(key="metadata.lang", match=models.MatchValue(value="en"))]
            )
        specs = []
        for t in targets:
            p = self.batch_points(int(t) // self.batch)[int(t) % self.batch]
            q_tokens = min(self.query_tokens, self.tokens)
            rows = rng.choice(self.tokens, q_tokens, replace=False)
            dense = _unit(p.vectors["dense"] + 0.5 * _unit(rng.standard_normal(self.dim, dtype=np.float32)))
            colbert = _unit(
                p.vectors["colbert"][rows]
                + 0.5 * rng.standard_normal((q_tokens, self.dim), dtype=np.float32) / np.sqrt(self.dim)
            )
            idx, val = p.vectors["sparse"]
            keep = rng.random(len(idx)) < 0.5
            specs.append(
                QuerySpec(
                    mode=mode,
                    limit=10,
                    prefetch_limit=50,
                    dense=dense,
                    sparse=(idx[keep], val[keep]),
                    colbert=colbert,
                    filter=flt,
                    exact=exact,
                )
            )
        return specs

    @property
    def raw_colbert_bytes(self) -> int:
        return self.chunks * self.tokens * self.dim * 4


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _bench_id(i: int) -> str:
    import uuid

    return str(uuid.UUID(int=i + 1))


def _rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _open(engine: str, path: str) -> BGEM3Store:
    return open_store(resolve_target(path=path, url=None, engine=engine))  # type: ignore[arg-type]


# -- the two worker steps (each in its own process)
def work_write(engine: str, dtype: str, path: str, data: BenchData, pooling: int = 1) -> dict[str, Any]:
    """Write the data (each chunk's ColBERT rows pooled by `pooling`, as ingest does it); pooling time is
    measured on its own, outside the write time."""
    store = _open(engine, path)
    schema = CollectionSchema(size=data.dim, colbert_dtype=dtype)  # type: ignore[arg-type]
    store.create_collection("bench", schema)
    if pooling > 1:  # scipy's import (half a second) is not the pooling's cost
        pool_rows(np.eye(2, data.dim, dtype=np.float32), pooling)
    gen = write = pool = 0.0
    rows = 0
    t = time.perf_counter()
    for batch in data.batches():
        t1 = time.perf_counter()
        gen += t1 - t
        if pooling > 1:
            for p in batch:
                p.vectors["colbert"] = pool_rows(p.vectors["colbert"], pooling)
        rows += sum(len(p.vectors["colbert"]) for p in batch)
        t2 = time.perf_counter()
        pool += t2 - t1
        store.upsert("bench", batch)
        t = time.perf_counter()
        write += t - t2
    t0 = time.perf_counter()
    ensure_payload_indexes(store, "bench", {"lang": "keyword"})
    store.optimize("bench")
    optimize = time.perf_counter() - t0
    store.close()
    return {
        "write_s": write,
        "optimize_s": optimize,
        "generate_s": gen,
        "pool_s": pool,
        "colbert_rows": rows,
        "disk_bytes": allocated_bytes(path),
    }


def work_search(engine: str, path: str, data: BenchData) -> dict[str, Any]:
    t0 = time.perf_counter()
    store = _open(engine, path)
    n = store.count("bench")  # local mode loads every point on open; Edge loads segments lazily
    reopen = time.perf_counter() - t0
    rss = _rss_mb()
    out: dict[str, Any] = {"reopen_s": reopen, "rss_mb": rss, "points": n, "latency_ms": {}, "results": {}}
    for filtered in (False, True):
        for mode in MODES:
            specs = data.query_specs(mode, filtered)
            for s in specs[:1]:  # warm-up
                store.query("bench", s)
            times, results = [], []
            for s in specs:
                t = time.perf_counter()
                hits = store.query("bench", s)
                times.append((time.perf_counter() - t) * 1000)
                results.append([(h.id, h.score) for h in hits])
            key = f"{mode}{' +filter' if filtered else ''}"
            out["latency_ms"][key] = [float(np.percentile(times, 50)), float(np.percentile(times, 95))]
            if store.kind != "local":
                # Agreement is taken on exact candidates: an optimized Edge store finds dense candidates
                # through an HNSW graph, approximate by design (local mode has none: it is exact).
                results = [
                    [(h.id, h.score) for h in store.query("bench", s)]
                    for s in data.query_specs(mode, filtered, exact=True)
                ]
            out["results"][key] = results
    store.close()
    return out


def _worker_main(argv: list[str]) -> None:
    step, engine, dtype, pooling, path, data_json = argv
    data = BenchData(**json.loads(data_json))
    if step == "write":
        res = work_write(engine, dtype, path, data, int(pooling))
    else:
        res = work_search(engine, path, data)
    print("BENCH_RESULT " + json.dumps(res))


def _run_worker(
    step: str, engine: str, dtype: str, path: str, data: BenchData, pooling: int = 1
) -> dict[str, Any]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bgem3_qdrant.tools.bench_store",
            step,
            engine,
            dtype,
            str(pooling),
            path,
            json.dumps(asdict(data)),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            return dict(json.loads(line[len("BENCH_RESULT ") :]))
    raise RuntimeError(f"bench worker {step} {engine} failed:\n{proc.stderr[-3000:]}")


def compare(
    a: list[list[tuple[str, float]]], b: list[list[tuple[str, float]]], k: int = 10
) -> dict[str, float]:
    """Top-k agreement (mean overlap / k, and share of queries with identical ordered ids) and score diff."""
    overlap, identical, diffs = [], 0, [0.0]
    for ra, rb in zip(a, b, strict=True):
        ia, ib = [i for i, _ in ra[:k]], [i for i, _ in rb[:k]]
        overlap.append(len(set(ia) & set(ib)) / len(ia) if ia or ib else 1.0)
        identical += ia == ib
        sb = dict(rb)
        diffs += [abs(s - sb[i]) for i, s in ra if i in sb]
    return {
        "top_k_overlap": float(np.mean(overlap)),
        "identical_order": identical / len(a),
        "max_score_diff": max(diffs),
    }


def run_store_bench(
    data: BenchData,
    *,
    engines: list[str],
    dtypes: list[str],
    workdir: str | None = None,
    keep: bool = False,
    poolings: tuple[int, ...] = (1,),
) -> dict[str, Any]:
    """Write and search each (engine, dtype, ColBERT pooling factor) in fresh processes, interleaved;
    returns every figure. A pooled run is named `edge/float16/pool2`."""
    root = Path(workdir or tempfile.mkdtemp(prefix="bgem3-store-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, Any]] = {}
    combos = [
        (engine, dtype, pooling)
        for engine in engines
        for dtype in (dtypes if engine == "edge" else ["float32"])
        for pooling in poolings
    ]
    try:
        for engine, dtype, pooling in combos:
            name = f"{engine}/{dtype}" + (f"/pool{pooling}" if pooling > 1 else "")
            path = str(root / name.replace("/", "-"))
            shutil.rmtree(path, ignore_errors=True)
            res = _run_worker("write", engine, dtype, path, data, pooling)
            res.update(_run_worker("search", engine, dtype, path, data))
            res["colbert_pooling"] = pooling
            res["pool_ms_per_chunk"] = res["pool_s"] * 1000 / data.chunks
            res["write_chunks_per_s"] = data.chunks / res["write_s"]
            res["disk_per_chunk_kb"] = res["disk_bytes"] / data.chunks / 1024
            res["disk_vs_raw_f32_colbert"] = res["disk_bytes"] / data.raw_colbert_bytes
            runs[name] = res
            if not keep:
                shutil.rmtree(path, ignore_errors=True)
    finally:
        if not keep and workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    base = next((k for k in runs if k.endswith("float32")), None)
    agreement: dict[str, dict[str, Any]] = {}
    if base is not None:
        for name, res in runs.items():
            if name != base:
                agreement[name] = {
                    m: compare(runs[base]["results"][m], res["results"][m]) for m in res["results"]
                }
    return {
        "data": asdict(data),
        "cpu": cpu_model(),
        "load": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "runs": {k: {kk: vv for kk, vv in v.items() if kk != "results"} for k, v in runs.items()},
        "agreement_vs": base,
        "agreement": agreement,
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} x{os.cpu_count()}"


TARGETS = (
    "targets at 3,000 chunks: rerank p95 <= 100 ms (with and without filter), reopen <= 1 s, "
    "disk <= 0.6x raw float32 ColBERT, writes >= 200 chunks/s"
)


def format_report(rep: dict[str, Any]) -> str:
    """A table per figure, engines side by side, then agreement with the float32 run."""
    runs = rep["runs"]
    names = list(runs)
    w = max(14, *(len(n) + 2 for n in names))
    d = rep["data"]
    lines = [
        f"bench-store: {d['chunks']} chunks, dense {d['dim']}, ColBERT {d['tokens']} x {d['dim']}, "
        f"{d['sparse']} sparse weights, {d['queries']} queries; CPU {rep['cpu']}; load {rep['load']}",
        "".ljust(34) + "".join(n.rjust(w) for n in names),
    ]

    def row(label: str, fmt: str, get: Any) -> None:
        lines.append(label.ljust(34) + "".join(format(get(runs[n]), fmt).rjust(w) for n in names))

    row("write (chunks/s)", ".0f", lambda r: r["write_chunks_per_s"])
    row("optimize after write (s)", ".1f", lambda r: r["optimize_s"])
    row("disk per chunk (KiB)", ".0f", lambda r: r["disk_per_chunk_kb"])
    if any(r.get("colbert_pooling", 1) > 1 for r in runs.values()):
        row("ColBERT pooling factor", "d", lambda r: r.get("colbert_pooling", 1))
        row("ColBERT rows per chunk", ".1f", lambda r: r["colbert_rows"] / d["chunks"])
        row("pooling (ms per chunk)", ".2f", lambda r: r["pool_ms_per_chunk"])
    row("disk / raw float32 ColBERT", ".2f", lambda r: r["disk_vs_raw_f32_colbert"])
    row("reopen (s)", ".3f", lambda r: r["reopen_s"])
    row("resident memory after open (MiB)", ".0f", lambda r: r["rss_mb"])
    for key in runs[names[0]]["latency_ms"]:
        row(f"{key} p50 / p95 (ms)", "", lambda r, key=key: "{:.1f} / {:.1f}".format(*r["latency_ms"][key]))
    if rep["agreement"]:
        lines.append(
            f"agreement with {rep['agreement_vs']}, exact candidates (top-10 overlap, identical order, "
            "max score diff):"
        )
        for name, per_mode in rep["agreement"].items():
            for mode, a in per_mode.items():
                overlap, same, diff = a["top_k_overlap"], a["identical_order"], a["max_score_diff"]
                lines.append(f"  {name:<16} {mode:<16} {overlap:.3f}  {same:.2f}  {diff:.2e}")
    lines.append(TARGETS)
    return "\n".join(lines)


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
