"""The evaluated search modes: one ranking of documents per query and mode, from the stored vectors.

    dense, sparse, hybrid, rerank   the search modes of `bgem3-qdrant search` (stores/base.py MODES)
    colbert                         ColBERT MaxSim over the dense candidates alone (the paper's
                                    "multi-vector": rerank of the dense top-200)
    all                             FlagEmbedding's `compute_score` weighted sum of the dense, sparse
                                    and ColBERT scores over the dense and sparse candidates

Every mode asks the engine for chunks (`candidates` per index), a document scores as its best chunk,
and the first `depth` documents are kept. ColBERT scores come from the engine's MAX_SIM over the stored
rows (float16, uint8, pooled: as the collection holds them), divided by the query's token count as
FlagEmbedding's `colbert_score` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bgem3_embeddings.scoring import DEFAULT_MODE_WEIGHTS

from ..encoder import EncodedTexts
from ..payload import DOC_ID
from ..schema import CollectionSchema
from ..search import lexical_score
from ..stores.base import MODES, RRF_K, BGEM3Store, QuerySpec, ScoredPoint

# The modes only an evaluation runs, and why (what `bgem3-qdrant search --mode` says when given one): each
# reproduces a ranking of the BGE-M3 paper to compare with; a search ranks with one of MODES.
EVAL_ONLY_MODES: dict[str, str] = {
    "colbert": "ColBERT over the dense candidates alone, the paper's multi-vector ranking, kept to compare "
    "with it",
    "all": "FlagEmbedding's compute_score weighted sum of the three scores over every candidate, the "
    "paper's All ranking, kept to compare with it",
}
# The search command's modes, then the two that only an evaluation runs.
EVAL_MODES: tuple[str, ...] = (*MODES, *EVAL_ONLY_MODES)
DEFAULT_WEIGHTS = DEFAULT_MODE_WEIGHTS  # dense, sparse, ColBERT: the BAAI/bge-m3 model card's (scoring.py)


@dataclass(frozen=True)
class ModeSettings:
    """How many chunks each index gives (`candidates`), how many documents a run keeps (`depth`)."""

    candidates: int = 200
    depth: int = 100
    weights: tuple[float, float, float] = DEFAULT_WEIGHTS
    rrf_k: int = RRF_K
    exact: bool = False  # brute-force candidates instead of the HNSW graph of an optimized store


@dataclass
class Query:
    """One query's three vectors (encoded once, shared by every mode and collection)."""

    id: str
    dense: np.ndarray
    sparse: tuple[np.ndarray, np.ndarray]
    colbert: np.ndarray


def queries_from(ids: Sequence[str], encoded: EncodedTexts) -> list[Query]:
    return [Query(qid, encoded.dense[i], encoded.sparse[i], encoded.colbert[i]) for i, qid in enumerate(ids)]


_EMPTY_SPARSE = (np.zeros(0, np.int64), np.zeros(0, np.float32))


def _spec(mode: str, q: Query, s: ModeSettings, schema: CollectionSchema) -> QuerySpec:
    """The one engine query behind an evaluated mode."""
    limit = s.candidates
    sparse = q.sparse
    with_vectors: list[str] = []
    store_mode = mode
    if mode == "colbert":
        # A rerank whose query has no sparse weights prefetches dense candidates alone (stores/base.py).
        store_mode, sparse = "rerank", _EMPTY_SPARSE
    elif mode == "all":
        # Every candidate of both indexes comes back with its ColBERT score and its dense/sparse vectors.
        store_mode, limit, with_vectors = "rerank", 2 * s.candidates, [schema.dense_name, schema.sparse_name]
    return QuerySpec(
        mode=store_mode,  # type: ignore[arg-type]
        limit=limit,
        prefetch_limit=s.candidates,
        dense=q.dense,
        sparse=sparse,
        colbert=q.colbert,
        with_vectors=with_vectors,
        rrf_k=s.rrf_k,
        exact=s.exact,
    )


def _all_score(p: ScoredPoint, q: Query, s: ModeSettings, schema: CollectionSchema) -> float:
    """FlagEmbedding's compute_score "colbert+sparse+dense": (w0 d + w1 s + w2 c) / (w0 + w1 + w2)."""
    w_dense, w_sparse, w_colbert = s.weights
    dense = float(np.dot(q.dense, p.vectors[schema.dense_name]))
    idx, val = p.vectors.get(schema.sparse_name, _EMPTY_SPARSE)
    sparse = lexical_score(q.sparse, idx.tolist(), val.tolist())
    colbert = p.score / max(1, len(q.colbert))
    return (w_dense * dense + w_sparse * sparse + w_colbert * colbert) / (w_dense + w_sparse + w_colbert)


def search_mode(
    store: BGEM3Store, collection: str, schema: CollectionSchema, mode: str, q: Query, s: ModeSettings
) -> dict[str, float]:
    """Document id -> score (its best chunk's) for one query in one mode."""
    if mode == "sparse" and not len(q.sparse[0]):
        return {}  # no lexical weight: a sparse search has nothing to match
    points = store.query(collection, _spec(mode, q, s, schema))
    scores: dict[str, float] = {}
    for p in points:
        if mode == "all":
            score = _all_score(p, q, s, schema)
        elif mode in ("colbert", "rerank"):
            score = p.score / max(1, len(q.colbert))  # the reference ColBERT score (MAX_SIM sum / tokens)
        else:
            score = p.score
        doc = str(p.payload.get(DOC_ID, p.id))
        if doc not in scores or score > scores[doc]:
            scores[doc] = score
    return scores
