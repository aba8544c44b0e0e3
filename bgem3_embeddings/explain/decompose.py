"""Take each mode's score apart from the encoded outputs of one query and its passages (numpy only).

Used by `BGEM3Encoder.explain` and by the server's `/v1/bgem3/explain` alike: both tokenize with spans
(`prepare`), encode the query and the passages in one `encode_token_ids` call, then call `explain_outputs`.
The totals are the reference's own functions (`bgem3_embeddings.scoring`, FlagEmbedding's formulas), and
the parts are the terms those functions add up.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bgem3_embeddings.explain.result import (
    MODE_NAMES,
    ColbertMatch,
    ExplainedText,
    Explanation,
    Span,
    SparseTerm,
)
from bgem3_embeddings.query_text import check_query, token_counts_if_cut
from bgem3_embeddings.scoring import colbert_score, dense_score, lexical_matching_score


def _check_text(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{name} is empty: there is nothing to explain; give it some text")
    return value


def check_texts(query: Any, passages: Any) -> list[str]:
    """[query, *passages] if each is a non-empty str; ValueError / TypeError naming the one that is not."""
    check_query(query)  # the rule every query follows (query_text.py)
    if isinstance(passages, str) or not isinstance(passages, Sequence):
        raise TypeError(f"passages must be a list of str, got {type(passages).__name__}")
    if not passages:
        raise ValueError("passages is empty: give at least one passage to explain")
    named = len(passages) > 1
    return [query] + [_check_text(p, f"passage {i}" if named else "passage") for i, p in enumerate(passages)]


def prepare(
    tokenizer: Any, query: str, passages: Sequence[str], query_max_length: int, passage_max_length: int
) -> tuple[ExplainedText, list[ExplainedText]]:
    """The query and passages tokenized with spans, truncated as `encode` truncates them.

    ValueError for an empty query or passage (naming which), TypeError for a non-str.
    """
    texts = check_texts(query, passages)
    # Two tokenizer calls, not one per text: the passages go to the Rust tokenizer as one batch.
    spans_per_text = tokenizer.token_spans(texts[:1], query_max_length) + tokenizer.token_spans(
        texts[1:], passage_max_length
    )
    lengths = [query_max_length] + [passage_max_length] * len(passages)
    explained: list[ExplainedText] = []
    for text, spans, length in zip(texts, spans_per_text, lengths, strict=True):
        # Cut: the tokens fill max_length and text is left after the last one (a second, untruncated
        # tokenization would say the same at twice the cost).
        content_end = max((t.stop for t in spans if not t.special), default=0)
        truncated = len(spans) >= length and bool(text[content_end:].strip())
        # Only a cut text is tokenized whole, for the count its note says (query_text.cut_note).
        whole = token_counts_if_cut(tokenizer, [text], len(spans)).get(0) if truncated else None
        explained.append(ExplainedText(text, tuple(spans), truncated, whole))
    return explained[0], explained[1:]


def colbert_vectors(text: ExplainedText) -> int:
    """A text's ColBERT vectors: one per token but <s> (FlagEmbedding drops its vector)."""
    return max(0, len(text.tokens) - 1)


def matrix_cells(query: ExplainedText, passages: Sequence[ExplainedText]) -> int:
    """Cells of the ColBERT similarity matrices of `query` against each passage, all together."""
    return colbert_vectors(query) * sum(colbert_vectors(p) for p in passages)


def _spans_by_id(text: ExplainedText) -> dict[int, list[Span]]:
    spans: dict[int, list[Span]] = defaultdict(list)
    for token in text.tokens:
        if not token.special:
            spans[token.id].append((token.start, token.stop))
    return spans


def sparse_terms(
    query_weights: Mapping[str, float],
    passage_weights: Mapping[str, float],
    query: ExplainedText | None,
    passage: ExplainedText | None,
) -> tuple[float, list[SparseTerm]]:
    """The lexical matching score and its terms (every shared token id), largest product first.

    `query` / `passage` give the spans and token strings; without them (a stored sparse vector alone) the
    spans are empty. Also used to highlight a stored hit's matched terms without encoding it again.
    """
    score = lexical_matching_score(query_weights, passage_weights)
    q_spans = _spans_by_id(query) if query is not None else {}
    p_spans = _spans_by_id(passage) if passage is not None else {}
    p_first: dict[int, int] = {}
    for index, token in enumerate(passage.tokens if passage is not None else ()):
        p_first.setdefault(token.id, index)
    pieces = {t.id: t.piece for text in (query, passage) if text is not None for t in text.tokens}
    terms = []
    for key, q_weight in query_weights.items():
        if key not in passage_weights:
            continue
        token_id = int(key)
        qw, pw = float(q_weight), float(passage_weights[key])
        product = qw * pw
        spans = tuple(p_spans.get(token_id, ()))
        first = p_first.get(token_id)
        text = passage.surface(first) if passage is not None and first is not None else ""
        terms.append(
            SparseTerm(
                token_id=token_id,
                token=pieces.get(token_id, ""),
                text=text,
                query_weight=qw,
                passage_weight=pw,
                product=product,
                share=product / score if score else 0.0,
                query_spans=tuple(q_spans.get(token_id, ())),
                passage_spans=spans,
            )
        )
    terms.sort(key=lambda t: (-t.product, t.token_id))
    return score, terms


def colbert_matches(
    query_vecs: np.ndarray, passage_vecs: np.ndarray
) -> tuple[float, list[ColbertMatch], np.ndarray]:
    """The ColBERT score, each query vector's best passage vector, and the similarity matrix.

    Vector i is token i + 1 of its text (FlagEmbedding keeps the vectors after <s>), so the matches carry
    token indices.
    """
    q = np.asarray(query_vecs, dtype=np.float32)
    p = np.asarray(passage_vecs, dtype=np.float32)
    score = colbert_score(q, p)
    matrix = q @ p.T
    if matrix.size == 0:
        return score, [], matrix
    best = matrix.argmax(axis=1)
    maxima = matrix[np.arange(len(q)), best]
    n = len(q)
    matches = [
        ColbertMatch(
            query_token=i + 1,
            passage_token=int(j) + 1,
            similarity=float(m),
            contribution=float(m) / n,
            share=float(m) / n / score if score else 0.0,
        )
        for i, (j, m) in enumerate(zip(best, maxima, strict=True))
    ]
    return score, matches, matrix


def explain_outputs(
    query: ExplainedText,
    passages: Sequence[ExplainedText],
    outputs: Mapping[str, Any],
    weights: tuple[float, float, float],
    with_matrix: bool = False,
) -> list[Explanation]:
    """One Explanation per passage from `encode_token_ids([query] + passages)`'s three outputs."""
    dense, lexical, colbert = outputs["dense_vecs"], outputs["lexical_weights"], outputs["colbert_vecs"]
    explanations = []
    for k, passage in enumerate(passages, start=1):
        d = dense_score(dense[0], dense[k])
        s, terms = sparse_terms(lexical[0], lexical[k], query, passage)
        c, matches, matrix = colbert_matches(colbert[0], colbert[k])
        w_d, w_s, w_c = weights
        total = w_d + w_s + w_c
        combined = (c * w_c + s * w_s + d * w_d) / total  # compute_score's "colbert+sparse+dense", as written
        parts = {
            name: w * x / total for name, w, x in zip(MODE_NAMES, weights, (d, s, c), strict=True)
        }
        explanations.append(
            Explanation(
                query=query,
                passage=passage,
                dense=d,
                sparse=s,
                colbert=c,
                combined=combined,
                weights=weights,
                parts=parts,
                sparse_terms=terms,
                colbert_matches=matches,
                colbert_matrix=matrix if with_matrix else None,
            )
        )
    return explanations
