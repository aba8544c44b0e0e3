"""backends/portable/sub_batches.py: the split plan against an exhaustive search, and the rows put back in
place.

Whether split batches give the reference's outputs is held against FlagEmbedding in tests/test_backends.py
(JAX splits its mixed-length batch there); these tests pin the plan and the bookkeeping.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bgem3_embeddings.backends.portable.buckets import bucket_shape
from bgem3_embeddings.backends.portable.sub_batches import (
    BatchSplitter,
    ShapeOf,
    exact_shape,
    merge_rows,
    plan_sub_batches,
    take_rows,
)

SPAN = 6 * 1024.0


def _cost(
    groups: list[np.ndarray], lengths: np.ndarray, overhead: float, shape_of: ShapeOf = bucket_shape
) -> float:
    total = 0.0
    for rows in groups:
        padded_rows, padded_length = shape_of(len(rows), max(int(lengths[rows].max()), 1))
        total += padded_rows * padded_length * (1 + padded_length / SPAN) + overhead
    return total


def _best_contiguous_cost(lengths: np.ndarray, overhead: float, shape_of: ShapeOf = bucket_shape) -> float:
    """Every way to cut the longest-first order into runs, tried."""
    order = np.argsort(-lengths, kind="stable")
    n = len(order)
    best = float("inf")
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0, *[i + 1 for i, cut in enumerate(cuts) if cut], n]
        groups = [order[a:b] for a, b in itertools.pairwise(bounds)]
        best = min(best, _cost(groups, lengths, overhead, shape_of))
    return best


@pytest.mark.parametrize("shape_of", [bucket_shape, exact_shape], ids=["buckets", "exact"])
@pytest.mark.parametrize("seed", range(6))
def test_plan_is_the_cheapest_split_and_covers_every_row_once(seed: int, shape_of: ShapeOf) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.choice([3, 16, 60, 200, 300, 511, 770, 1500], size=int(rng.integers(2, 9)))
    overhead = float(rng.choice([0.0, 16.0, 512.0]))
    groups = plan_sub_batches(lengths, attention_span=SPAN, call_overhead=overhead, shape_of=shape_of)
    assert sorted(np.concatenate(groups).tolist()) == list(range(len(lengths)))
    assert _cost(groups, lengths, overhead, shape_of) == pytest.approx(
        _best_contiguous_cost(lengths, overhead, shape_of)
    )


def test_a_short_text_beside_a_long_one_runs_apart_and_even_lengths_stay_together() -> None:
    groups = plan_sub_batches([770, 7, 300, 250], attention_span=SPAN, call_overhead=16)
    assert [g.tolist() for g in groups][0] == [0]  # the 770-token row alone, first
    assert len(groups) > 1
    assert [g.tolist() for g in plan_sub_batches([100] * 8, attention_span=SPAN, call_overhead=16)] == [
        list(range(8))
    ]


def test_an_uncompiled_shape_must_pay_for_its_compile() -> None:
    lengths = [770, 7, 300, 250]
    kwargs = {"attention_span": SPAN, "call_overhead": 16.0, "new_shape_cost": 1e6}
    # only the whole batch's shape is compiled: a split would compile new shapes, so none
    whole = plan_sub_batches(lengths, known_shapes={bucket_shape(4, 770)}, **kwargs)
    assert len(whole) == 1
    # once the split's shapes are compiled, it pays again
    split = plan_sub_batches([770, 7, 300, 250], attention_span=SPAN, call_overhead=16.0)
    shapes = {bucket_shape(len(g), max(lengths[i] for i in g)) for g in split}
    assert len(plan_sub_batches(lengths, known_shapes=shapes, **kwargs)) == len(split)


@pytest.mark.parametrize(
    ("lengths", "kwargs", "message"),
    [
        ([], {"attention_span": SPAN, "call_overhead": 0}, "non-empty"),
        ([3, 4], {"attention_span": 0, "call_overhead": 0}, "attention_span"),
        ([3, 4], {"attention_span": SPAN, "call_overhead": -1}, "call_overhead"),
    ],
)
def test_bad_plan_arguments_are_named(lengths: list[int], kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_sub_batches(lengths, **kwargs)


def _padded(lengths: list[int], side: str, pad_id: int = 1) -> tuple[np.ndarray, np.ndarray]:
    width = max(lengths)
    ids = np.full((len(lengths), width), pad_id, np.int32)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        cols = slice(0, n) if side == "right" else slice(width - n, width)
        ids[row, cols] = 10 * (row + 1) + np.arange(n)
        mask[row, cols] = 1
    return ids, mask


def _outputs(ids: np.ndarray, mask: np.ndarray, side: str) -> dict[str, np.ndarray]:
    """What a model gives per layout, padding zero: a row value, one per token, and the tokens after the
    first moved to the front (as BGEM3Model's ColBERT output is)."""
    tokens = (ids * mask).astype(np.float32)
    after = np.zeros((ids.shape[0], ids.shape[1] - 1, 2), np.float32)
    for row in range(ids.shape[0]):
        real = ids[row][mask[row] == 1][1:]
        after[row, : len(real)] = np.stack([real, -real], axis=-1)
    return {"row": tokens.sum(axis=1, keepdims=True), "tokens": tokens, "after": after}


@pytest.mark.parametrize("side", ["right", "left"])
def test_rows_taken_apart_and_merged_match_the_whole_batch(side: str) -> None:
    lengths = [9, 2, 5, 1, 7]
    ids, mask = _padded(lengths, side)
    layout = {"row": "row", "tokens": "tokens", "after": "after_first"}
    parts = []
    for rows in (np.array([0, 4]), np.array([2, 1]), np.array([3])):
        sub_ids, sub_mask = take_rows(ids, mask, rows, side)
        assert sub_ids.shape[1] == max(lengths[i] for i in rows)  # trimmed to the group's longest row
        parts.append((rows, _outputs(sub_ids, sub_mask, side)))
    merged = merge_rows(parts, layout, len(lengths), max(lengths), side)
    whole = _outputs(ids, mask, side)
    assert merged.keys() == whole.keys()
    for name in whole:
        np.testing.assert_array_equal(merged[name], whole[name], err_msg=name)


def test_an_unknown_layout_is_named() -> None:
    with pytest.raises(ValueError, match="'diagonal'"):
        merge_rows([(np.array([0]), {"x": np.zeros((1, 3))})], {"x": "diagonal"}, 1, 3, "right")


@pytest.mark.parametrize("side", ["right", "left"])
def test_the_splitter_runs_the_plan_and_puts_the_rows_back(side: str) -> None:
    """The runner's call sees each group trimmed to its own longest row; the caller sees the whole batch."""
    lengths = [770, 7, 300, 250, 6]
    ids, mask = _padded(lengths, side)
    layout = {"row": "row", "tokens": "tokens", "after": "after_first"}
    calls: list[tuple[int, int]] = []

    def run_one(sub_ids: np.ndarray, sub_mask: np.ndarray) -> dict[str, np.ndarray]:
        calls.append(sub_ids.shape)
        return _outputs(sub_ids, sub_mask, side)

    splitter = BatchSplitter(
        attention_span=SPAN, call_overhead=16, shape_of=exact_shape, layout=layout, padding_side=side
    )
    merged = splitter.run(run_one, ids, mask)
    planned = plan_sub_batches(lengths, attention_span=SPAN, call_overhead=16, shape_of=exact_shape)
    assert calls == [(len(g), max(lengths[i] for i in g)) for g in planned] and len(calls) > 1
    assert splitter.split_batches == 1
    whole = _outputs(ids, mask, side)
    for name in whole:
        np.testing.assert_array_equal(merged[name], whole[name], err_msg=name)


def test_the_splitter_runs_one_call_off_the_cpu_and_for_even_lengths() -> None:
    """An infinite call overhead (TensorFlow and PyTorch on a GPU) and a batch of one length: one call."""
    layout = {"row": "row", "tokens": "tokens", "after": "after_first"}
    calls: list[tuple[int, int]] = []

    def run_one(sub_ids: np.ndarray, sub_mask: np.ndarray) -> dict[str, np.ndarray]:
        calls.append(sub_ids.shape)
        return _outputs(sub_ids, sub_mask, "right")

    for overhead, lengths in ((float("inf"), [770, 7, 300]), (16.0, [40, 40, 40])):
        calls.clear()
        splitter = BatchSplitter(
            attention_span=SPAN,
            call_overhead=overhead,
            shape_of=exact_shape,
            layout=layout,
            padding_side="right",
        )
        ids, mask = _padded(lengths, "right")
        splitter.run(run_one, ids, mask)
        assert calls == [ids.shape] and splitter.split_batches == 0
