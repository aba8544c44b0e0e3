"""Reduced-precision quality against float32 on the same texts: dense cosine, ColBERT and lexical errors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bgem3_embeddings.scoring import colbert_score, lexical_matching_score


def encode_all(encoder: Any, texts: Sequence[str], max_length: int) -> dict[str, Any]:
    return encoder.encode(
        list(texts), max_length=max_length, return_dense=True, return_sparse=True, return_colbert_vecs=True
    )


def _weight_diff(a: dict[str, float], b: dict[str, float]) -> float:
    keys = a.keys() | b.keys()
    return max((abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys), default=0.0)


def compare_outputs(
    ref: dict[str, Any], other: dict[str, Any], queries: Sequence[int], passages: Sequence[int]
) -> dict[str, float]:
    """Errors of `other` against `ref` (both encode_all results); scores over query x passage pairs."""
    cos = np.einsum("ij,ij->i", ref["dense_vecs"], other["dense_vecs"])
    pairs = [(q, p) for q in queries for p in passages]
    colbert = np.array(
        [
            abs(
                colbert_score(ref["colbert_vecs"][q], ref["colbert_vecs"][p])
                - colbert_score(other["colbert_vecs"][q], other["colbert_vecs"][p])
            )
            for q, p in pairs
        ]
    )
    def lexical_scores(out: dict[str, Any]) -> np.ndarray:
        weights = out["lexical_weights"]
        return np.array([lexical_matching_score(weights[q], weights[p]) for q, p in pairs])

    lexical_ref = lexical_scores(ref)
    lexical = np.abs(lexical_ref - lexical_scores(other))
    # Lexical scores are unbounded sums of weight products (several units for long matches): relative to
    # the score, or to 1 for scores below 1.
    lexical_rel = lexical / np.maximum(np.abs(lexical_ref), 1.0)
    weights = np.array(
        [_weight_diff(a, b) for a, b in zip(ref["lexical_weights"], other["lexical_weights"], strict=True)]
    )
    colbert_cos = np.concatenate(
        [np.einsum("ij,ij->i", a, b) for a, b in zip(ref["colbert_vecs"], other["colbert_vecs"], strict=True)]
    )
    # A random-init 24-layer model maps every text to nearly the same vector (rank collapse): the cosine
    # between different texts and the cosine after removing the common mean say how telling `cos` is.
    r, o = ref["dense_vecs"], other["dense_vecs"]
    between = (r @ r.T)[~np.eye(len(r), dtype=bool)]
    mean = r.mean(axis=0, keepdims=True)
    rc, oc = r - mean, o - mean
    centered = np.einsum("ij,ij->i", rc, oc) / np.maximum(
        np.linalg.norm(rc, axis=1) * np.linalg.norm(oc, axis=1), 1e-12
    )
    return {
        "dense_cosine_mean": float(cos.mean()),
        "dense_cosine_between_texts_fp32": float(between.mean()) if len(between) else 1.0,
        "dense_centered_cosine_mean": float(centered.mean()),
        "dense_cosine_min": float(cos.min()),
        "colbert_vector_cosine_mean": float(colbert_cos.mean()),
        "colbert_score_diff_mean": float(colbert.mean()) if len(colbert) else 0.0,
        "colbert_score_diff_max": float(colbert.max()) if len(colbert) else 0.0,
        "sparse_weight_diff_max": float(weights.max()),
        "sparse_weight_diff_mean": float(weights.mean()),
        "lexical_score_diff_max": float(lexical.max()) if len(lexical) else 0.0,
        "lexical_score_rel_diff_max": float(lexical_rel.max()) if len(lexical) else 0.0,
        "pairs": len(pairs),
    }


def quality_report(
    ref_encoder: Any,
    other_encoder: Any,
    texts: Sequence[str],
    token_counts: Sequence[int],
    max_length: int = 8192,
    query_max_tokens: int = 32,
) -> dict[str, float]:
    """Encode `texts` with both encoders and compare; texts up to query_max_tokens count as queries."""
    ref = encode_all(ref_encoder, texts, max_length)
    other = encode_all(other_encoder, texts, max_length)
    queries = [i for i, n in enumerate(token_counts) if n <= query_max_tokens]
    passages = [i for i, n in enumerate(token_counts) if n > query_max_tokens]
    return compare_outputs(ref, other, queries, passages)
