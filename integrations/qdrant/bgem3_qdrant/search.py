"""Search: dense, sparse, hybrid (RRF) or ColBERT rerank, each as one Query API call."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bgem3_embeddings.query_text import check_query

from .encoder import EncoderLike, Sparse, encode_texts
from .errors import SchemaMismatchError, StoreDamagedError, check_command
from .filters import FilterLike, build_filter, key_present_filter
from .identity import ensure_model, identity_of
from .payload import CHUNK_INDEX, DOC_ID, LOCATION_FIELDS, METADATA, SOURCE, TEXT
from .schema import CollectionSchema
from .stores.base import MODES, RRF_K, BGEM3Store, Mode, QuerySpec, ScoredPoint
from .stores.open import as_store

logger = logging.getLogger(__name__)
# Cosine and mean-MaxSim scores of unit vectors lie in [-1, 1]; beyond this margin (8-bit ColBERT
# storage moves scores by ~1e-2) the stored vectors are damaged, not rounded.
SCORE_BOUND = 1.05


@dataclass
class QueryEmbedding:
    """The three BGE-M3 representations of one query."""

    dense: np.ndarray
    sparse: Sparse
    colbert: np.ndarray


@dataclass
class Hit:
    """One search result. `score` is Qdrant's final score; `scores` has one entry per stage:
    dense (cosine), sparse (reference lexical score), colbert (reference colbert score, rerank mode)
    and rrf (hybrid mode)."""

    id: str
    score: float
    text: str
    source: str | None
    doc_id: str | None
    chunk_index: int | None
    metadata: dict[str, Any]
    scores: dict[str, float] = field(default_factory=dict)
    payload: dict[str, Any] = field(default_factory=dict)
    # The stored vectors returned with the hit (dense and sparse when stage_scores): the page highlights a
    # hit's matched sparse terms from them without encoding its text again.
    vectors: dict[str, Any] = field(default_factory=dict)

    def flat_metadata(self) -> dict[str, Any]:
        """The document's metadata, where the chunk came from (source, doc_id, chunk_index, ...) and one
        `<stage>_score` per stage: what the LangChain and LlamaIndex retrievers put on their documents."""
        metadata = dict(self.metadata)
        for key in LOCATION_FIELDS:
            if key in self.payload:
                metadata.setdefault(key, self.payload[key])
        metadata.update({f"{stage}_score": value for stage, value in self.scores.items()})
        return metadata

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "score": self.score,
            "scores": self.scores,
            "text": self.text,
            "source": self.source,
            "doc_id": self.doc_id,
            "chunk_index": self.chunk_index,
            "metadata": self.metadata,
        }


# Sparse terms and ColBERT alignments shown per explained hit (`search --explain`, the MCP `explain` tool).
EXPLAIN_TOP = 5


def hit_record(query: str, hit: Hit, explanation: Any = None) -> dict[str, Any]:
    """One hit as `bgem3-qdrant search --json` prints it (and the MCP `find` tool returns it): the query,
    the hit's fields and, when explained, its `explanation` object."""
    extra = {"explanation": explanation.to_dict()} if explanation is not None else {}
    return {"query": query, **hit.to_dict(), **extra}


def lexical_score(q: Sparse, p_indices: list[int], p_values: list[float]) -> float:
    """Reference lexical matching score: sum of q[t] * p[t] over shared token ids."""
    weights = dict(zip(p_indices, p_values, strict=True))
    return float(sum(float(v) * weights.get(int(i), 0.0) for i, v in zip(*q, strict=True)))


class Searcher:
    """Python API of `bgem3-qdrant search`."""

    def __init__(
        self,
        store: Any,
        collection: str,
        encoder: EncoderLike,
        schema: CollectionSchema | None = None,
    ) -> None:
        self.store: BGEM3Store = as_store(store)
        self.collection = collection
        self.encoder = encoder
        self.schema = schema or CollectionSchema(size=int(encoder.hidden_size))
        self._model_checked = False

    def embed_query(self, query: str) -> QueryEmbedding:
        """Dense, sparse and ColBERT vectors of a query, from one forward pass (EmptyQueryError, a
        ValueError, for a query without text: `bgem3_embeddings.query_text`)."""
        out = encode_texts(self.encoder, [check_query(query)], query=True)
        return QueryEmbedding(dense=out.dense[0], sparse=out.sparse[0], colbert=out.colbert[0])

    def _check_collection(self) -> None:
        if not self.store.collection_exists(self.collection):
            raise self.store.missing(self.collection)

    def _check_model(self) -> None:
        """The collection holds this encoder's vectors: same size (else SchemaMismatchError), same
        checkpoint (else ModelMismatchError, identity.py)."""
        try:
            stored_size: int | None = self.store.stored_schema(self.collection).size
        except SchemaMismatchError:  # not our layout (another tool's collection): the engine decides
            stored_size = None
        if stored_size is not None and stored_size != self.schema.size:
            raise SchemaMismatchError(
                f"collection {self.collection!r} holds vectors of size {stored_size}, the model (--model) "
                f"produces {self.schema.size}; search it with the model that wrote it"
            )
        ensure_model(self.store, self.collection, identity_of(self.encoder), write=False)

    def search(
        self,
        query: str,
        *,
        mode: Mode = "rerank",
        limit: int = 10,
        prefetch_limit: int | None = None,
        filter: FilterLike = None,
        stage_scores: bool = True,
        embedding: QueryEmbedding | None = None,
        rrf_k: int = RRF_K,
    ) -> list[Hit]:
        """Search with one Query API call.

        dense / sparse: one index. hybrid: dense and sparse candidates fused with RRF. rerank (default):
        dense and sparse candidates reranked by ColBERT MAX_SIM. `prefetch_limit` candidates per index
        (default max(4 * limit, 50)). Hybrid uses RRF with `rrf_k` (60, a server's default) on every engine.
        """
        check_query(query)  # also with an `embedding` given: the hits are returned for this query
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self._check_collection()
        if not self._model_checked:  # once per Searcher: both need a read of the collection's records
            self._check_model()
            self._model_checked = True
        s = self.schema
        q = embedding or self.embed_query(query)
        spec = QuerySpec(
            mode=mode,
            limit=limit,
            prefetch_limit=prefetch_limit or max(4 * limit, 50),
            dense=q.dense,
            sparse=q.sparse,
            colbert=q.colbert,
            filter=build_filter(filter),
            with_vectors=[s.dense_name, s.sparse_name] if stage_scores else [],
            rrf_k=rrf_k,
        )
        hits = [self._hit(p, q, mode, stage_scores) for p in self.store.query(self.collection, spec)]
        self._check_scores(hits)
        return hits

    def _check_scores(self, hits: list[Hit]) -> None:
        """Scores unit vectors cannot have (random bytes in a vector file) mean a damaged collection:
        say so instead of ranking by them."""
        for h in hits:
            for stage in ("dense", "colbert"):
                value = h.scores.get(stage)
                if value is not None and not abs(value) <= SCORE_BOUND:  # NaN fails too
                    raise StoreDamagedError(
                        self.collection,
                        self.store.describe(),
                        f"point {h.id} scores {stage}={value:.6g}, impossible for unit vectors",
                        check_command(self.collection, self.store.location_option()),
                    )

    def missing_filter_keys(self, filter: dict[str, Any]) -> list[str]:
        """The keys of a `{key: value}` filter that no stored point has (a typo finds nothing)."""
        return [
            key for key in filter if self.store.count(self.collection, key_present_filter(key)) == 0
        ]

    def _hit(self, p: ScoredPoint, q: QueryEmbedding, mode: str, stage_scores: bool) -> Hit:
        payload = p.payload
        scores: dict[str, float] = {}
        if stage_scores:
            d = p.vectors.get(self.schema.dense_name)
            if d is not None:
                scores["dense"] = float(np.dot(q.dense, np.asarray(d, dtype=np.float32)))
            sp = p.vectors.get(self.schema.sparse_name)
            scores["sparse"] = (
                lexical_score(q.sparse, sp[0].tolist(), sp[1].tolist()) if sp is not None else 0.0
            )
        if mode == "rerank":
            # Qdrant's MAX_SIM sums over query vectors; the reference colbert score is the mean.
            scores["colbert"] = float(p.score) / max(1, len(q.colbert))
        elif mode == "hybrid":
            scores["rrf"] = float(p.score)
        return Hit(
            id=p.id,
            score=float(p.score),
            text=str(payload.get(TEXT, "")),
            source=payload.get(SOURCE),
            doc_id=payload.get(DOC_ID),
            chunk_index=payload.get(CHUNK_INDEX),
            metadata=dict(payload.get(METADATA) or {}),
            scores=scores,
            payload=payload,
            vectors=p.vectors,
        )
