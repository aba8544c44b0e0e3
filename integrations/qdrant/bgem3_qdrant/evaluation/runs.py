"""TREC run files: `qid Q0 docid rank score tag`, one per mode, so any IR tool can score them again."""

from __future__ import annotations

from pathlib import Path

from .metrics import Run, trec_order


def format_run(run: Run, tag: str) -> str:
    """A run as TREC lines, each query's documents in trec_eval's order, ranks from 1.

    Scores are written with `repr` (the shortest text that reads back as the same float), so a tool
    reading the file ranks exactly what was evaluated.
    """
    lines = []
    for qid, docs in run.items():
        for rank, (docid, score) in enumerate(trec_order(docs), start=1):
            lines.append(f"{qid} Q0 {docid} {rank} {float(score)!r} {tag}")
    return "".join(line + "\n" for line in lines)


def write_run(path: Path, run: Run, tag: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(format_run(run, tag), encoding="utf-8")
    return path


def read_run(path: Path) -> dict[str, dict[str, float]]:
    """A TREC run file back as {query id: {document id: score}}."""
    run: dict[str, dict[str, float]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            qid, _, docid, _, score, _ = line.split()
            run.setdefault(qid, {})[docid] = float(score)
    return run
