"""`bgem3-qdrant check`: read every point of a collection and verify what can be known about it.

Per point: the three vectors are present and finite; the dense vector and every ColBERT row have unit
norm (the engines store cosine vectors normalised; the tolerance follows the ColBERT storage dtype); the
ColBERT row count matches the chunk's token count (`n_tokens` + 1: FlagEmbedding's ColBERT vectors cover
every token after <s>, </s> included; pooled collections hold at most `max((n_tokens + 1) // N, 1)`
rows); sparse ids lie in the vocabulary with weights > 0; the payload has every field ingestion writes,
its text hashes to the recorded `content_hash`, and the point id is the one that text gets (ids.py).
Per collection: the engine's count equals the points it enumerates, and the model record is readable.

    >>> report = check_collection(store, "docs")      # doctest: +SKIP
    >>> report.ok, report.by_kind()                   # doctest: +SKIP
    (False, {'colbert': 2})
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import BGEM3QdrantError
from .identity import ModelIdentity
from .ids import content_hash, point_id
from .payload import (
    CHAR_END,
    CHAR_START,
    CHUNK_COUNT,
    CHUNK_INDEX,
    CONTENT_HASH,
    DOC_ID,
    METADATA,
    MODEL,
    N_TOKENS,
    SOURCE,
    TEXT,
)
from .pooling import pooled_row_count
from .schema import CollectionSchema, describe_colbert_storage
from .stores.base import BGEM3Store, StoredPoint
from .wording import counted

logger = logging.getLogger(__name__)

# What a damaged point can be damaged in; a point may be damaged in several.
KINDS: tuple[str, ...] = ("unreadable", "dense", "sparse", "colbert", "payload")
# The type every payload field must have (TOP_LEVEL_FIELDS of payload.py).
PAYLOAD_TYPES: dict[str, type | tuple[type, ...]] = {
    TEXT: str,
    SOURCE: str,
    DOC_ID: str,
    CHUNK_INDEX: int,
    CHUNK_COUNT: int,
    CHAR_START: int,
    CHAR_END: int,
    N_TOKENS: int,
    CONTENT_HASH: str,
    MODEL: str,
    METADATA: dict,
}
# Largest |norm - 1| of a stored unit vector, by storage dtype (float16 rounding moves a row's norm by
# about 2e-4 at 1024 dims; 8-bit storage by more). Damage (zeros, random bytes) is far outside these.
NORM_TOLERANCE: dict[str, float] = {"float32": 1e-3, "float16": 5e-3, "uint8": 5e-2}
# 4-bit rows (turbo4): the norm's error shrinks as 1/sqrt(dim); measured worst 0.021 at 1024 dims (3,200
# rows), 0.10 at 32 dims; the tolerance is 1/sqrt(dim), at least 0.05.
TURBO4_NORM_SCALE = 1.0
DENSE_NORM_TOLERANCE = 1e-3
# Points read per engine call.
PAGE = 256


@dataclass
class PointDamage:
    """One damaged point: what is wrong, by kind, and its payload when it could be read."""

    id: str
    problems: dict[str, str] = field(default_factory=dict)  # kind -> what is wrong
    payload: dict[str, Any] | None = None

    @property
    def doc_id(self) -> str | None:
        value = (self.payload or {}).get(DOC_ID)
        return value if isinstance(value, str) else None

    @property
    def source(self) -> str | None:
        value = (self.payload or {}).get(SOURCE)
        return value if isinstance(value, str) else None

    def describe(self) -> str:
        where = self.doc_id or self.source or "unknown document"
        return f"{self.id} ({where}): " + "; ".join(f"{k}: {v}" for k, v in self.problems.items())


@dataclass
class CheckReport:
    """What `check_collection` found."""

    collection: str
    store: str
    schema: CollectionSchema
    points: int = 0  # points enumerated
    counted: int = 0  # the engine's count
    damaged: list[PointDamage] = field(default_factory=list)
    model_problem: str | None = None
    identity: ModelIdentity | None = None

    @property
    def ok(self) -> bool:
        return not self.damaged and self.points == self.counted and self.model_problem is None

    def by_kind(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for d in self.damaged:
            counts.update(d.problems.keys())
        return {k: counts[k] for k in KINDS if counts[k]}

    def format(self, show: int = 10) -> str:
        """A summary for a person: counts, then up to `show` damaged points."""
        kinds = ", ".join(f"{k} {n}" for k, n in self.by_kind().items()) or "none"
        lines = [
            f"{self.collection!r} ({self.store}): {counted(self.points, 'point')} checked, "
            f"{len(self.damaged)} damaged ({kinds})"
        ]
        pooling = self.identity.colbert_pooling if self.identity is not None else 1
        lines.append(f"ColBERT storage: {describe_colbert_storage(self.schema, pooling)}")
        if self.points != self.counted:
            lines.append(
                f"count mismatch: the engine counts {self.counted} points, {self.points} could be enumerated"
            )
        if self.model_problem:
            lines.append(f"model record: {self.model_problem}")
        lines += [f"  {d.describe()}" for d in self.damaged[:show]]
        if len(self.damaged) > show:
            lines.append(f"  ... and {len(self.damaged) - show} more")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "collection": self.collection,
            "store": self.store,
            "ok": self.ok,
            "points": self.points,
            "counted": self.counted,
            "damaged": len(self.damaged),
            "colbert_dtype": self.schema.colbert_dtype,
            "colbert_quantization": self.schema.colbert_quantization,
            "colbert_copy_on_disk": self.schema.colbert_copy_on_disk,
            "by_kind": self.by_kind(),
            "model_problem": self.model_problem,
            "damaged_points": [
                {"id": d.id, "doc_id": d.doc_id, "problems": d.problems} for d in self.damaged
            ],
        }


# -- per-point checks: each returns what is wrong, or None
def _unit_rows(rows: np.ndarray, tolerance: float) -> str | None:
    if not np.isfinite(rows).all():
        return "values that are not finite"
    norms = np.linalg.norm(rows, axis=-1)
    worst = float(np.abs(norms - 1.0).max()) if norms.size else 0.0
    if worst > tolerance:
        return f"norm off by {worst:.3g} from 1 (tolerance {tolerance:g})"
    return None


def dense_problem(vector: Any, schema: CollectionSchema) -> str | None:
    if vector is None:
        return "missing"
    v = np.asarray(vector)
    if v.shape != (schema.size,):
        return f"shape {v.shape}, expected ({schema.size},)"
    return _unit_rows(v, DENSE_NORM_TOLERANCE)


def colbert_problem(
    rows: Any, schema: CollectionSchema, n_tokens: int | None, pooling: int = 1
) -> str | None:
    if rows is None:
        return "missing"
    m = np.asarray(rows)
    if m.ndim != 2 or m.shape[1] != schema.size or m.shape[0] == 0:
        return f"shape {m.shape}, expected (rows, {schema.size})"
    if isinstance(n_tokens, int):
        expected = n_tokens + 1  # every token after <s>, </s> included
        if pooling <= 1 and m.shape[0] != expected:
            return f"{m.shape[0]} rows for a chunk of {n_tokens} tokens (expected {expected})"
        most = pooled_row_count(expected, pooling)
        if pooling > 1 and not 1 <= m.shape[0] <= most:
            return (
                f"{m.shape[0]} rows for a chunk of {n_tokens} tokens pooled by {pooling} (expected <= {most})"
            )
    return _unit_rows(m, colbert_norm_tolerance(schema.colbert_dtype, schema.size))


def colbert_norm_tolerance(dtype: str, dim: int) -> float:
    """Largest |norm - 1| of an undamaged stored ColBERT row of `dim` dimensions stored as `dtype`."""
    if dtype == "turbo4":
        return max(NORM_TOLERANCE["uint8"], TURBO4_NORM_SCALE / float(np.sqrt(dim)))
    return NORM_TOLERANCE.get(dtype, NORM_TOLERANCE["uint8"])


def sparse_problem(vector: Any, vocab_size: int | None) -> str | None:
    if vector is None:
        return "missing"
    ids, weights = np.asarray(vector[0]), np.asarray(vector[1])
    if ids.shape != weights.shape:
        return f"{ids.size} ids for {weights.size} weights"
    if not np.isfinite(weights).all():
        return "weights that are not finite"
    if weights.size and float(weights.min()) <= 0:
        return f"weight {float(weights.min()):.3g} <= 0 (only positive weights are stored)"
    if ids.size and int(ids.min()) < 0:
        return f"token id {int(ids.min())} < 0"
    if ids.size and vocab_size is not None and int(ids.max()) >= vocab_size:
        return f"token id {int(ids.max())} outside the vocabulary of {vocab_size}"
    if len(np.unique(ids)) != ids.size:
        return "repeated token ids"
    return None


def payload_problem(pid: str, payload: dict[str, Any] | None) -> str | None:
    if not payload:
        return "missing"
    missing = [k for k in PAYLOAD_TYPES if k not in payload]
    if missing:
        return "missing field(s) " + ", ".join(missing)
    wrong = [
        k
        for k, t in PAYLOAD_TYPES.items()
        if not isinstance(payload[k], t) or (t is int and isinstance(payload[k], bool))
    ]
    if wrong:
        return "wrong type of " + ", ".join(wrong)
    if content_hash(payload[TEXT]) != payload[CONTENT_HASH]:
        return "the text does not hash to its content_hash (the text was changed)"
    if point_id(payload[DOC_ID], payload[CHUNK_INDEX], payload[CONTENT_HASH]) != pid:
        return "doc_id / chunk_index / content_hash are not the ones the point id was made of"
    return None


def point_problems(
    point: StoredPoint, schema: CollectionSchema, identity: ModelIdentity | None
) -> dict[str, str]:
    """Everything wrong with one point read with its payload and all three vectors."""
    vocab = identity.vocab_size if identity else None
    pooling = identity.colbert_pooling if identity else 1
    n_tokens = point.payload.get(N_TOKENS) if point.payload else None
    found = {
        "payload": payload_problem(point.id, point.payload),
        "dense": dense_problem(point.vectors.get(schema.dense_name), schema),
        "sparse": sparse_problem(point.vectors.get(schema.sparse_name), vocab),
        "colbert": colbert_problem(
            point.vectors.get(schema.colbert_name),
            schema,
            n_tokens if isinstance(n_tokens, int) and not isinstance(n_tokens, bool) else None,
            pooling,
        ),
    }
    return {k: v for k, v in found.items() if v is not None}


# -- reading
def _read_vectors(store: BGEM3Store, name: str, ids: list[str]) -> Iterator[tuple[str, StoredPoint | str]]:
    """(id, point with vectors) per id, or (id, why it cannot be read): a page at once, one by one when
    the page fails, so one damaged point does not hide the others."""
    try:
        got = {p.id: p for p in store.retrieve(name, ids, with_payload=False, with_vectors=True)}
    except BGEM3QdrantError:
        got = None
    if got is not None:
        for pid in ids:
            yield pid, got.get(pid) or "the engine returned nothing for it"
        return
    for pid in ids:
        try:
            one = store.retrieve(name, [pid], with_payload=False, with_vectors=True)
        except BGEM3QdrantError as e:
            yield pid, str(getattr(e, "cause", e)).removeprefix("the engine failed reading its files: ")
            continue
        yield pid, one[0] if one else "the engine returned nothing for it"


def read_points(store: BGEM3Store, name: str) -> Iterator[tuple[str, dict[str, Any], StoredPoint | str]]:
    """Every point as (id, payload, point with payload and vectors) or (id, payload, why its vectors
    cannot be read), page by page; raises StoreDamagedError when the ids cannot be enumerated."""
    offset: Any = None
    while True:
        page, offset = store.scroll(name, limit=PAGE, offset=offset, with_payload=True, with_vectors=False)
        payloads = {p.id: p.payload for p in page}
        for pid, got in _read_vectors(store, name, list(payloads)):
            if not isinstance(got, str):
                got.payload = payloads[pid]
            yield pid, payloads[pid], got
        if offset is None:
            return


def check_collection(
    store: BGEM3Store, name: str, *, progress: Callable[[int], None] | None = None
) -> CheckReport:
    """Verify every point of `name` (see the module docstring). Reads only; raises StoreDamagedError when
    not even the point ids can be enumerated."""
    schema = store.stored_schema(name)
    report = CheckReport(name, store.describe(), schema)
    try:
        record = store.read_model_record(name)
        report.identity = ModelIdentity.from_dict(record) if record is not None else None
    except (BGEM3QdrantError, TypeError, ValueError) as e:
        report.model_problem = str(e)
    report.counted = store.count(name)
    for pid, payload, got in read_points(store, name):
        if isinstance(got, str):
            problems = {"unreadable": got}
        else:
            problems = point_problems(got, schema, report.identity)
        if problems:
            report.damaged.append(PointDamage(pid, problems, payload))
        report.points += 1
        if progress is not None:
            progress(1)
    logger.info("checked %s: %d points, %d damaged", name, report.points, len(report.damaged))
    return report


__all__ = [
    "KINDS",
    "CheckReport",
    "PointDamage",
    "check_collection",
    "colbert_problem",
    "dense_problem",
    "payload_problem",
    "point_problems",
    "read_points",
    "sparse_problem",
]
