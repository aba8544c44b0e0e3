"""`bgem3-qdrant eval` throughput on a synthetic 3,000-document BEIR corpus, unpooled and pooled side by side.

    python benchmarks/qdrant_eval.py [--model DIR] [--docs 3000] [--queries 200] [--workdir DIR]

Without --model it generates a random checkpoint of BGE-M3's width with one layer (hidden 1024, 16 heads,
FFN 4096, the tiny test tokenizer; needs torch, the dev extra): vectors of the real sizes (1024-d dense and
ColBERT rows), so the store's work per query is the real one, while encoding stays fast. The weights are
random, so the quality figures mean nothing; the queries/s per mode and bytes per chunk are what this
measures. Each query is six words of its target document (grade 2); a second document sharing its first
word is grade 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ne",
    "ru",
    "sa",
    "ti",
    "vo",
    "ze",
    "pa",
    "de",
    "fi",
    "gu",
    "ho",
    "ja",
    "ke",
    "li",
    "mo",
    "nu",
    "pi",
    "ra",
    "se",
    "to",
    "vu",
    "wa",
    "xi",
    "yo",
    "zu",
]


def write_dataset(root: Path, docs: int, queries: int, seed: int = 0) -> Path:
    """A BEIR folder: `docs` documents of 40-80 pseudo-words, `queries` judged queries."""
    rng = np.random.default_rng(seed)
    vocab = sorted({"".join(rng.choice(SYLLABLES, size=int(rng.integers(2, 4)))) for _ in range(6000)})
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    texts = []
    with (root / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for i in range(docs):
            words = list(rng.choice(vocab, size=int(rng.integers(40, 81))))
            texts.append(words)
            rec = {"_id": f"d{i}", "title": " ".join(words[:3]), "text": " ".join(words[3:])}
            f.write(json.dumps(rec) + "\n")
    by_first: dict[str, list[int]] = {}
    for i, words in enumerate(texts):
        by_first.setdefault(words[0], []).append(i)
    qrels = ["query-id\tcorpus-id\tscore"]
    with (root / "queries.jsonl").open("w", encoding="utf-8") as f:
        for qn, target in enumerate(rng.choice(docs, size=queries, replace=False)):
            words = texts[int(target)]
            f.write(json.dumps({"_id": f"q{qn}", "text": " ".join(rng.choice(words, size=6))}) + "\n")
            qrels.append(f"q{qn}\td{target}\t2")
            for other in by_first[words[0]][:2]:
                if other != target:
                    qrels.append(f"q{qn}\td{other}\t1")
    (root / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n", encoding="utf-8")
    return root


def wide_checkpoint(out: Path) -> Path:
    """BGE-M3's width (1024 hidden, 16 heads, FFN 4096) with one layer and the tiny tokenizer."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import tiny_checkpoint as tc

    if not (out / "config.json").is_file():
        tc.SIZES["wide"] = {**tc.SIZES["full"], "num_hidden_layers": 1}
        tc.make_tiny_checkpoint(out, size="wide", seed=0)  # type: ignore[arg-type]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="Checkpoint folder (default: a generated 1-layer 1024-d one).")
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--workdir", default="bench-eval")
    ap.add_argument("--poolings", default="1,2")
    args = ap.parse_args(argv)
    work = Path(args.workdir)
    model = args.model or str(wide_checkpoint(work / "wide-checkpoint"))
    data = work / "synthetic-beir"
    if not (data / "corpus.jsonl").is_file():
        write_dataset(data, args.docs, args.queries)

    from bgem3_qdrant import IngestOptions, open_store, resolve_target
    from bgem3_qdrant.encoder import load_encoder
    from bgem3_qdrant.evaluation import EvalOptions, evaluate

    encoder = load_encoder(model, precision="float32", device="cpu")
    names = []
    with open_store(resolve_target(path=str(work / "store"))) as store:
        for factor in (int(f) for f in args.poolings.split(",")):
            name = f"pool{factor}"
            names.append(name)
            if not store.collection_exists(name):
                t0 = time.perf_counter()
                opts = IngestOptions(colbert_pooling=factor, show_progress=False)
                only_dense = EvalOptions(modes=("dense",), show_progress=False)
                evaluate(store, [name], encoder, data, options=only_dense, ingest_options=opts)
                sys.stdout.write(f"ingested {name} in {time.perf_counter() - t0:.0f} s\n")
        report = evaluate(store, names, encoder, data, options=EvalOptions(show_progress=False))
    sys.stdout.write(report.format() + "\n")
    for c in report.collections:
        qps = ", ".join(f"{m} {r.queries_per_s:.1f}" for m, r in c.modes.items())
        sys.stdout.write(f"queries/s per mode, {c.collection}: {qps}\n")
    (work / "report.json").write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
