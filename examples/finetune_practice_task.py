"""A generated retrieval task to practise `bgem3 finetune` on: train queries, held-out queries, one corpus.

    python examples/finetune_practice_task.py OUT [--documents 200] [--seed 0]

writes, in BEIR's layout for `bgem3-qdrant eval` and FlagEmbedding's for `bgem3 finetune`:
    OUT/corpus.jsonl         every document (`_id`, `title`, `text`)
    OUT/queries.jsonl        every query (`_id`, `text`)
    OUT/qrels/test.tsv       the held-out queries' relevant documents (a quarter of the queries)
    OUT/train.jsonl          the other queries: {"query", "pos": [its document], "neg": [other documents]}

Each document is about two key words drawn from a pool of words, buried among common filler words; its query
names the same two keys among other fillers. What a model has to learn is which words carry meaning and
which are filler: held-out queries are about documents (and key pairs) no training query saw, made of the same
words. The words are word pieces, not a real data set; the task exists so a run can show
that training moved retrieval, nothing more.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

# Words that are one token each for the tiny test checkpoint's tokenizer too (it has 512 pieces), so that
# the lexical (sparse) mode can tell them apart there as well.
KEYS = (  # noqa: SIM905 - a line of words reads better than a list
    "document retrieval relevant question text model learn token user pass marr ein vector bru mot rap bra "
    "ret den par per"
).split()
FILLERS = (  # noqa: SIM905
    "is de to ca an wi sa so we un le sp th br vo it la qu on su mo re pr ba ma ra do ve in sc se"
).split()
NEGATIVES_PER_QUERY = 7


def document_text(keys: tuple[str, str], rng: random.Random) -> str:
    words = [*keys, *keys, *rng.sample(FILLERS, 10)]
    rng.shuffle(words)
    return " ".join(words)


def query_text(keys: tuple[str, str], rng: random.Random) -> str:
    words = [*keys, *rng.sample(FILLERS, 6)]
    rng.shuffle(words)
    return " ".join(words)


def make_task(out: Path, documents: int = 200, seed: int = 0) -> dict[str, int]:
    """Write the task into `out`; returns the counts."""
    rng = random.Random(seed)
    pairs = [(a, b) for i, a in enumerate(KEYS) for b in KEYS[i + 1 :]]
    rng.shuffle(pairs)
    if documents > len(pairs):
        raise ValueError(f"at most {len(pairs)} documents (one per key pair)")
    pairs = pairs[:documents]
    corpus = [{"_id": f"d{i}", "title": "", "text": document_text(keys, rng)} for i, keys in enumerate(pairs)]
    queries = [{"_id": f"q{i}", "text": query_text(keys, rng)} for i, keys in enumerate(pairs)]
    held_out = set(range(0, documents, 4))
    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    _write_jsonl(out / "corpus.jsonl", corpus)
    _write_jsonl(out / "queries.jsonl", queries)
    lines = ["query-id\tcorpus-id\tscore"] + [f"q{i}\td{i}\t1" for i in sorted(held_out)]
    (out / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    train = []
    for i in range(documents):
        if i in held_out:
            continue
        others = [j for j in range(documents) if j != i]
        negatives = [corpus[j]["text"] for j in rng.sample(others, NEGATIVES_PER_QUERY)]
        train.append({"query": queries[i]["text"], "pos": [corpus[i]["text"]], "neg": negatives})
    _write_jsonl(out / "train.jsonl", train)
    return {"documents": documents, "train_queries": len(train), "held_out_queries": len(held_out)}


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--documents", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    counts = make_task(args.out, args.documents, args.seed)
    print(", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items()), f"in {args.out}")


if __name__ == "__main__":
    main()
