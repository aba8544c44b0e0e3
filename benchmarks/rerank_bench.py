"""Rerank throughput: BGEM3Reranker (fp32, bf16) against FlagEmbedding's FlagReranker (torch fp32, bf16).

The work is the issue's: one query and N passages of about T tokens each (100 x 256 by default), scored by
`compute_score` as a user calls it (tokenization included), on a full-size random-weight
bge-reranker-v2-m3 layout checkpoint (generated once with tests/tiny_checkpoint.py; needs torch). Every
engine runs in its own fresh process, one after the other; with --rounds R the engines are interleaved R
times so drifting load on a shared machine hits them alike, and each engine's best pass is reported.
Tokens counted are the pairs' own (`<s> q </s></s> p </s>`, the same ids for every engine).

    python benchmarks/rerank_bench.py                              # full size, all four engines
    python benchmarks/rerank_bench.py --size tiny --passages 20    # a quick check of the script
    python benchmarks/rerank_bench.py --model DIR --engines ours-float32,flag-float32 --rounds 2 --json o.json

Engines: ours-float32, ours-bfloat16 (bf16 weights; matmuls in bf16 only on CPUs with native bf16, fp32
elsewhere, as precision="bfloat16" chooses), ours-bfloat16:bfloat16 (bf16 matmuls forced), ours-int8
(TFLite/XNNPACK, converted once per checkpoint: the first run pays minutes of conversion), flag-float32,
flag-bfloat16 (FlagReranker's model cast to torch.bfloat16: its use_fp16 is ignored on CPUs).
colbert (not a cross-encoder: BGE-M3's ColBERT rerank, for the cost comparison in docs/rerank.md) runs
BGEM3Encoder fp32 on a full-size random BGE-M3 checkpoint (`bgem3 bench`'s, --m3-model to choose another):
its per-query cost is one query encode plus MaxSim against the passages' stored vectors, which are
computed at indexing time (timed apart, as "index").
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
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ENGINES = ("ours-float32", "ours-bfloat16", "ours-int8", "flag-float32", "flag-bfloat16")
QUERY = "Which animal jumps over the lazy dog, and what do search engines return for a question?"
WORKER_TIMEOUT_S = 3600


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def checkpoint(size: str, cache: Path) -> Path:
    """A random-weight reranker checkpoint of `size`, generated once into `cache`."""
    out = cache / f"reranker-{size}-random-seed0"
    if not (out / "config.json").is_file() or not (out / "model.safetensors").is_file():
        sys.path.insert(0, str(REPO))
        from tests.tiny_checkpoint import make_tiny_reranker_checkpoint

        print(f"generating a {size} random reranker checkpoint in {out} ...", file=sys.stderr)
        make_tiny_reranker_checkpoint(out, weights="safetensors", size=size, seed=0)  # type: ignore[arg-type]
    return out


def passages(model: Path, count: int, tokens: int) -> list[str]:
    """`count` different passages of `tokens` tokens each (without special tokens), cut at a token end."""
    sys.path.insert(0, str(REPO))
    from bgem3_embeddings.tokenizer import BGEM3Tokenizer
    from tests.tiny_checkpoint import SAMPLE_TEXT

    tokenizer = BGEM3Tokenizer.from_dir(model)
    out = []
    for i in range(count):
        sentences = SAMPLE_TEXT[i % len(SAMPLE_TEXT) :] + SAMPLE_TEXT[: i % len(SAMPLE_TEXT)]
        text = " ".join(sentences * 4)
        ends = [
            stop
            for _, stop in tokenizer([text], add_special_tokens=False, return_offsets_mapping=True)[
                "offset_mapping"
            ][0][:tokens]
        ]
        out.append(text[: ends[-1]])
    return out


def random_checkpoint_m3(cache: Path) -> Path:
    """`bgem3 bench`'s full-size random BGE-M3 checkpoint (generated once; needs torch)."""
    from bgem3_embeddings.bench.run import random_checkpoint

    return random_checkpoint(cache)


def tokens_of_passages(texts: list[str], model: Path) -> int:
    """Tokens of the passages alone, with <s> and </s> (what indexing encodes)."""
    from bgem3_embeddings.tokenizer import BGEM3Tokenizer

    return sum(len(ids) for ids in BGEM3Tokenizer.from_dir(model).encode_batch(texts, 512))


# ------------------------------------------------------------------------------------------------ worker
def _load(engine: str, model: str, batch_size: int) -> tuple[Any, str]:
    """(object with compute_score, the dtype its matmuls run in)."""
    kind, _, precision = engine.partition("-")
    if kind == "ours":
        from bgem3_embeddings import BGEM3Reranker

        weights, _, compute = precision.partition(":")
        reranker = BGEM3Reranker(
            model, precision=weights, compute_dtype=compute or "auto", device="cpu", batch_size=batch_size
        )
        return reranker, reranker.compute_dtype
    import torch

    sys.path.insert(0, str(REPO))
    from tests.flagembedding_ref import flag_reranker

    flag = flag_reranker(Path(model), batch_size=batch_size)
    if precision == "bfloat16":
        flag.model.to(torch.bfloat16)
    return flag, precision


def colbert_worker(spec: dict) -> dict:
    """BGE-M3's ColBERT rerank of the same passages: their vectors encoded once (indexing, timed apart),
    then per pass one query encode and MaxSim against each passage's vectors."""
    from bgem3_embeddings import BGEM3Encoder
    from bgem3_embeddings.scoring import colbert_score

    start = time.perf_counter()
    encoder = BGEM3Encoder(spec["m3_model"], precision="float32", device="cpu", batch_size=spec["batch_size"])
    load_s = time.perf_counter() - start
    colbert = {"return_dense": False, "return_colbert_vecs": True}
    encoder.encode(spec["passages"][:8], max_length=512, **colbert)  # tracing, as the other engines
    start = time.perf_counter()
    stored = encoder.encode(spec["passages"], max_length=512, **colbert)["colbert_vecs"]
    index_s = time.perf_counter() - start
    walls, scores = [], []
    for _ in range(spec["repeats"]):
        start = time.perf_counter()
        query = encoder.encode(spec["query"], max_length=512, **colbert)["colbert_vecs"]
        scores = [colbert_score(query, p) for p in stored]
        walls.append(time.perf_counter() - start)
    return {"compute_dtype": encoder.compute_dtype, "load_s": load_s, "walls": walls, "scores": scores,
            "index_s": index_s}  # fmt: skip


def worker(spec_path: Path, out_path: Path) -> None:
    """Load one engine, warm it up, time `repeats` passes of compute_score over the pairs."""
    from bgem3_embeddings.bench.worker import hwm_mb, rss_mb

    spec = json.loads(spec_path.read_text())
    if spec["engine"] == "colbert":
        result = {"engine": "colbert", **colbert_worker(spec), "rss_mb": rss_mb(), "peak_rss_mb": hwm_mb(),
                  "threads": _threads("colbert")}  # fmt: skip
        out_path.write_text(json.dumps(result))
        return
    pairs = [(spec["query"], p) for p in spec["passages"]]
    start = time.perf_counter()
    engine, compute = _load(spec["engine"], spec["model"], spec["batch_size"])
    load_s = time.perf_counter() - start
    engine.compute_score(pairs[: min(8, len(pairs))])  # tracing, kernel choice, thread pools
    walls, scores = [], None
    for _ in range(spec["repeats"]):
        start = time.perf_counter()
        scores = engine.compute_score(pairs, batch_size=spec["batch_size"])
        walls.append(time.perf_counter() - start)
    result = {
        "engine": spec["engine"],
        "compute_dtype": compute,
        "load_s": load_s,
        "walls": walls,
        "rss_mb": rss_mb(),
        "peak_rss_mb": hwm_mb(),
        "scores": [float(s) for s in scores or []],
        "threads": _threads(spec["engine"]),
    }
    out_path.write_text(json.dumps(result))


def _threads(engine: str) -> int:
    if engine.startswith("flag"):  # colbert runs on TensorFlow as ours
        import torch

        return int(torch.get_num_threads())
    import tensorflow as tf

    return int(tf.config.threading.get_intra_op_parallelism_threads())


def run_engine(spec: dict, workdir: Path) -> dict:
    """One engine in a fresh interpreter; a failure is reported, not fatal."""
    name = spec["engine"].replace(":", "-")
    spec_path, out_path = workdir / f"{name}.json", workdir / f"{name}.out.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", str(spec_path), str(out_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=WORKER_TIMEOUT_S,
    )
    if proc.returncode != 0 or not out_path.is_file():
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        return {"engine": spec["engine"], "error": f"exit {proc.returncode}: {tail}"}
    result: dict = json.loads(out_path.read_text())
    return result


# ------------------------------------------------------------------------------------------------ report
def summarize(results: list[dict], tokens: int, pairs: int) -> list[dict]:
    """Per engine: the best pass over all rounds, as tokens/s and pairs/s."""
    rows: dict[str, dict] = {}
    for r in results:
        if "error" in r:
            rows.setdefault(r["engine"], {"engine": r["engine"], "error": r["error"]})
            continue
        best = min(r["walls"])
        row = rows.get(r["engine"])
        if row is None or "error" in row or best < row["wall_s"]:
            rows[r["engine"]] = {
                "engine": r["engine"],
                "compute_dtype": r["compute_dtype"],
                "wall_s": best,
                "tokens_per_s": tokens / best,
                "pairs_per_s": pairs / best,
                "load_s": r["load_s"],
                "peak_rss_mb": r["peak_rss_mb"],
                "threads": r["threads"],
                "scores": r["scores"],
                **({"index_s": r["index_s"]} if "index_s" in r else {}),
            }
    return list(rows.values())


def ratios(rows: list[dict]) -> dict[str, float]:
    """ours / FlagReranker throughput at the same weights precision (int8 against FlagReranker's fp32: it
    has no int8)."""
    by = {r["engine"]: r for r in rows if "error" not in r}
    out = {}
    for ours in by:
        if not ours.startswith("ours-"):
            continue
        weights = ours.removeprefix("ours-").partition(":")[0].replace("int8", "float32")
        flag = by.get(f"flag-{weights}")
        if flag is not None:
            out[f"{ours} / flag-{weights}"] = by[ours]["tokens_per_s"] / flag["tokens_per_s"]
    return out


def score_agreement(rows: list[dict]) -> dict[str, float]:
    """Largest |score - flag-float32's score| per engine: the engines computed the same thing."""
    import numpy as np

    by = {r["engine"]: np.asarray(r["scores"]) for r in rows if "error" not in r}
    ref = by.get("flag-float32")
    if ref is None:
        return {}
    # ColBERT's MaxSim is another score of another model: nothing to agree with.
    return {
        name: float(np.abs(s - ref).max())
        for name, s in by.items()
        if name not in ("flag-float32", "colbert")
    }


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--worker"]:
        worker(Path(args[1]), Path(args[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="reranker checkpoint folder (default: a random one of --size)")
    parser.add_argument("--size", choices=["full", "tiny"], default="full")
    parser.add_argument("--cache", type=Path, default=REPO / ".cache" / "bench")
    parser.add_argument("--passages", type=int, default=100)
    parser.add_argument("--passage-tokens", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=128, help="FlagReranker's default")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="timed passes per process (best kept)")
    parser.add_argument("--m3-model", help="BGE-M3 checkpoint of the colbert engine (default: bgem3 bench's)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    options = parser.parse_args(args)
    model = Path(options.model) if options.model else checkpoint(options.size, options.cache)
    texts = passages(model, options.passages, options.passage_tokens)

    from bgem3_embeddings.reranker.pairs import pair_token_ids
    from bgem3_embeddings.tokenizer import BGEM3Tokenizer

    token_ids = pair_token_ids(BGEM3Tokenizer.from_dir(model), [(QUERY, p) for p in texts], 512)
    tokens = sum(len(t) for t in token_ids)
    engines = [e for e in options.engines.split(",") if e]
    base = {"model": str(model), "query": QUERY, "passages": texts, "batch_size": options.batch_size,
            "repeats": options.repeats}  # fmt: skip
    if "colbert" in engines:
        base["m3_model"] = options.m3_model or str(random_checkpoint_m3(options.cache))
    results = []
    with tempfile.TemporaryDirectory(prefix="rerank-bench-") as tmp:
        for round_ in range(options.rounds):
            for engine in engines:
                print(f"round {round_ + 1}/{options.rounds}: {engine} ...", file=sys.stderr, flush=True)
                results.append(run_engine({**base, "engine": engine}, Path(tmp)))
    rows = summarize(results, tokens, len(texts))
    print(f"cpu: {cpu_model()}, {len(os.sched_getaffinity(0))} usable cores; model: {model}")
    print(f"work: 1 query x {len(texts)} passages of {options.passage_tokens} tokens = {tokens} pair tokens "
          f"(max_length 512, batch_size {options.batch_size}); best of {options.rounds} round(s) x "
          f"{options.repeats} pass(es)")  # fmt: skip
    heading = ("engine", "matmuls", "tok/s", "pairs/s", "wall s", "load s", "peak MB")
    print(f"{heading[0]:<26} {heading[1]:>9} {heading[2]:>8} {heading[3]:>8} {heading[4]:>7} {heading[5]:>7} "
          f"{heading[6]:>8}")  # fmt: skip
    for r in rows:
        if "error" in r:
            print(f"{r['engine']:<26} failed: {r['error']}")
            continue
        # ColBERT reads no pairs: its wall is one query encode plus MaxSim, no pair tokens per second.
        rate = "-" if r["engine"] == "colbert" else f"{r['tokens_per_s']:.0f}"
        print(f"{r['engine']:<26} {r['compute_dtype']:>9} {rate:>8} {r['pairs_per_s']:>8.2f} "
              f"{r['wall_s']:>7.2f} {r['load_s']:>7.1f} {r['peak_rss_mb']:>8.0f}")  # fmt: skip
    for r in rows:
        if r["engine"] == "colbert" and "error" not in r:
            indexed = tokens_of_passages(texts, Path(base["m3_model"])) / r["index_s"]
            print(f"colbert: per query {r['wall_s'] * 1000:.0f} ms (1 query encode + {len(texts)} MaxSim); "
                  f"the passages' vectors at indexing {r['index_s']:.1f} s ({indexed:.0f} tok/s), once per "
                  f"passage")  # fmt: skip
    for name, value in ratios(rows).items():
        print(f"{name}: {value:.2f}x")
    for name, diff in score_agreement(rows).items():
        print(f"max |score - flag-float32| {name}: {diff:.2e}")
    if options.json:
        figures = {"cpu": cpu_model(), "tokens": tokens, "rows": rows, "ratios": ratios(rows),
                   "agreement": score_agreement(rows)}  # fmt: skip
        options.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
