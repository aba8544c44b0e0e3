"""What `bgem3-qdrant mine` writes, and the check that it replaces nothing unasked.

    DIR/train.jsonl              FlagEmbedding training lines ({"query", "pos", "neg"[, "pos_scores",
                                 "neg_scores"]}): what `bgem3 finetune --train-data` reads
    DIR/holdout/queries.jsonl    the held-out queries (BEIR: {"_id", "text"}), only with a holdout
    DIR/holdout/qrels/test.tsv   their positives (query-id, corpus-id = the stored doc_id, grade):
                                 `bgem3-qdrant eval DIR/holdout -c NAME` reads the folder as it is
    DIR/mine.json                the settings and counts, written last: its presence says the run finished

Files are written next to their place and moved into it, so an interrupted run or a failed one leaves
what was there before; only these names are replaced (with --overwrite), nothing else in DIR.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import BGEM3QdrantError

TRAIN_FILE = "train.jsonl"
HOLDOUT_DIR = "holdout"
HOLDOUT_SPLIT = "test"
REPORT_FILE = "mine.json"
OUTPUT_NAMES = (TRAIN_FILE, HOLDOUT_DIR, REPORT_FILE)


def check_output(out_dir: Path, overwrite: bool) -> None:
    """Refuse (one line) an output that is a file, or a folder already holding mined data without
    `overwrite`; a missing or empty folder is fine."""
    if out_dir.exists() and not out_dir.is_dir():
        raise BGEM3QdrantError(f"{out_dir} is a file (--output): pass a folder for the mined data")
    present = [name for name in OUTPUT_NAMES if (out_dir / name).exists()]
    if present and not overwrite:
        raise BGEM3QdrantError(
            f"{out_dir} already holds mined data ({', '.join(present)}) (--output): pass --overwrite to "
            "replace it, or another --output"
        )


def _replace_file(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def jsonl(records: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def write_train(out_dir: Path, lines: list[dict[str, Any]]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / TRAIN_FILE
    _replace_file(path, jsonl(lines))
    return path


def write_holdout(out_dir: Path, queries: list[tuple[str, str, dict[str, int]]]) -> Path | None:
    """DIR/holdout as a BEIR folder of (query id, text, {doc id: grade}); with no query, an old one is
    removed (it belonged to the mined data being replaced) and None returned."""
    final = out_dir / HOLDOUT_DIR
    if not queries:
        if final.exists():
            shutil.rmtree(final)
        return None
    tmp = out_dir / (HOLDOUT_DIR + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    (tmp / "qrels").mkdir(parents=True)
    (tmp / "queries.jsonl").write_text(jsonl({"_id": q, "text": t} for q, t, _ in queries), encoding="utf-8")
    rows = [
        "query-id\tcorpus-id\tscore",
        *(f"{q}\t{d}\t{g}" for q, _, docs in queries for d, g in docs.items()),
    ]
    (tmp / "qrels" / f"{HOLDOUT_SPLIT}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def write_report(out_dir: Path, report: Mapping[str, Any]) -> Path:
    path = out_dir / REPORT_FILE
    _replace_file(path, json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return path
