"""Search: dense, sparse, hybrid (RRF) or ColBERT rerank, each as one Query API call."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from qdrant_client import QdrantClient, models

from .encoder import EncoderLike
from .errors import CollectionNotFoundError
from .schema import CollectionSchema
from .store import sparse_from_lexical
from .stores import RRF_K, BGEM3Store, QuerySpec, ScoredPoint, as_store

logger = logging.getLogger(__name__)

Mode = Literal["dense", "sparse", "hybrid", "rerank"]
MODES: tuple[str, ...] = ("dense", "sparse", "hybrid", "rerank")
# Payload fields written by ingestion; any other filter key refers to the document's metadata.
TOP_LEVEL_FIELDS = {
    "text",
    "source",
    "doc_id",
    "chunk_index",
    "chunk_count",
    "char_start",
    "char_end",
    "n_tokens",
    "content_hash",
    "model",
}


@dataclass
class QueryEmbedding:
    """The three BGE-M3 representations of one query."""

    dense: np.ndarray
    sparse: tuple[np.ndarray, np.ndarray]
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


def build_filter(flt: Mapping[str, Any] | models.Filter | None) -> models.Filter | None:
    """A Qdrant filter from {key: value} (all must match; a list value matches any of its items).

    Keys that are not ingestion's own payload fields refer to metadata ("lang" -> "metadata.lang").
    """
    if flt is None or isinstance(flt, models.Filter):
        return flt
    conds: list[models.Condition] = []
    for key, value in flt.items():
        path = key if key in TOP_LEVEL_FIELDS or key.startswith("metadata.") else f"metadata.{key}"
        match: models.MatchAny | models.MatchValue
        if isinstance(value, list | tuple | set):
            match = models.MatchAny(any=list(value))
        else:
            match = models.MatchValue(value=value)
        conds.append(models.FieldCondition(key=path, match=match))
    return models.Filter(must=conds) if conds else None


def parse_filter_args(items: list[str]) -> dict[str, Any]:
    """CLI `key=value` pairs as a filter dict; values are JSON when they parse (2020, true, ["a","b"])."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"filter {item!r} is not key=value")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if isinstance(value, float | dict):  # keyword/integer matches only: keep the text as given
            value = raw
        out[key.strip()] = value
    return out


def lexical_score(q: tuple[np.ndarray, np.ndarray], p_indices: list[int], p_values: list[float]) -> float:
    """Reference lexical matching score: sum of q[t] * p[t] over shared token ids."""
    weights = dict(zip(p_indices, p_values, strict=True))
    return float(sum(float(v) * weights.get(int(i), 0.0) for i, v in zip(*q, strict=True)))


class Searcher:
    """Python API of `bgem3-qdrant search`."""

    def __init__(
        self,
        client: BGEM3Store | QdrantClient,
        collection: str,
        encoder: EncoderLike,
        schema: CollectionSchema | None = None,
    ) -> None:
        self.store = as_store(client)
        self.client = self.store  # the name of earlier releases
        self.collection = collection
        self.encoder = encoder
        self.schema = schema or CollectionSchema(size=int(encoder.hidden_size))

    def embed_query(self, query: str) -> QueryEmbedding:
        """Dense, sparse and ColBERT vectors of a query, from one forward pass."""
        out = self.encoder.encode_queries(
            [query], return_dense=True, return_sparse=True, return_colbert_vecs=True
        )
        return QueryEmbedding(
            dense=np.asarray(out["dense_vecs"][0], dtype=np.float32),
            sparse=sparse_from_lexical(out["lexical_weights"][0]),
            colbert=np.asarray(out["colbert_vecs"][0], dtype=np.float32),
        )

    def _check_collection(self) -> None:
        if not self.store.collection_exists(self.collection):
            raise CollectionNotFoundError(
                f"collection {self.collection!r} does not exist; create it with "
                f"`bgem3-qdrant ingest PATH --collection {self.collection}`"
            )

    def search(
        self,
        query: str,
        *,
        mode: Mode = "rerank",
        limit: int = 10,
        prefetch_limit: int | None = None,
        filter: Mapping[str, Any] | models.Filter | None = None,
        stage_scores: bool = True,
        embedding: QueryEmbedding | None = None,
        rrf_k: int = RRF_K,
    ) -> list[Hit]:
        """Search with one Query API call.

        dense / sparse: one index. hybrid: dense and sparse candidates fused with RRF. rerank (default):
        dense and sparse candidates reranked by ColBERT MAX_SIM. `prefetch_limit` candidates per index
        (default max(4 * limit, 50)). Hybrid uses RRF with `rrf_k` (60, a server's default) on every engine.
        """
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self._check_collection()
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
        return [self._hit(p, q, mode, stage_scores) for p in self.store.query(self.collection, spec)]

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
            text=str(payload.get("text", "")),
            source=payload.get("source"),
            doc_id=payload.get("doc_id"),
            chunk_index=payload.get("chunk_index"),
            metadata=dict(payload.get("metadata") or {}),
            scores=scores,
            payload=payload,
        )
