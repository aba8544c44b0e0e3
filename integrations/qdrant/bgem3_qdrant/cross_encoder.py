"""The cross-encoder stage: a search mode's top candidates ordered again by a reranker (bge-reranker-v2-m3).

    hits = searcher.search(query, mode="rerank", limit=20)        # the mode's top 20 candidates
    best = rerank_hits(query, hits, reranker, limit=5)            # the cross-encoder's top 5 of them

A cross-encoder reads the query and each candidate's text together, so it ranks better than any score of
separately encoded texts, at the cost of one model pass per candidate (docs/rerank.md). The hits keep their
other stage scores; `scores["cross_encoder"]` is the reranker's logit (FlagReranker's score) and becomes the
hit's `score`. Every user of the store (`bgem3-qdrant search/eval/mcp/ui --reranker`, the LangChain and
LlamaIndex retrievers) goes through `search_with_cross_encoder` here.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

from bgem3_embeddings.concurrency import encoder_lock

from .search import Hit

logger = logging.getLogger(__name__)

CROSS_ENCODER = "cross_encoder"  # the stage's name in Hit.scores and in `ordered_by`
# The mode's candidates the cross-encoder reads by default (at least the number of hits asked for): enough
# to lift a passage from deep in the first stage's list, few enough that one query costs well under a
# second with the full-size model on a GPU (a few seconds on a 2-core CPU: docs/rerank.md).
DEFAULT_RERANK_CANDIDATES = 20
# What each search mode's hits are ordered by, without the cross-encoder.
MODE_STAGE = {"rerank": "colbert", "hybrid": "rrf", "dense": "dense", "sparse": "sparse"}


@runtime_checkable
class RerankerLike(Protocol):
    """What bgem3_embeddings.BGEM3Reranker offers and this package uses."""

    model_id: str

    def rerank(
        self, query: str, documents: Any, top_n: int | None = ..., normalize: bool = ...
    ) -> list[tuple[int, float]]: ...


def load_reranker(model: str, **kwargs: Any) -> RerankerLike:
    """Build a BGEM3Reranker from a hub id or a local checkpoint directory (TensorFlow loads here)."""
    from bgem3_embeddings import BGEM3Reranker

    logger.info("loading reranker %s", model)
    reranker: RerankerLike = BGEM3Reranker(model, **kwargs)
    return reranker


def candidates_for(limit: int, rerank_candidates: int | None) -> int:
    """How many of the mode's hits the cross-encoder reads: `rerank_candidates`, at least `limit`."""
    if rerank_candidates is not None and rerank_candidates < 1:
        raise ValueError(f"rerank_candidates must be >= 1, got {rerank_candidates}")
    return max(limit, rerank_candidates or DEFAULT_RERANK_CANDIDATES)


def rerank_hits(query: str, hits: list[Hit], reranker: RerankerLike, limit: int) -> list[Hit]:
    """The best `limit` of `hits` by the cross-encoder, best first (equal scores keep the mode's order);
    each keeps its stage scores and gets `scores["cross_encoder"]`, also its `score`."""
    if not hits:
        return []
    with encoder_lock(reranker):  # one model, shared by the threads of a server (ui, mcp)
        ranked = reranker.rerank(query, [h.text for h in hits], top_n=limit)
    out = []
    for index, score in ranked:
        hit = hits[index]
        hit.scores[CROSS_ENCODER] = float(score)
        hit.score = float(score)
        out.append(hit)
    return out


def search_with_cross_encoder(
    searcher: Any,
    query: str,
    reranker: RerankerLike | None,
    *,
    limit: int,
    rerank_candidates: int | None = None,
    **search: Any,
) -> list[Hit]:
    """`searcher.search(query, limit=..., **search)` (a Searcher or a Collection), then, with a reranker,
    the cross-encoder's best `limit` of the mode's top `rerank_candidates`."""
    if reranker is None:
        hits: list[Hit] = searcher.search(query, limit=limit, **search)
        return hits
    candidates = searcher.search(query, limit=candidates_for(limit, rerank_candidates), **search)
    return rerank_hits(query, candidates, reranker, limit)


def ordered_by(mode: str, reranker: RerankerLike | None) -> str:
    """The stage whose score orders the hits: the cross-encoder when there is one, else the mode's."""
    return CROSS_ENCODER if reranker is not None else MODE_STAGE.get(mode, mode)
