"""The queries `bgem3-qdrant mine` reads: a BEIR folder (what `eval` reads) or FlagEmbedding's JSONL.

    BEIR folder     queries.jsonl + qrels/<split>.tsv: positives are the documents judged with a grade > 0,
                    named by their id (the payload's doc_id); corpus.jsonl is not needed
    JSONL file      one {"query": str, "pos": [str, ...], ...} a line (FlagEmbedding's training format,
                    `neg` optional): positives are texts, matched to the stored chunks holding that text

>>> [q.id for q in read_query_set("data/scifact", split="train")]     # doctest: +SKIP
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BGEM3QdrantError, SourceError
from ..evaluation.beir import load_beir

# Keys of a JSONL line that mining replaces (stale once the negatives are new); the others pass through,
# as FlagEmbedding's hn_mine writes each input line back with its new `neg`.
REPLACED_KEYS = ("neg", "pos_scores", "neg_scores")


@dataclass(frozen=True)
class MineQuery:
    """One query to mine for: its text and its positives, by document id (BEIR) or by text (JSONL)."""

    id: str  # the BEIR query id, or `line<N>` for line N of a JSONL file
    text: str
    positive_docs: dict[str, int] = field(default_factory=dict)  # BEIR: doc id -> grade (> 0)
    positive_texts: tuple[str, ...] = ()  # JSONL: the `pos` texts
    extra: dict[str, Any] = field(default_factory=dict)  # the JSONL line's other keys (e.g. "prompt")


def read_query_set(path: str | Path, split: str = "test") -> list[MineQuery]:
    """The queries of a BEIR folder (its `split` qrels) or a FlagEmbedding JSONL file, in file order; one
    BGEM3QdrantError line for what cannot be read (a missing path, a bad line, no query at all)."""
    source = Path(path)
    if source.is_dir():
        queries = _from_beir(source, split)
    elif source.is_file():
        queries = _from_jsonl(source)
    else:
        raise BGEM3QdrantError(
            f"{source} not found (QUERIES): pass a BEIR folder (queries.jsonl + qrels/<split>.tsv) or a "
            'JSONL file of {"query": ..., "pos": [...]} lines'
        )
    if not queries:
        raise BGEM3QdrantError(f"{source} holds no query (QUERIES): nothing to mine")
    return queries


def _from_beir(root: Path, split: str) -> list[MineQuery]:
    data = load_beir(root, split)
    return [
        MineQuery(qid, text, positive_docs={d: g for d, g in data.qrels[qid].items() if g > 0})
        for qid, text in data.queries.items()
    ]


def _from_jsonl(path: Path) -> list[MineQuery]:
    queries = []
    with path.open(encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise SourceError(str(path), f"invalid JSON: {e.msg} (column {e.colno})", lineno) from e
            pos = rec.get("pos") if isinstance(rec, dict) else None
            if (
                not isinstance(rec, dict)
                or not isinstance(rec.get("query"), str)
                or not isinstance(pos, list)
                or not all(isinstance(p, str) for p in pos)
            ):
                raise SourceError(
                    str(path),
                    'a line needs a string "query" and a list of strings "pos" (FlagEmbedding)',
                    lineno,
                )
            extra = {k: v for k, v in rec.items() if k not in ("query", "pos", *REPLACED_KEYS)}
            queries.append(MineQuery(f"line{lineno}", rec["query"], positive_texts=tuple(pos), extra=extra))
    return queries
