"""Padding a batch up to a few fixed shapes, and cutting the outputs back: for runners that compile per shape.

A compiled function (jax.jit) is specialised to its input shapes; encoding texts of every length would
compile once per (batch, length) pair. Rounding the batch up to a power of two and the length up to the
next bucket bounds that to a few dozen shapes (padding rows and columns are masked out, and cut away before
anyone sees them). Lengths go up in steps of 64 tokens to 1024, then by half powers of two: powers of two
alone padded a 266-token batch to 512, half of the work wasted (`bgem3 bench` on JAX measured 0.52x of
KerasHub, which compiles each exact shape), where steps of 64 waste at most 63 tokens a row.

    >>> bucket_shape(3, 100)
    (4, 128)
"""

from __future__ import annotations

import numpy as np

LENGTH_BUCKETS = (16, 32, *range(64, 1025, 64), 1536, 2048, 3072, 4096, 6144, 8192)


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def bucket_shape(batch: int, length: int) -> tuple[int, int]:
    """(batch, length) rounded up: the batch to a power of two, the length to a bucket (or itself above)."""
    padded_length = next((b for b in LENGTH_BUCKETS if b >= length), length)
    return _next_power_of_two(batch), padded_length


def pad_to(
    input_ids: np.ndarray, attention_mask: np.ndarray, shape: tuple[int, int], pad_id: int, padding_side: str
) -> tuple[np.ndarray, np.ndarray]:
    """The batch inside a (rows, length) array of pad ids / zero mask: its rows first, its columns on the
    side the batch is already padded on (so every row keeps its tokens where the model expects them)."""
    rows, length = shape
    b, s = input_ids.shape
    ids = np.full((rows, length), pad_id, dtype=np.int32)
    mask = np.zeros((rows, length), dtype=np.int32)
    columns = slice(0, s) if padding_side == "right" else slice(length - s, length)
    ids[:b, columns] = input_ids
    mask[:b, columns] = attention_mask
    return ids, mask


def cut_back(outputs: dict, layout: dict[str, str], batch: int, length: int, padding_side: str) -> dict:
    """Each output cut to the batch's own (batch, length): layouts 'row' (one value or vector per text),
    'tokens' (aligned with input_ids) and 'after_first' (the tokens after <s>, moved to the front)."""
    result = {}
    for name, value in outputs.items():
        value = np.asarray(value)[:batch]
        kind = layout[name]
        if kind == "tokens":
            padded = value.shape[1]
            value = value[:, :length] if padding_side == "right" else value[:, padded - length :]
        elif kind == "after_first":
            value = value[:, : length - 1]
        elif kind != "row":
            raise ValueError(f"unknown output layout {kind!r} for {name}")
        result[name] = value
    return result
