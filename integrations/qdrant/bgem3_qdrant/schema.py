"""Collection schema (data only): named vectors `dense`, `colbert` (rerank-only multivector), sparse `sparse`.

Each engine translates this into its own configuration (`stores/edge.py`, `stores/client_store.py`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, get_args

SparseModifier = Literal["none", "idf"]
SPARSE_MODIFIERS: tuple[str, ...] = get_args(SparseModifier)
ColbertDtype = Literal["float32", "float16", "uint8"]
COLBERT_DTYPES: tuple[str, ...] = get_args(ColbertDtype)


def check_choice(option: str, value: str, choices: tuple[str, ...]) -> None:
    """ValueError `--option must be one of a, b, not 'x'` unless value is one of `choices`."""
    if value not in choices:
        raise ValueError(f"{option} must be one of {', '.join(choices)}, not {value!r}")


@dataclass(frozen=True)
class CollectionSchema:
    """Vector names and storage options of one BGE-M3 collection.

    `size` is the encoder's hidden size (1024 for BGE-M3). The sparse modifier is "none" by default,
    so a sparse search scores exactly the reference lexical matching score; "idf" lets Qdrant weight
    rare tokens up (scores then differ from the reference).

    `colbert_dtype` is how the ColBERT multivector is stored: float16 (default, half the disk of
    float32, rerank scores within ~1e-4), float32 (exact), or uint8 (a quarter: Qdrant's 8-bit
    "turbo8" encoding of float vectors; Qdrant's raw uint8 datatype expects integers 0..255 and would
    destroy unit vectors). Searching is the same for all three.
    """

    size: int = 1024
    dense_name: str = "dense"
    sparse_name: str = "sparse"
    colbert_name: str = "colbert"
    sparse_modifier: SparseModifier = "none"
    dense_on_disk: bool = False
    # ColBERT vectors are large (one per token) and read only for a few rerank candidates.
    colbert_on_disk: bool = True
    sparse_on_disk: bool = False
    colbert_dtype: ColbertDtype = "float16"

    def __post_init__(self) -> None:
        check_choice("colbert_dtype", self.colbert_dtype, COLBERT_DTYPES)
        check_choice("sparse_modifier", self.sparse_modifier, SPARSE_MODIFIERS)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (stored next to an Edge collection)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CollectionSchema:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def compare_schemas(have: CollectionSchema, want: CollectionSchema) -> list[str]:
    """Problems between a stored schema and the wanted one (storage options and dtype are not problems:
    they change speed and size, not which vectors a collection holds)."""
    problems = []
    for attr in ("dense_name", "sparse_name", "colbert_name"):
        if getattr(have, attr) != getattr(want, attr):
            problems.append(f"{attr} is {getattr(have, attr)!r}, asked for {getattr(want, attr)!r}")
    if have.size != want.size:
        problems.append(f"vectors have size {have.size}, the encoder produces {want.size}")
    if have.sparse_modifier != want.sparse_modifier:
        problems.append(
            f"sparse vector {have.sparse_name!r} has modifier {have.sparse_modifier!r}, "
            f"asked for {want.sparse_modifier!r}"
        )
    return problems
