"""JSON text of large answers made in pieces, so a server's other threads keep running while it is written.

One `json.dumps` call of a huge list runs in C from start to end without letting go of the GIL: made in a
worker thread, it still stops the event loop (and every other request) until it returns. Made here a few
thousand items per call, the interpreter hands the GIL over between calls. The text is the same JSON,
with compact separators:

    list_json([1, 2, 3], chunk=2)                          # '[1,2,3]'
    matrix_json(np.eye(2, dtype=np.float32))              # '[[1.0,0.0],[0.0,1.0]]'
    mark = placeholder(); dumps_with({"m": mark}, {mark: "[1]"})   # '{"m":[1]}'
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

CHUNK_ITEMS = 2048  # items per json.dumps call: about a millisecond of C each
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def dumps(value: Any) -> str:
    """Compact JSON of `value` in one call (as Starlette's JSONResponse writes it)."""
    return _ENCODER.encode(value)


def list_json(items: Sequence[Any], chunk: int = CHUNK_ITEMS) -> str:
    """The JSON list of `items`, `chunk` items per json.dumps call."""
    return "[" + ",".join(dumps(list(items[i : i + chunk]))[1:-1] for i in range(0, len(items), chunk)) + "]"


def matrix_json(matrix: np.ndarray) -> str:
    """A 2-D array as a JSON list of rows, about CHUNK_ITEMS numbers per call (`tolist` included)."""
    m = np.asarray(matrix)
    if m.ndim != 2:
        raise ValueError(f"matrix_json needs a 2-D array, got shape {m.shape}")
    rows = max(1, CHUNK_ITEMS // max(1, m.shape[1]))
    return "[" + ",".join(dumps(m[i : i + rows].tolist())[1:-1] for i in range(0, len(m), rows)) + "]"


def placeholder() -> str:
    """A string no request can contain by chance: it marks where `dumps_with` puts a piece."""
    return f"\x00piece-{secrets.token_hex(16)}\x00"


def dumps_with(value: Any, pieces: Mapping[str, str]) -> str:
    """JSON of `value` in which each string equal to a key of `pieces` (a `placeholder()`) is that piece's
    JSON text, as is. `value` without its pieces should be small: it is written in one call."""
    text = dumps(value)
    if not pieces:
        return text
    by_mark = {dumps(mark): piece for mark, piece in pieces.items()}
    # One pass over the small skeleton (a str.replace per piece would copy the growing text each time).
    return re.sub("|".join(map(re.escape, by_mark)), lambda found: by_mark[found.group(0)], text)
