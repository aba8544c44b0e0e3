"""The evaluation results a page shows: the JSON files `bgem3-qdrant eval --json FILE` wrote into a folder.

Each file holds one evaluation (one dataset, one or more collections of its corpus: the first at the top
level, the others under "compare"; see `evaluation.report.EvalReport.to_json`). A file that is not such a
JSON is listed with one line saying what is wrong, and the others still load.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..evaluation.metrics import MEASURES
from ..evaluation.report import TITLES
from .errors import PageError

# Files larger than this are not evaluation reports (a report of 10 collections is a few kB).
MAX_FILE_BYTES = 4 * 1024 * 1024
WRITER = "`bgem3-qdrant eval DATASET -c NAME --json FILE`"


class EvalFileError(ValueError):
    """A file of the folder that is not an evaluation report (the message names what is wrong)."""


def _number(value: Any, where: str, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise EvalFileError(f"{where} is {json.dumps(value)[:40]}, not a number")
    return float(value)


def _collection(data: Any, where: str) -> dict[str, Any]:
    """One collection's figures: name, chunks, bytes per chunk, ColBERT storage, the measures per mode."""
    if not isinstance(data, dict):
        raise EvalFileError(f"{where} is not a JSON object")
    name = data.get("collection")
    if not isinstance(name, str) or not name:
        raise EvalFileError(f"{where} has no \"collection\" name")
    modes = data.get("modes")
    if not isinstance(modes, dict) or not modes:
        raise EvalFileError(f"collection {name!r} has no \"modes\" with figures")
    figures: dict[str, dict[str, float | None]] = {}
    for mode, values in modes.items():
        if not isinstance(values, dict):
            raise EvalFileError(f"mode {mode!r} of collection {name!r} is not a JSON object")
        figures[str(mode)] = {
            m: _number(values.get(m), f"{m} of mode {mode!r} of collection {name!r}") for m in MEASURES
        }
    return {
        "name": name,
        "chunks": int(_number(data.get("chunks", 0), f"chunks of {name!r}") or 0),
        "bytes_per_chunk": _number(
            data.get("bytes_per_chunk"), f"bytes_per_chunk of {name!r}", optional=True
        ),
        "colbert_dtype": str(data.get("colbert_dtype", "")),
        "colbert_pooling": int(_number(data.get("colbert_pooling", 1), f"colbert_pooling of {name!r}") or 1),
        "modes": figures,
    }


def parse_report(text: str) -> dict[str, Any]:
    """An eval JSON as the charts read it; EvalFileError naming the first thing that is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise EvalFileError(f"not valid JSON ({e.msg}, line {e.lineno} column {e.colno})") from e
    if not isinstance(data, dict) or "modes" not in data:
        raise EvalFileError("not an evaluation report (no \"modes\")")
    collections = [_collection(data, "the report")]
    compare = data.get("compare") or {}
    if not isinstance(compare, dict):
        raise EvalFileError("\"compare\" is not a JSON object")
    collections += [_collection(c, f"compare[{name!r}]") for name, c in compare.items()]
    return {
        "dataset": str(data.get("dataset", "")),
        "split": str(data.get("split", "")),
        "model": str(data.get("model", "")),
        "queries": data.get("queries"),
        "measures": [{"key": m, "title": TITLES[m]} for m in MEASURES],
        "collections": collections,
    }


class EvalFolder:
    """The *.json files of --eval-dir, read when the page asks (a file written meanwhile shows up)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder

    def _files(self) -> list[Path]:
        if self.folder is None or not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.iterdir() if p.suffix == ".json" and p.is_file())

    def _read(self, path: Path) -> dict[str, Any]:
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                raise EvalFileError(f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise EvalFileError(f"cannot be read ({e})") from e
        return parse_report(text)

    def listing(self) -> dict[str, Any]:
        """Every file: its name, and either its dataset and collections or what is wrong with it."""
        files = []
        for path in self._files():
            entry: dict[str, Any] = {"name": path.name}
            try:
                report = self._read(path)
                entry.update(ok=True, dataset=report["dataset"],
                             collections=[c["name"] for c in report["collections"]])  # fmt: skip
            except EvalFileError as e:
                entry.update(ok=False, error=f"{path.name}: {e}; write it with {WRITER}")
            files.append(entry)
        return {"folder": str(self.folder) if self.folder else None, "files": files}

    def load(self, name: str) -> dict[str, Any]:
        """One file's figures by its name in the listing (404 for any other name, 422 if malformed)."""
        known = {p.name: p for p in self._files()}
        if name not in known:
            where = f"in {self.folder}" if self.folder else "(the page was started without --eval-dir)"
            raise PageError(404, f"no evaluation file {name!r} {where}")
        try:
            return {"name": name, **self._read(known[name])}
        except EvalFileError as e:
            raise PageError(422, f"{name}: {e}; write it with {WRITER}") from e
