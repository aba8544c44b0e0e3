"""Splitting one padded batch into a few shorter calls when padding would cost more than the extra calls.

A runner that compiles per shape pads each batch up to a bucket (`buckets.bucket_shape`): every row is
computed at the bucketed length of the batch's longest row. A batch of mixed lengths (a short query beside a
770-token passage, a server's concurrent requests) then spends most of its work on padding. Run instead as
length-sorted groups, each padded to its own bucket, the same rows cost less: `plan_sub_batches` picks the
split with the lowest estimated cost, by dynamic programming over the rows sorted longest first (a group is
a run of that order, as in `batching.length_sorted_batches`).

Cost of one call of (rows, length) padded tokens, in token units:

    rows * length * (1 + length / attention_span) + call_overhead (+ new_shape_cost if not compiled yet)

Per token and layer, the dense layers take 24 h^2 FLOPs (Q, K, V, output: 4 h^2 multiply-adds; the FFN:
8 h^2) and attention 4 s h (scores and weighted sum: 2 s h each), so attention equals the dense work at
s = 6 h: `attention_span` is 6 x hidden size. `call_overhead` is the fixed price of one more call, and
`new_shape_cost` that of compiling a shape the runner has not compiled yet (`known_shapes`): a mixed batch
on a fresh process must not compile a dozen shapes to save a little padding.

Each row's outputs are the same whichever group it runs in (padding is masked, and each output's padding is
zero in the model itself), so the split changes speed, not results.

    >>> costs = {"attention_span": 6144, "call_overhead": 16, "new_shape_cost": 256}
    >>> groups = plan_sub_batches([770, 7, 300, 250], **costs)
    >>> [g.tolist() for g in groups]
    [[0], [2, 3], [1]]
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from bgem3_embeddings.runners.buckets import bucket_shape

_KEY = 1 << 32  # (rows, length) -> rows * _KEY + length: lengths stay far below 2**32


def plan_sub_batches(
    lengths: Sequence[int] | np.ndarray,
    *,
    attention_span: float,
    call_overhead: float,
    new_shape_cost: float = 0.0,
    known_shapes: Collection[tuple[int, int]] = (),
) -> list[np.ndarray]:
    """Row indices of the batch in groups, longest group first, covering every row once.

    `lengths`: each row's real token count. Each group is padded by `bucket_shape`; the plan minimises the
    groups' total cost (module docstring). One group (the whole batch) when splitting does not pay.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1 or len(lengths) == 0:
        raise ValueError(f"lengths must be a non-empty 1-D sequence, got shape {lengths.shape}")
    if attention_span <= 0 or call_overhead < 0 or new_shape_cost < 0:
        raise ValueError(
            "attention_span must be > 0, call_overhead and new_shape_cost >= 0; got "
            f"{attention_span}, {call_overhead}, {new_shape_cost}"
        )
    order = np.argsort(-lengths, kind="stable")
    n = len(order)
    if n == 1:
        return [order]
    # padded length of a group that starts at sorted position i (its longest row), and padded row counts
    group_length = np.array([bucket_shape(1, max(int(lengths[i]), 1))[1] for i in order], dtype=np.float64)
    per_row = group_length * (1.0 + group_length / attention_span)
    padded_rows = np.array([0] + [bucket_shape(k, 1)[0] for k in range(1, n + 1)], dtype=np.int64)
    # a shape as one integer, so that "compiled already?" is one vectorised lookup
    known = np.array([rows * _KEY + length for rows, length in known_shapes], dtype=np.int64)
    best = np.zeros(n + 1)
    start_of = np.zeros(n + 1, dtype=np.int64)
    for end in range(1, n + 1):
        starts = np.arange(end)
        rows = padded_rows[end - starts]
        costs = best[:end] + rows * per_row[:end] + call_overhead
        if new_shape_cost:
            keys = rows * _KEY + group_length[:end].astype(np.int64)
            costs = costs + new_shape_cost * ~np.isin(keys, known)
        start = int(np.argmin(costs))  # ties: the earliest start, i.e. fewer groups
        best[end], start_of[end] = costs[start], start
    groups: list[np.ndarray] = []
    end = n
    while end > 0:
        start = int(start_of[end])
        groups.append(order[start:end])
        end = start
    return groups[::-1]


def take_rows(
    input_ids: np.ndarray, attention_mask: np.ndarray, rows: np.ndarray, padding_side: str
) -> tuple[np.ndarray, np.ndarray]:
    """The batch's `rows`, trimmed to their own longest length on the side they are padded on."""
    mask = attention_mask[rows]
    length = max(int(mask.sum(axis=1).max()), 1)
    columns = slice(0, length) if padding_side == "right" else slice(input_ids.shape[1] - length, None)
    return input_ids[rows][:, columns], mask[:, columns]


def merge_rows(
    parts: list[tuple[np.ndarray, dict]], layout: dict[str, str], batch: int, length: int, padding_side: str
) -> dict:
    """The groups' outputs put back as one batch of (batch, length), padding positions zero.

    `parts`: (row indices, outputs) per group, each output already cut to its group's own length; layouts
    as `buckets.cut_back` reads them ('row', 'tokens' on the padding side, 'after_first' at the front).
    """
    merged: dict[str, np.ndarray] = {}
    for rows, outputs in parts:
        for name, value in outputs.items():
            kind = layout[name]
            if name not in merged:
                extent = {"row": (), "tokens": (length,), "after_first": (length - 1,)}.get(kind)
                if extent is None:
                    raise ValueError(f"unknown output layout {kind!r} for {name}")
                merged[name] = np.zeros((batch, *extent, *value.shape[1 + len(extent) :]), value.dtype)
            target = merged[name]
            if kind == "row":
                target[rows] = value
            elif kind == "tokens" and padding_side == "left":
                target[rows, length - value.shape[1] :] = value
            else:
                target[rows, : value.shape[1]] = value
    return merged
