"""The evaluated cross-encoder mode (`bgem3-qdrant eval --reranker MODEL`): what the second stage buys and
costs on a user's own data, beside the modes of modes.py.

    cross   the top `rerank_candidates` chunks of the rerank mode (ColBERT over dense + sparse candidates,
            what `bgem3-qdrant search` runs by default) ordered by the cross-encoder, as
            `search --reranker` orders them; a document scores as its best chunk

The documents of the rerank mode's ranking beyond those candidates follow, in that mode's order, below
every cross-encoder score: Recall@100 then measures the same depth as the other modes, and only the order
of the first candidates is the cross-encoder's. Its latency is the search plus the cross-encoder's pass.
"""

from __future__ import annotations

from typing import Any

from ..cross_encoder import rerank_hits
from ..payload import DOC_ID, TEXT
from ..schema import CollectionSchema
from ..search import Hit
from ..stores.base import BGEM3Store
from .modes import ModeSettings, Query

CROSS_MODE = "cross"
CROSS_MODE_HELP = "the cross-encoder (--reranker) over the rerank mode's top --rerank-candidates chunks"


def cross_scores(
    store: BGEM3Store,
    collection: str,
    schema: CollectionSchema,
    q: Query,
    query_text: str,
    reranker: Any,
    candidates: int,
    s: ModeSettings,
) -> dict[str, float]:
    """Document id -> score for one query: cross-encoder logits for the documents of the first
    `candidates` chunks, then the rest of the rerank mode's documents below them, in its order."""
    from .modes import _spec  # the rerank mode's one engine query

    points = store.query(collection, _spec("rerank", q, s, schema))  # best first
    hits = [
        Hit(id=p.id, score=p.score, text=str(p.payload.get(TEXT, "")), source=None,
            doc_id=str(p.payload.get(DOC_ID, p.id)), chunk_index=None, metadata={})
        for p in points[:candidates]
    ]  # fmt: skip
    scores: dict[str, float] = {}
    for hit in rerank_hits(query_text, hits, reranker, len(hits)):
        doc = str(hit.doc_id)
        if doc not in scores or hit.score > scores[doc]:
            scores[doc] = hit.score
    floor = min(scores.values(), default=0.0) - 1.0
    for p in points:  # the rerank mode's order below: a document's first (best) chunk places it
        doc = str(p.payload.get(DOC_ID, p.id))
        if doc not in scores:
            scores[doc] = floor - len(scores)
    return scores
