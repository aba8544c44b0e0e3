"""A BEIR-format dataset folder: `corpus.jsonl`, `queries.jsonl` and `qrels/<split>.tsv`.

The corpus is read by `sources.py` when it is ingested (`_id` is the document id, the title joined to the
text as BEIR does); here only the queries and the relevance judgements are loaded. Every id ends up in
a TREC run file (`qid Q0 docid rank score tag`), whose fields are separated by whitespace, so an id
holding whitespace is refused where it is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import BGEM3QdrantError, SourceError

CORPUS = "corpus.jsonl"
QUERIES = "queries.jsonl"
QRELS_DIR = "qrels"


@dataclass
class BeirDataset:
    """The parts of a BEIR dataset an evaluation runs on: the split's judged queries and their qrels."""

    root: Path
    split: str
    queries: dict[str, str]  # query id -> text, only the queries the split's qrels judge
    qrels: dict[str, dict[str, int]]  # query id -> {document id: graded relevance}

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def corpus(self) -> Path:
        return self.root / CORPUS

    def relevant_queries(self) -> int:
        """Queries with at least one document judged relevant (grade > 0)."""
        return sum(any(g > 0 for g in docs.values()) for docs in self.qrels.values())


def _check_id(value: object, path: Path, line: int, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise SourceError(
            str(path), f"{what} must be a string or an integer, got {type(value).__name__}", line
        )
    text = str(value)
    if not text or any(ch.isspace() for ch in text):
        raise SourceError(
            str(path), f"{what} {text!r} is empty or holds whitespace (a TREC run file cannot hold it)", line
        )
    return text


def _missing(path: Path, split: str) -> BGEM3QdrantError:
    return BGEM3QdrantError(
        f"{path} not found (DATASET): a BEIR dataset folder holds {CORPUS}, {QUERIES} and "
        f"{QRELS_DIR}/{split}.tsv; download one (e.g. SciFact, docs/evaluation.md), unzip it and pass "
        "its folder"
    )


def load_queries(path: Path) -> dict[str, str]:
    """`_id` -> `text` of every line of a BEIR queries.jsonl."""
    queries: dict[str, str] = {}
    with path.open(encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise SourceError(str(path), f"invalid JSON: {e.msg} (column {e.colno})", lineno) from e
            if not isinstance(rec, dict) or "_id" not in rec or not isinstance(rec.get("text"), str):
                raise SourceError(str(path), "a BEIR query line needs '_id' and a string 'text'", lineno)
            queries[_check_id(rec["_id"], path, lineno, "query id")] = rec["text"]
    return queries


def load_qrels(path: Path) -> dict[str, dict[str, int]]:
    """A BEIR qrels file (tab-separated `query-id corpus-id score`, a header line first)."""
    qrels: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 3:
                raise SourceError(
                    str(path), f"expected 'query-id corpus-id score', got {line.strip()!r}", lineno
                )
            qid, docid, grade = fields
            try:
                score = int(grade)
            except ValueError as e:
                if lineno == 1:  # the header (query-id corpus-id score)
                    continue
                raise SourceError(str(path), f"the score {grade!r} is not an integer grade", lineno) from e
            qrels.setdefault(_check_id(qid, path, lineno, "query id"), {})[
                _check_id(docid, path, lineno, "document id")
            ] = score
    return qrels


def load_beir(root: str | Path, split: str = "test") -> BeirDataset:
    """Load a BEIR dataset folder's queries and `split` qrels; BGEM3QdrantError naming what is missing.
    corpus.jsonl may be absent (a held-out query set of `bgem3-qdrant mine`, evaluated against the
    collection that holds its documents): only filling an empty collection needs it."""
    base = Path(root)
    for part in (base / QUERIES, base / QRELS_DIR / f"{split}.tsv"):
        if not part.is_file():
            raise _missing(part, split)
    qrels = load_qrels(base / QRELS_DIR / f"{split}.tsv")
    if not qrels:
        raise BGEM3QdrantError(
            f"{base / QRELS_DIR / f'{split}.tsv'} judges no query (--split): pick a split with judgements"
        )
    all_queries = load_queries(base / QUERIES)
    unknown = sorted(set(qrels) - set(all_queries))
    if unknown:
        raise BGEM3QdrantError(
            f"{QRELS_DIR}/{split}.tsv judges {len(unknown)} queries that {base / QUERIES} lacks "
            f"(first: {unknown[0]!r}) (DATASET): use the queries file of the same dataset"
        )
    # BEIR evaluates the queries its qrels judge, in the order of the qrels file.
    return BeirDataset(base, split, {q: all_queries[q] for q in qrels}, qrels)
