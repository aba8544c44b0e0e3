"""Turn the model's batched tensors into the reference's per-text outputs (FlagEmbedding's BGEM3FlagModel)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def lexical_weights_from_batch(sparse_weights: np.ndarray, input_ids: np.ndarray) -> list[dict[str, float]]:
    """{str(token_id): weight} per text; weights <= 0 dropped, max kept for repeated ids.

    Special tokens and padding were already zeroed by the model, so `> 0` drops them too.
    """
    results: list[dict[str, float]] = []
    for weights, ids in zip(sparse_weights, input_ids, strict=True):
        lexical: dict[str, float] = {}
        positive = np.nonzero(weights > 0)[0]
        for token_id, weight in zip(ids[positive].tolist(), weights[positive].tolist(), strict=True):
            key = str(token_id)
            if weight > lexical.get(key, 0.0):
                lexical[key] = weight
        results.append(lexical)
    return results


def colbert_vecs_from_batch(colbert_vecs: np.ndarray, attention_mask: np.ndarray) -> list[np.ndarray]:
    """Per text, the first (number_of_tokens - 1) vectors: drops CLS (already) and padding, keeps </s>."""
    lengths = attention_mask.sum(axis=1)
    return [
        np.array(vecs[: int(n) - 1], dtype=np.float32) for vecs, n in zip(colbert_vecs, lengths, strict=True)
    ]


def sparse_arrays(lexical_weights: Mapping[Any, float]) -> tuple[np.ndarray, np.ndarray]:
    """{token_id: weight} (str or int keys) as sorted, unique (int64 indices, float32 values).

    The one conversion every integration uses to store or send lexical weights as a sparse vector.
    Weights <= 0 are dropped and a repeated id keeps its largest weight, the reference's rule
    (FlagEmbedding's `_process_token_weights`), so the dot product of two such vectors is the
    reference lexical matching score.

    Example:
        >>> sparse_arrays({"7": 0.5, "3": 0.25, "9": 0.0})
        (array([3, 7]), array([0.25, 0.5 ], dtype=float32))
    """
    merged: dict[int, float] = {}
    for key, value in lexical_weights.items():
        token, weight = int(key), float(value)
        if weight > merged.get(token, 0.0):
            merged[token] = weight
    indices = np.fromiter(sorted(merged), dtype=np.int64, count=len(merged))
    values = np.fromiter((merged[int(i)] for i in indices), dtype=np.float32, count=len(merged))
    return indices, values
