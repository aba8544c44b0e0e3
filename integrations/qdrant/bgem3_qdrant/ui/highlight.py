"""A hit's matched sparse terms, from the query's lexical weights and the hit's stored sparse vector.

No text is encoded again: the hit's text is only tokenized (for the character spans of each token id), so
highlighting every hit of the four modes costs milliseconds. The terms are `explain.decompose.sparse_terms`,
the same function `explain` uses, so a highlighted term is one the explanation lists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

from bgem3_embeddings.explain import ExplainedText
from bgem3_embeddings.explain.decompose import sparse_terms
from bgem3_embeddings.tokenizer import TokenSpan

# Terms sent per hit: the highlight shows the strongest; the explanation lists them all.
TERMS_PER_HIT = 24


def lexical_dict(sparse: tuple[np.ndarray, np.ndarray] | None) -> dict[str, float]:
    """A stored (ids, weights) pair as the reference's {str(token_id): weight} dict."""
    if sparse is None:
        return {}
    ids, weights = sparse
    return {str(int(i)): float(w) for i, w in zip(ids, weights, strict=True)}


def explained(tokenizer: Any, texts: Sequence[str], max_length: int) -> list[ExplainedText]:
    """Texts with their tokens' character spans, tokenized in one call."""
    if not texts:
        return []
    spans = tokenizer.token_spans(list(texts), max_length)
    return [ExplainedText(text, tuple(s)) for text, s in zip(texts, spans, strict=True)]


def matched_only(
    tokenizer: Any,
    query: ExplainedText,
    texts: Sequence[str],
    wanted: Sequence[AbstractSet[int]],
    max_length: int,
) -> list[ExplainedText]:
    """Texts with only the tokens whose id is in their `wanted` set: all the highlighting needs, without an
    object per token of every hit (a 512-token chunk has a few matched tokens). One tokenizer call; the
    pieces are the query's (every matched id is one of its tokens)."""
    if not texts:
        return []
    out = tokenizer(
        list(texts), max_length=max_length, return_offsets_mapping=True, return_attention_mask=False
    )
    pieces = {t.id: t.piece for t in query.tokens}
    rows = zip(texts, out["input_ids"], out["offset_mapping"], wanted, strict=True)
    return [
        ExplainedText(
            text,
            tuple(TokenSpan(i, pieces.get(i, ""), a, b, False)
                  for i, (a, b) in zip(ids, offsets, strict=True) if i in want),  # fmt: skip
        )
        for text, ids, offsets, want in rows
    ]


def hit_terms(
    query: ExplainedText,
    query_weights: Mapping[str, float],
    passage: ExplainedText,
    passage_weights: Mapping[str, float],
    top: int = TERMS_PER_HIT,
) -> list[dict[str, Any]]:
    """The strongest matched terms of one hit: token, its text, product, share, where it occurs."""
    _, terms = sparse_terms(query_weights, passage_weights, query, passage)
    return [
        {
            "token_id": t.token_id,
            "token": t.token,
            "text": t.text,
            "product": t.product,
            "share": t.share,
            "spans": [list(s) for s in t.passage_spans],
        }
        for t in terms[:top]
    ]
