"""Collection schema: named vectors `dense`, `colbert` (rerank-only multivector) and sparse `sparse`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from qdrant_client import QdrantClient, models

from .errors import SchemaMismatchError

logger = logging.getLogger(__name__)

SparseModifier = Literal["none", "idf"]


@dataclass(frozen=True)
class CollectionSchema:
    """Vector names and storage options of one BGE-M3 collection.

    `size` is the encoder's hidden size (1024 for BGE-M3). The sparse modifier is "none" by default,
    so a sparse search scores exactly the reference lexical matching score; "idf" lets Qdrant weight
    rare tokens up (scores then differ from the reference).
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


def collection_exists(client: QdrantClient, name: str) -> bool:
    """True if the collection exists."""
    return bool(client.collection_exists(name))


def schema_problems(client: QdrantClient, name: str, schema: CollectionSchema) -> list[str]:
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


def ensure_collection(client: QdrantClient, name: str, schema: CollectionSchema) -> bool:
    """Create the collection if missing; check it if present. Returns True if it was created.

    An existing collection with an incompatible schema raises SchemaMismatchError and is left untouched.
    """
    if collection_exists(client, name):
        problems = schema_problems(client, name, schema)
        if problems:
            raise SchemaMismatchError(
                f"collection {name!r} exists with an incompatible schema: "
                + "; ".join(problems)
                + ". Nothing was changed. Use another --collection, match its options "
                "(e.g. --sparse-modifier), or delete it first."
            )
        return False
    logger.info("creating collection %s (vector size %d)", name, schema.size)
    client.create_collection(
        name,
        vectors_config=schema.vectors_config(),
        sparse_vectors_config=schema.sparse_vectors_config(),
    )
    return True
