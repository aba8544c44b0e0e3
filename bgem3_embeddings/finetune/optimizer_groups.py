"""What finetune/optimizer.py's AdamW shares with its backends' parts: the group size and the grouping,
and whether the weight-decay pass can change anything. Apart so that optimizer_torch.py imports nothing
that imports it."""

from __future__ import annotations

from typing import Any

# PyTorch: the foreach update's temporaries are three times a group's size (g * g, sqrt(v) + eps, m * alpha);
# TensorFlow: a weight above it is updated in blocks of rows of at most this size. Read at each update
# (tests/finetune_optimizer_worker.py lowers it to split a small model).
GROUP_BYTES = 64 << 20


def decays(optimizer: Any) -> bool:
    """Whether the weight-decay pass changes anything: at weight_decay 0 (or None) `w - w * 0 * lr == w`."""
    return bool(optimizer.weight_decay)


def groups(sizes: list[int], limit: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of consecutive items, each of at most `limit` bytes (an item above it alone).

    >>> groups([10, 10, 30, 5], 20)
    [(0, 2), (2, 3), (3, 4)]
    """
    ranges, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > limit:
            ranges.append((start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        ranges.append((start, len(sizes)))
    return ranges
