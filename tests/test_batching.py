"""Token-budget batching, results in input order, and back-off when memory runs out."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from bgem3_embeddings.batching import length_sorted_batches, pad_batch
from tests.tolerances import SCALED, UNIT_VECTORS

LENGTHS = [5, 300, 17, 17, 1000, 64, 2, 513, 128, 17, 9, 700]


def _check_partition(batches: list[np.ndarray], n: int) -> None:
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(n)), "every text exactly once"


@pytest.mark.parametrize("max_tokens", [None, 1, 256, 1000, 2048, 10_000])
@pytest.mark.parametrize("batch_size", [1, 3, 256])
def test_token_budget_and_batch_size(batch_size: int, max_tokens: int | None) -> None:
    batches = length_sorted_batches(LENGTHS, batch_size, max_tokens)
    _check_partition(batches, len(LENGTHS))
    for batch in batches:
        padded = len(batch) * max(LENGTHS[i] for i in batch)
        assert len(batch) <= batch_size
        if max_tokens is not None and len(batch) > 1:
            assert padded <= max_tokens, f"batch {batch.tolist()} holds {padded} padded tokens"


def test_longest_first_and_little_padding() -> None:
    batches = length_sorted_batches(LENGTHS, batch_size=4)
    firsts = [LENGTHS[b[0]] for b in batches]
    assert firsts == sorted(firsts, reverse=True)
    ordered = [LENGTHS[i] for b in batches for i in b]
    assert ordered == sorted(LENGTHS, reverse=True)


def test_equal_lengths_keep_input_order() -> None:
    batches = length_sorted_batches([4, 4, 4, 4], batch_size=3)
    assert [b.tolist() for b in batches] == [[0, 1, 2], [3]]


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        length_sorted_batches([1], 0)
    with pytest.raises(ValueError):
        length_sorted_batches([1], 1, max_tokens=0)


def test_pad_batch() -> None:
    ids, mask = pad_batch([[0, 5, 2], [0, 2]], pad_id=1)
    np.testing.assert_array_equal(ids, [[0, 5, 2], [0, 2, 1]])
    np.testing.assert_array_equal(mask, [[1, 1, 1], [1, 1, 0]])
    assert ids.dtype == mask.dtype == np.int32


# ---------------------------------------------------------------------------------------------- encoder
TEXTS = [("word " * n).strip() for n in (3, 40, 1, 25, 8, 60, 12, 2, 33)]


def _all(encoder: Any, **kwargs: Any) -> dict:
    return encoder.encode(TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True, **kwargs)


def _assert_same(a: dict, b: dict) -> None:
    np.testing.assert_allclose(a["dense_vecs"], b["dense_vecs"], **UNIT_VECTORS)
    for x, y in zip(a["colbert_vecs"], b["colbert_vecs"], strict=True):
        np.testing.assert_allclose(x, y, **UNIT_VECTORS)
    for x, y in zip(a["lexical_weights"], b["lexical_weights"], strict=True):
        assert x.keys() == y.keys()
        np.testing.assert_allclose([x[k] for k in x], [y[k] for k in x], **SCALED)


def test_token_budget_gives_the_same_results_in_input_order(
    tiny_encoder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = _all(tiny_encoder, batch_size=1)
    shapes: list[tuple[int, int]] = []
    run_batch = tiny_encoder.run_batch

    def recording(input_ids: np.ndarray, mask: np.ndarray, outputs: tuple[str, ...]) -> dict:
        shapes.append(input_ids.shape)
        return run_batch(input_ids, mask, outputs)

    monkeypatch.setattr(tiny_encoder, "run_batch", recording)
    monkeypatch.setattr(tiny_encoder, "max_tokens_per_batch", 64)
    budgeted = _all(tiny_encoder, batch_size=256)
    _assert_same(reference, budgeted)
    assert len(shapes) > 1
    assert all(b * s <= 64 or b == 1 for b, s in shapes), shapes


def test_out_of_memory_backs_off_to_smaller_batches(
    tiny_encoder: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    reference = _all(tiny_encoder, batch_size=1)
    run_batch = tiny_encoder.run_batch
    sizes: list[int] = []

    def small_memory(input_ids: np.ndarray, mask: np.ndarray, outputs: tuple[str, ...]) -> dict:
        sizes.append(input_ids.shape[0])
        if input_ids.shape[0] > 2:  # pretend anything above 2 texts does not fit
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor (injected)")
        return run_batch(input_ids, mask, outputs)

    monkeypatch.setattr(tiny_encoder, "run_batch", small_memory)
    with caplog.at_level(logging.WARNING, logger="bgem3_embeddings.encoder"):
        backed_off = _all(tiny_encoder, batch_size=8)
    _assert_same(reference, backed_off)
    assert sizes[0] == 8 and max(sizes[1:]) <= 4
    assert "out of memory" in caplog.text


def test_out_of_memory_on_a_single_text_is_raised(tiny_encoder: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_memory(*_: Any) -> dict:
        raise tf.errors.ResourceExhaustedError(None, None, "OOM (injected)")

    monkeypatch.setattr(tiny_encoder, "run_batch", no_memory)
    with pytest.raises(tf.errors.ResourceExhaustedError):
        tiny_encoder.encode(["one text"])
