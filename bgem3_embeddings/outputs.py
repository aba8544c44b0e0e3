"""Turn the model's batched tensors into the reference's per-text outputs (facts section 3)."""

from __future__ import annotations

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
