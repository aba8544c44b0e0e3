"""Length-sorted batching: little padding, results put back in input order.

>>> [b.tolist() for b in length_sorted_batches([3, 10, 5, 9], batch_size=2)]
[[1, 3], [2, 0]]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def length_sorted_batches(
    lengths: Sequence[int], batch_size: int, max_tokens: int | None = None
) -> list[np.ndarray]:
    """Indices of texts grouped into batches, longest first (as the reference sorts).

    A batch holds at most `batch_size` texts and, when `max_tokens` is set, at most `max_tokens` padded
    tokens (batch size x its longest text); a text longer than `max_tokens` gets a batch of its own.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    # Stable sort on -length: equal lengths keep input order, so batching is deterministic.
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    while start < len(order):
        longest = int(lengths[order[start]])  # sorted: the first text of a batch is its longest
        size = batch_size
        if max_tokens is not None:
            size = max(1, min(batch_size, max_tokens // max(longest, 1)))
        batches.append(order[start : start + size])
        start += size
    return batches


PADDING_SIDES = ("right", "left")


def pad_batch(
    token_ids: Sequence[Sequence[int]], pad_id: int, side: str = "right"
) -> tuple[np.ndarray, np.ndarray]:
    """Pad to the longest sequence on `side` ("right" or "left"): (input_ids, attention_mask), int32 (b, s).

    >>> pad_batch([[0, 5, 2], [0, 2]], pad_id=1, side="left")[0].tolist()
    [[0, 5, 2], [1, 0, 2]]
    """
    if side not in PADDING_SIDES:
        raise ValueError(f"padding side must be 'right' or 'left', got {side!r}")
    longest = max(len(ids) for ids in token_ids)
    input_ids = np.full((len(token_ids), longest), pad_id, dtype=np.int32)
    mask = np.zeros((len(token_ids), longest), dtype=np.int32)
    for row, ids in enumerate(token_ids):
        cols = slice(0, len(ids)) if side == "right" else slice(longest - len(ids), longest)
        input_ids[row, cols] = ids
        mask[row, cols] = 1
    return input_ids, mask
