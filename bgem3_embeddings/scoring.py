"""Similarity scores of the reference (FlagEmbedding M3), in plain numpy.

Example:
    >>> lexical_matching_score({"10": 0.5, "11": 0.2}, {"10": 0.4})
    0.2
    >>> colbert_score(np.eye(2, dtype=np.float32), np.eye(2, dtype=np.float32))
    1.0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

# The weights (dense, sparse, colbert) of the combined "all" score used everywhere in this project: the
# weighting the BAAI/bge-m3 model card (https://huggingface.co/BAAI/bge-m3, "Compute score for text pairs")
# passes to compute_score, `weights_for_different_modes=[0.4, 0.2, 0.4]`. It is not FlagEmbedding's own
# default: compute_score given no weights uses FLAGEMBEDDING_WEIGHTS.
DEFAULT_MODE_WEIGHTS: tuple[float, float, float] = (0.4, 0.2, 0.4)
# FlagEmbedding's BGEM3FlagModel.compute_score when weights_for_different_modes is None (POST
# /v1/bgem3/score, which copies that call, defaults to it).
FLAGEMBEDDING_WEIGHTS: tuple[float, float, float] = (1.0, 1.0, 1.0)


def lexical_matching_score(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Sum over tokens present in both of a[t] * b[t]."""
    if len(b) < len(a):
        a, b = b, a
    return float(sum(float(w) * float(b[t]) for t, w in a.items() if t in b))


def colbert_score(q_vecs: np.ndarray, p_vecs: np.ndarray) -> float:
    """Mean over query vectors of the best dot product with any passage vector.

    Qdrant's MAX_SIM sums instead of averaging: its score is this one times len(q_vecs).
    """
    q = np.asarray(q_vecs, dtype=np.float32)
    p = np.asarray(p_vecs, dtype=np.float32)
    if q.ndim != 2 or p.ndim != 2 or q.shape[1] != p.shape[1]:
        raise ValueError(f"colbert_score needs two [n, dim] arrays of equal dim, got {q.shape} and {p.shape}")
    if len(q) == 0 or len(p) == 0:
        return 0.0
    return float((q @ p.T).max(axis=1).sum() / len(q))


def dense_score(q: np.ndarray, p: np.ndarray) -> float:
    """Dot product of two L2-normalised vectors (= cosine)."""
    return float(np.dot(np.asarray(q, np.float32), np.asarray(p, np.float32)))


def combine_scores(
    dense: Sequence[float],
    sparse: Sequence[float],
    colbert: Sequence[float],
    weights: Sequence[float] = DEFAULT_MODE_WEIGHTS,
) -> dict[str, list[float]]:
    """The five keys of the reference compute_score, with weights [w_dense, w_sparse, w_colbert]."""
    if len(weights) != 3:
        raise ValueError(
            f"weights_for_different_modes needs 3 numbers (dense, sparse, colbert), got {weights}"
        )
    w0, w1, w2 = (float(w) for w in weights)
    if w0 + w1 == 0 or w0 + w1 + w2 == 0:
        raise ValueError(f"weights_for_different_modes must not sum to zero, got {list(weights)}")
    d, s, c = (list(map(float, x)) for x in (dense, sparse, colbert))
    return {
        "colbert": c,
        "sparse": s,
        "dense": d,
        "sparse+dense": [(si * w1 + di * w0) / (w0 + w1) for di, si in zip(d, s, strict=True)],
        "colbert+sparse+dense": [
            (ci * w2 + si * w1 + di * w0) / (w0 + w1 + w2) for di, si, ci in zip(d, s, c, strict=True)
        ],
    }
