"""Splitting one padded batch into a few shorter calls when padding would cost more than the extra calls.

Every row of a padded batch is computed at the length of the batch's longest row, and a runner that
compiles per shape pads further, up to a bucket (`backends.portable.buckets.bucket_shape`). A batch of mixed
lengths (a short query beside a 770-token passage, a server's concurrent requests) then spends most of its
work on padding. Run instead as length-sorted groups, each padded to its own length (or bucket), the same rows
cost less: `plan_sub_batches` picks the split with the lowest estimated cost, by dynamic programming over the
rows sorted longest first (a group is a run of that order, as in `batching.length_sorted_batches`), and
`BatchSplitter` runs a batch that way through a runner's own call.

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

from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from bgem3_embeddings.backends.portable.buckets import bucket_shape

ShapeOf = Callable[[int, int], tuple[int, int]]


def exact_shape(rows: int, length: int) -> tuple[int, int]:
    """The shape a runner that takes any shape (TensorFlow's [None, None] graph, eager PyTorch) computes."""
    return rows, length


# What one more call is worth on the CPU, in padded tokens: a full-size token takes about 17-22 ms there
# (2-vCPU EPYC, docs/performance.md) and a call's dispatch of some 600 ops (24 layers, eager or in a graph)
# about as long as one token; 16 keeps a split to the batches where it saves a clear share of the work.
CPU_CALL_OVERHEAD = 16.0


def attention_span(hidden_size: int) -> float:
    """The length at which attention's work per token equals the dense layers': 6 x hidden size (above)."""
    return 6.0 * hidden_size


_KEY = 1 << 32  # (rows, length) -> rows * _KEY + length: lengths stay far below 2**32


def plan_sub_batches(
    lengths: Sequence[int] | np.ndarray,
    *,
    attention_span: float,
    call_overhead: float,
    new_shape_cost: float = 0.0,
    known_shapes: Collection[tuple[int, int]] = (),
    shape_of: ShapeOf = bucket_shape,
) -> list[np.ndarray]:
    """Row indices of the batch in groups, longest group first, covering every row once.

    `lengths`: each row's real token count. A group of k rows, the longest n tokens, runs as `shape_of(k,
    n)` (rows and length rounded independently: `bucket_shape`, or `exact_shape`); the plan minimises the
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
    group_length = np.array([shape_of(1, max(int(lengths[i]), 1))[1] for i in order], dtype=np.float64)
    per_row = group_length * (1.0 + group_length / attention_span)
    padded_rows = np.array([0] + [shape_of(k, 1)[0] for k in range(1, n + 1)], dtype=np.int64)
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
    as `backends.portable.buckets.cut_back` reads them ('row', 'tokens' on the padding side, 'after_first' at
    the front).
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


class BatchSplitter:
    """Runs a padded batch as the cheapest split (`plan_sub_batches`) through a runner's call of one group.

    A runner keeps one, priced for its device: `call_overhead` and `new_shape_cost` in padded tokens,
    `shape_of` the shape a group runs at, `known_shapes` the runner's own set of compiled shapes (read at
    each plan). `split_batches` counts the batches that ran as more than one call.

        >>> splitter = BatchSplitter(attention_span=6144, call_overhead=16, shape_of=exact_shape,
        ...                          layout={"dense_vecs": "row"}, padding_side="right")
        >>> def run_one(ids, mask):  # the runner's call: outputs cut to the group's own shape
        ...     return {"dense_vecs": mask.sum(axis=1, keepdims=True).astype(np.float32)}
        >>> mask = np.array([[1] * 770, [1] * 7 + [0] * 763])
        >>> splitter.run(run_one, np.ones_like(mask), mask)["dense_vecs"].ravel().tolist()
        [770.0, 7.0]
        >>> splitter.split_batches
        1
    """

    def __init__(
        self,
        *,
        attention_span: float,
        call_overhead: float,
        layout: dict[str, str],
        padding_side: str,
        new_shape_cost: float = 0.0,
        shape_of: ShapeOf = bucket_shape,
        known_shapes: Collection[tuple[int, int]] = (),
    ) -> None:
        self.attention_span = attention_span
        self.call_overhead = call_overhead
        self.new_shape_cost = new_shape_cost
        self.shape_of = shape_of
        self.known_shapes = known_shapes
        self.layout = layout
        self.padding_side = padding_side
        self.split_batches = 0

    def run(
        self,
        run_one: Callable[[np.ndarray, np.ndarray], dict],
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
    ) -> dict:
        """`run_one(input_ids, attention_mask)` on the whole batch, or on each group of the cheapest split
        with the rows put back in place: the same outputs either way (module docstring). An infinite
        `call_overhead` never splits."""
        if self.call_overhead == float("inf") or len(input_ids) == 1:
            return run_one(input_ids, attention_mask)
        groups = plan_sub_batches(
            attention_mask.sum(axis=1),
            attention_span=self.attention_span,
            call_overhead=self.call_overhead,
            new_shape_cost=self.new_shape_cost,
            known_shapes=self.known_shapes,
            shape_of=self.shape_of,
        )
        if len(groups) == 1:
            return run_one(input_ids, attention_mask)
        self.split_batches += 1
        batch, length = input_ids.shape
        parts = [
            (rows, run_one(*take_rows(input_ids, attention_mask, rows, self.padding_side))) for rows in groups
        ]
        return merge_rows(parts, self.layout, batch, length, self.padding_side)


def exact_shape_splitter(model: Any, device_kind: str, padding_side: str) -> BatchSplitter:
    """The splitter of a runner that runs any shape as it is (TensorFlow's [None, None] graph, eager
    PyTorch): groups at their exact lengths, on the CPU only. On a GPU a small batch does not fill the
    device, so its padding costs little there while each call adds launch latency: one call."""
    overhead = CPU_CALL_OVERHEAD if device_kind == "cpu" else float("inf")
    return exact_length_splitter(model.config.hidden_size, model.OUTPUT_LAYOUT, padding_side, overhead)


def exact_length_splitter(
    hidden_size: int, layout: dict[str, str], padding_side: str, call_overhead: float = CPU_CALL_OVERHEAD
) -> BatchSplitter:
    """Groups at their exact lengths, from the model's sizes: also the int8 runner's (TFLite takes any
    shape, on the CPU), which has no Keras model to read them from."""
    return BatchSplitter(
        attention_span=attention_span(hidden_size),
        call_overhead=call_overhead,
        shape_of=exact_shape,
        layout=layout,
        padding_side=padding_side,
    )
