"""Collection schema: named vectors `dense`, `colbert` (rerank-only multivector) and sparse `sparse`."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

from qdrant_client import QdrantClient, models

from .errors import SchemaMismatchError

if TYPE_CHECKING:
    from .stores.base import BGEM3Store

logger = logging.getLogger(__name__)

SparseModifier = Literal["none", "idf"]
ColbertDtype = Literal["float32", "float16", "uint8"]
COLBERT_DTYPES: tuple[str, ...] = ("float32", "float16", "uint8")


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
        if self.colbert_dtype not in COLBERT_DTYPES:
            raise ValueError(
                f"colbert_dtype must be one of {', '.join(COLBERT_DTYPES)}, not {self.colbert_dtype!r}"
            )
        if self.sparse_modifier not in ("none", "idf"):
            raise ValueError(f"sparse_modifier must be none or idf, not {self.sparse_modifier!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (stored next to an Edge collection)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CollectionSchema:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def client_datatype(self) -> models.Datatype:
        """qdrant-client datatype of the ColBERT vectors."""
        return _CLIENT_DATATYPE[self.colbert_dtype]

    def vectors_config(self) -> dict[str, models.VectorParams]:
        """Dense and ColBERT vector parameters for create_collection."""
        return {
            self.dense_name: models.VectorParams(
                size=self.size, distance=models.Distance.COSINE, on_disk=self.dense_on_disk
            ),
            self.colbert_name: models.VectorParams(
                size=self.size,
                distance=models.Distance.COSINE,
                on_disk=self.colbert_on_disk,
                datatype=self.client_datatype(),
                multivector_config=models.MultiVectorConfig(comparator=models.MultiVectorComparator.MAX_SIM),
                # m=0 disables the HNSW graph: ColBERT is only used to rerank prefetched candidates.
                hnsw_config=models.HnswConfigDiff(m=0),
            ),
        }

    def sparse_vectors_config(self) -> dict[str, models.SparseVectorParams]:
        """Sparse vector parameters for create_collection."""
        modifier = models.Modifier.IDF if self.sparse_modifier == "idf" else models.Modifier.NONE
        return {
            self.sparse_name: models.SparseVectorParams(
                modifier=modifier, index=models.SparseIndexParams(on_disk=self.sparse_on_disk)
            )
        }


_CLIENT_DATATYPE: dict[str, models.Datatype] = {
    "float32": models.Datatype.FLOAT32,
    "float16": models.Datatype.FLOAT16,
    "uint8": models.Datatype.TURBO8,
}
_COLBERT_DTYPE_OF: dict[models.Datatype, ColbertDtype] = {
    models.Datatype.FLOAT32: "float32",
    models.Datatype.FLOAT16: "float16",
    models.Datatype.TURBO8: "uint8",
}


def client_schema_problems(client: QdrantClient, name: str, schema: CollectionSchema) -> list[str]:
    """Differences between an existing collection and `schema` that would break writes or search.

    Storage options (on_disk) are not problems: they change speed, not results.
    """
    params = client.get_collection(name).config.params
    vectors = params.vectors
    named = vectors if isinstance(vectors, dict) else ({"": vectors} if vectors is not None else {})
    sparse = params.sparse_vectors or {}
    problems: list[str] = []

    for vname, want_multi in ((schema.dense_name, False), (schema.colbert_name, True)):
        have = named.get(vname)
        if have is None:
            problems.append(f"no vector named {vname!r} (has: {sorted(k for k in named if k) or 'none'})")
            continue
        if have.size != schema.size:
            problems.append(f"vector {vname!r} has size {have.size}, the encoder produces {schema.size}")
        if have.distance != models.Distance.COSINE:
            problems.append(f"vector {vname!r} uses {have.distance.value} distance, expected Cosine")
        mv = have.multivector_config
        if want_multi and (mv is None or mv.comparator != models.MultiVectorComparator.MAX_SIM):
            problems.append(f"vector {vname!r} is not a MAX_SIM multivector")
        if not want_multi and mv is not None:
            problems.append(f"vector {vname!r} is a multivector, expected a single dense vector")

    have_sparse = sparse.get(schema.sparse_name)
    if have_sparse is None:
        problems.append(f"no sparse vector named {schema.sparse_name!r} (has: {sorted(sparse) or 'none'})")
    else:
        have_mod = (have_sparse.modifier or models.Modifier.NONE).value
        if have_mod != schema.sparse_modifier:
            problems.append(
                f"sparse vector {schema.sparse_name!r} has modifier {have_mod!r}, "
                f"asked for {schema.sparse_modifier!r}"
            )
    return problems


def ensure_collection(store: BGEM3Store | QdrantClient, name: str, schema: CollectionSchema) -> bool:
    """Create the collection if missing; check it if present. Returns True if it was created.

    An existing collection with an incompatible schema raises SchemaMismatchError and is left untouched.
    """
    from .stores import as_store

    st = as_store(store)
    if st.collection_exists(name):
        problems = st.schema_problems(name, schema)
        if problems:
            raise SchemaMismatchError(
                f"collection {name!r} exists with an incompatible schema: "
                + "; ".join(problems)
                + ". Nothing was changed. Use another --collection, match its options "
                "(e.g. --sparse-modifier), or delete it first."
            )
        return False
    logger.info(
        "creating collection %s (vector size %d, ColBERT %s)", name, schema.size, schema.colbert_dtype
    )
    st.create_collection(name, schema)
    return True


def compare_schemas(have: CollectionSchema, want: CollectionSchema) -> list[str]:
    """Problems between a stored schema and the wanted one (storage options and dtype are not problems)."""
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


def client_stored_schema(client: QdrantClient, name: str) -> CollectionSchema:
    """The CollectionSchema of an existing bgem3-qdrant collection read through qdrant-client."""
    params = client.get_collection(name).config.params
    vectors = params.vectors if isinstance(params.vectors, dict) else {}
    base = CollectionSchema()
    multi = [k for k, v in vectors.items() if v.multivector_config is not None]
    dense = [k for k, v in vectors.items() if v.multivector_config is None]
    sparse = params.sparse_vectors or {}
    if len(multi) != 1 or len(dense) != 1 or len(sparse) != 1:
        raise SchemaMismatchError(
            f"collection {name!r} is not a bgem3-qdrant collection (vectors: {sorted(vectors)}, "
            f"sparse: {sorted(sparse)})"
        )
    dtype = vectors[multi[0]].datatype
    sp_name, sp = next(iter(sparse.items()))
    return CollectionSchema(
        size=int(vectors[dense[0]].size),
        dense_name=dense[0],
        colbert_name=multi[0],
        sparse_name=sp_name,
        sparse_modifier="idf" if sp.modifier == models.Modifier.IDF else base.sparse_modifier,
        colbert_dtype=_COLBERT_DTYPE_OF.get(dtype, "float32") if dtype is not None else "float32",
    )
