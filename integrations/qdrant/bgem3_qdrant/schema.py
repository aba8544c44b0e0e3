"""Collection schema (data only): named vectors `dense`, `colbert` (rerank-only multivector), sparse `sparse`.

Each engine translates this into its own configuration (`stores/edge.py`, `stores/client_store.py`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, get_args

SparseModifier = Literal["none", "idf"]
SPARSE_MODIFIERS: tuple[str, ...] = get_args(SparseModifier)
ColbertDtype = Literal["float32", "float16", "uint8", "turbo4"]
COLBERT_DTYPES: tuple[str, ...] = get_args(ColbertDtype)
# A compact copy of the ColBERT rows the engine keeps in RAM beside the originals on disk (Qdrant's
# quantization): "int8" (scalar, a quarter of float32) or "binary" (one bit per dimension).
ColbertQuantization = Literal["none", "int8", "binary"]
COLBERT_QUANTIZATIONS: tuple[str, ...] = get_args(ColbertQuantization)
# The storage name's suffix for a copy kept on disk and read on demand (`turbo4/pool2/binary/ondisk`).
COPY_ON_DISK = "ondisk"


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
    destroy unit vectors), or turbo4 (an eighth: Qdrant's 4-bit TurboQuant encoding, a rotation then
    4 bits per dimension; rows come back within ~0.5% of their direction). Searching is the same for all.

    `colbert_quantization` ("none" by default) keeps a compact copy of every ColBERT row in RAM
    (Qdrant's int8 scalar or binary quantization): a rerank scores all its candidates on that copy and
    reads the original rows from disk only for the best `limit x oversampling` of them, which it
    rescores. The copy is on disk too (it counts in the collection's size) and, by default, read into RAM
    when the collection opens; with `colbert_copy_on_disk` it stays on disk and is read page by page as
    reranks need it (the collection opens at once; the first reranks read more from disk).
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
    colbert_quantization: ColbertQuantization = "none"
    # The copy read on demand from disk instead of into RAM at open (Edge: Memory.Cold vs Pinned; a
    # server: always_ram false). Stores written before this field read back as False, which they are.
    colbert_copy_on_disk: bool = False

    def __post_init__(self) -> None:
        check_choice("colbert_dtype", self.colbert_dtype, COLBERT_DTYPES)
        check_choice("colbert_quantization", self.colbert_quantization, COLBERT_QUANTIZATIONS)
        check_choice("sparse_modifier", self.sparse_modifier, SPARSE_MODIFIERS)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (stored next to an Edge collection)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CollectionSchema:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class ColbertStorage:
    """How a collection stores its ColBERT rows: dtype, pooling factor (recorded with the model, see
    identity.py), quantized copy (in RAM, or on disk: `ondisk`). Named `float16`, `uint8/pool2`,
    `uint8/pool3/binary`, `turbo4/pool2/binary/ondisk`."""

    dtype: str = "float16"
    pooling: int = 1
    quantization: str = "none"
    copy_on_disk: bool = False

    @property
    def name(self) -> str:
        parts = [self.dtype]
        if self.pooling > 1:
            parts.append(f"pool{self.pooling}")
        if self.quantization != "none":
            parts.append(self.quantization)
            if self.copy_on_disk:
                parts.append(COPY_ON_DISK)
        return "/".join(parts)

    @classmethod
    def parse(cls, text: str) -> ColbertStorage:
        """`DTYPE[/poolN][/QUANTIZATION[/ondisk]]`; ValueError naming what is wrong."""
        parts = [p.strip() for p in text.split("/") if p.strip()]
        if not parts:
            raise ValueError("--storages takes DTYPE[/poolN][/QUANTIZATION[/ondisk]] items, got an empty one")
        check_choice("--storages dtype", parts[0], COLBERT_DTYPES)
        pooling, quantization, on_disk = 1, "none", False
        for p in parts[1:]:
            if p.startswith("pool") and p[4:].isdigit():
                from .pooling import check_pool_factor

                pooling = check_pool_factor(int(p[4:]))
            elif p == COPY_ON_DISK:
                on_disk = True
            else:
                check_choice(f"--storages quantization (in {text!r})", p, COLBERT_QUANTIZATIONS)
                quantization = p
        if on_disk and quantization == "none":
            raise ValueError(f"--storages: {COPY_ON_DISK!r} needs a copy (int8 or binary), in {text!r}")
        return cls(parts[0], pooling, quantization, on_disk)


def describe_quantization(quantization: str, copy_on_disk: bool = False) -> str:
    """`no copy in RAM`, `binary copy in RAM`, `binary copy on disk (read as reranks need it)`."""
    if quantization == "none":
        return "no copy in RAM"
    return f"{quantization} copy {'on disk (read as reranks need it)' if copy_on_disk else 'in RAM'}"


def describe_colbert_storage(schema: CollectionSchema, pooling: int = 1) -> str:
    """How a collection stores ColBERT rows, for messages: `uint8, pooled by 2, binary copy in RAM`."""
    parts = [schema.colbert_dtype, f"pooled by {pooling}" if pooling > 1 else "unpooled"]
    copy = describe_quantization(schema.colbert_quantization, schema.colbert_copy_on_disk)
    return ", ".join([*parts, copy])


def compare_schemas(have: CollectionSchema, want: CollectionSchema) -> list[str]:
    """Problems between a stored schema and the wanted one (storage options, dtype and quantization are
    not problems: they change speed and size, not which vectors a collection holds)."""
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
