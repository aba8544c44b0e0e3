"""One model served at each precision: resident memory, speed beside float32, fidelity to the reference.

For each `--precisions` entry (float32, bfloat16, int8) on one checkpoint, in one run:

- fidelity: the encoder's dense, sparse and ColBERT outputs on the project's test texts (a seeded corpus of
  `--texts` texts up to 256 tokens, `bgem3_embeddings.bench.corpus`) against the reference, transformers'
  PyTorch XLMRobertaModel with FlagEmbedding's heads on the same weights (`tests/reference_m3.py`): dense
  cosine, centred cosine, ColBERT and lexical score differences (`bench.quality.compare_outputs`), and top-k
  agreement of the passages each query ranks first (dense, ColBERT, sparse+dense);
- speed: 64 short queries and 16 passages encoded in one call each, every precision in turn, `--rounds`
  rounds (so the machine's load falls on all of them alike), tokens/s and the ratio to float32;
- memory: a `bgem3 serve --precision P` process after warm-up traffic (queries and passages from 4
  clients): VmRSS and its peak (VmHWM).

Needs the dev extra (torch, transformers for the reference) and Linux for the memory figures.

    python benchmarks/serve_precision.py --model /tmp/bgem3-full --json /tmp/precision.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests.reference_m3

ALL = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}


def topk_agreement(ref: np.ndarray, other: np.ndarray, k: int) -> float:
    """Mean overlap of each row's k highest-scoring columns (query x passage scores), 0-1."""
    k = min(k, ref.shape[1])
    top_ref = np.argsort(-ref, axis=1)[:, :k]
    top_other = np.argsort(-other, axis=1)[:, :k]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(top_ref, top_other, strict=True)]))


def score_matrices(out: dict[str, Any], queries: list[int], passages: list[int]) -> dict[str, np.ndarray]:
    from bgem3_embeddings.scoring import colbert_score, lexical_matching_score

    dense = out["dense_vecs"][queries] @ out["dense_vecs"][passages].T
    colbert = np.array(
        [[colbert_score(out["colbert_vecs"][q], out["colbert_vecs"][p]) for p in passages] for q in queries]
    )
    weights = out["lexical_weights"]
    sparse = np.array([[lexical_matching_score(weights[q], weights[p]) for p in passages] for q in queries])
    return {"dense": dense, "colbert": colbert, "sparse+dense": sparse + dense}


def fidelity(
    ref: dict[str, Any], out: dict[str, Any], queries: list[int], passages: list[int]
) -> dict[str, float]:
    from bgem3_embeddings.bench.quality import compare_outputs

    report = compare_outputs(ref, out, queries, passages)
    ref_scores, scores = score_matrices(ref, queries, passages), score_matrices(out, queries, passages)
    for name in ref_scores:
        report[f"top1_{name}"] = topk_agreement(ref_scores[name], scores[name], 1)
        report[f"top3_{name}"] = topk_agreement(ref_scores[name], scores[name], 3)
    return report


def throughput(encoders: dict[str, Any], workloads: dict[str, list[str]], rounds: int) -> dict[str, Any]:
    """tokens/s of each precision per workload, every precision once per round (interleaved)."""
    rates: dict[str, dict[str, list[float]]] = {p: {w: [] for w in workloads} for p in encoders}
    for enc in encoders.values():  # warm-up: graph tracing, the int8 interpreter's arena
        for texts in workloads.values():
            enc.encode(texts[:16], **ALL)
    for _ in range(rounds):
        for workload, texts in workloads.items():
            for precision, enc in encoders.items():
                tokens = sum(len(ids) for ids in enc.tokenize(texts, 8192))
                method = enc.encode_queries if workload == "queries" else enc.encode_corpus
                t0 = time.perf_counter()
                method(texts, **ALL)
                rates[precision][workload].append(tokens / (time.perf_counter() - t0))
    summary: dict[str, Any] = {}
    for precision, per in rates.items():
        summary[precision] = {}
        for workload, values in per.items():
            fp32 = rates.get("float32", {}).get(workload)
            ratios = [v / f for v, f in zip(values, fp32, strict=True)] if fp32 else []
            summary[precision][workload] = {
                "tokens_per_s": values,
                "median_tokens_per_s": statistics.median(values),
                "ratio_to_float32_per_round": ratios,
                "median_ratio_to_float32": statistics.median(ratios) if ratios else None,
            }
    return summary


def server_memory(model: str, precision: str, workloads: dict[str, list[str]]) -> dict[str, float | None]:
    from bgem3_embeddings.serve.bench import server_process, through_server
    from bgem3_embeddings.serve.soak import rss_mb

    with server_process(model, precision, []) as (proc, url):
        started = rss_mb(proc.pid)[0]
        through_server(url, workloads["queries"], "queries", 4, ALL, 64)
        through_server(url, workloads["passages"], "passages", 4, ALL, 512)
        rss, peak = rss_mb(proc.pid)
    return {"rss_started_mb": started, "rss_after_traffic_mb": rss, "peak_rss_mb": peak}


def cpu_kind() -> dict[str, Any]:
    from bgem3_embeddings.devices import read_cpu_flags
    from bgem3_embeddings.serve.bench import cpu_model

    flags = read_cpu_flags()
    return {
        "model": cpu_model(),
        "cores": os.cpu_count(),
        "int8_dot": sorted(flags & {"avx512_vnni", "avx_vnni", "amx_int8"}),
        "bf16": sorted(flags & {"avx512_bf16", "amx_bf16"}),
        "avx512f": "avx512f" in flags,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="local checkpoint directory")
    parser.add_argument("--precisions", default="float32,bfloat16,int8")
    parser.add_argument("--texts", type=int, default=24, help="test texts for fidelity (up to 256 tokens)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: fidelity,speed,memory")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]

    from bgem3_embeddings.cli_support import start_tensorflow_quietly

    start_tensorflow_quietly()
    from bgem3_embeddings.bench.corpus import build_corpus
    from bgem3_embeddings.bench.quality import encode_all
    from bgem3_embeddings.encoder import BGEM3Encoder
    from bgem3_embeddings.serve.bench import PASSAGE_TOKENS, QUERY_TOKENS, make_texts
    from bgem3_embeddings.serve.soak import load_average

    figures: dict[str, Any] = {"cpu": cpu_kind(), "load_start": load_average(), "model": args.model}
    print(json.dumps(figures["cpu"]), flush=True)
    encoders = {
        p: BGEM3Encoder(args.model, precision=p, device="cpu", show_progress=False) for p in precisions
    }
    figures["compute_dtype"] = {p: e.compute_dtype for p, e in encoders.items()}
    first = next(iter(encoders.values()))
    corpus = build_corpus(first.tokenizer, args.texts, seed=3, max_length=256)
    counts = [len(ids) for ids in corpus.token_ids]
    queries = [i for i, n in enumerate(counts) if n <= 32]
    passages = [i for i, n in enumerate(counts) if n > 32]
    figures["fidelity_texts"] = {"texts": len(counts), "queries": len(queries), "passages": len(passages)}

    if "fidelity" not in skip:
        from tests.reference_m3 import ReferenceM3

        reference = ReferenceM3(Path(args.model))
        token_ids = first.tokenize(corpus.texts, 256)
        ref = reference.encode_ids(token_ids)
        del reference
        gc.collect()
        figures["fidelity"] = {}
        for precision, enc in encoders.items():
            out = encode_all(enc, corpus.texts, 256)
            figures["fidelity"][precision] = fidelity(ref, out, queries, passages)
            print(precision, json.dumps(figures["fidelity"][precision]), flush=True)

    workloads = {
        "queries": make_texts(first.tokenizer, 64, QUERY_TOKENS, seed=1),
        "passages": make_texts(first.tokenizer, 16, PASSAGE_TOKENS, seed=2),
    }
    if "speed" not in skip:
        figures["speed"] = throughput(encoders, workloads, args.rounds)
        for precision, per in figures["speed"].items():
            print(precision, {w: (round(v["median_tokens_per_s"]), v["median_ratio_to_float32"])
                              for w, v in per.items()}, flush=True)  # fmt: skip
    del encoders, first
    gc.collect()
    if "memory" not in skip:
        figures["server_memory"] = {}
        for precision in precisions:
            figures["server_memory"][precision] = server_memory(args.model, precision, workloads)
            print(precision, figures["server_memory"][precision], flush=True)
    figures["load_end"] = load_average()
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
