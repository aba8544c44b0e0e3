"""The FlagEmbedding-compatible API: shapes, defaults, single inputs and bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.tolerances import UNIT_VECTORS


def test_outputs_not_asked_for_are_none(tiny_encoder: Any) -> None:
    out = tiny_encoder.encode(["one", "two"])
    assert out["lexical_weights"] is None and out["colbert_vecs"] is None
    assert out["dense_vecs"].shape == (2, tiny_encoder.hidden_size) and out["dense_vecs"].dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out["dense_vecs"], axis=1), 1.0, atol=1e-5)
    only_sparse = tiny_encoder.encode(["one"], return_dense=False, return_sparse=True)
    assert only_sparse["dense_vecs"] is None and isinstance(only_sparse["lexical_weights"][0], dict)


def test_single_string_gives_unbatched_results(tiny_encoder: Any) -> None:
    out = tiny_encoder.encode("What is BGE M3?", return_sparse=True, return_colbert_vecs=True)
    assert out["dense_vecs"].shape == (tiny_encoder.hidden_size,)
    assert isinstance(out["lexical_weights"], dict)
    n_tokens = len(tiny_encoder.tokenizer("What is BGE M3?")["input_ids"])
    assert out["colbert_vecs"].shape == (n_tokens - 1, tiny_encoder.hidden_size)


def test_empty_list_gives_empty_results_of_the_right_shape(tiny_encoder: Any) -> None:
    out = tiny_encoder.encode([], return_sparse=True, return_colbert_vecs=True)
    assert out["dense_vecs"].shape == (0, tiny_encoder.hidden_size)
    assert out["lexical_weights"] == [] and out["colbert_vecs"] == []


def test_results_come_back_in_input_order(tiny_encoder: Any) -> None:
    texts = ["a", "a much longer text than the others, with many tokens", "mid length text"]
    batched = tiny_encoder.encode(texts, batch_size=2)["dense_vecs"]
    for i, text in enumerate(texts):
        np.testing.assert_allclose(tiny_encoder.encode(text)["dense_vecs"], batched[i], **UNIT_VECTORS)


def test_over_long_texts_are_truncated_to_max_length(tiny_encoder: Any) -> None:
    long_text = "retrieval " * 400
    out = tiny_encoder.encode([long_text], max_length=16, return_colbert_vecs=True)
    assert out["colbert_vecs"][0].shape[0] == 15  # 16 tokens minus CLS
    truncated_ids = tiny_encoder.tokenizer(long_text, truncation=True, max_length=16)["input_ids"]
    same = tiny_encoder.encode([tiny_encoder.tokenizer.decode(truncated_ids[1:-1])], max_length=16)
    np.testing.assert_allclose(out["dense_vecs"], same["dense_vecs"], atol=1e-5)


def test_max_length_beyond_the_position_table_is_capped(tiny_encoder: Any) -> None:
    out = tiny_encoder.encode(["x " * 10], max_length=100_000, return_colbert_vecs=True)
    assert out["colbert_vecs"][0].shape[0] == len(tiny_encoder.tokenizer("x " * 10)["input_ids"]) - 1


def test_encode_queries_and_corpus_use_their_max_lengths(tiny_encoder: Any) -> None:
    text = "token " * 1000
    saved = tiny_encoder.query_max_length
    tiny_encoder.query_max_length = 8
    try:
        q = tiny_encoder.encode_queries([text], return_colbert_vecs=True)
        p = tiny_encoder.encode_corpus([text], return_colbert_vecs=True, max_length=20)
    finally:
        tiny_encoder.query_max_length = saved
    assert q["colbert_vecs"][0].shape[0] == 7 and p["colbert_vecs"][0].shape[0] == 19


@pytest.mark.parametrize(
    ("sentences", "message"),
    [
        (None, "got None"),
        (["ok", 3], r"sentences\[1\] must be a str, got int"),
        ([None], r"sentences\[0\] must be a str, got NoneType"),
        (42, "got int"),
    ],
)
def test_bad_sentences_give_a_clear_type_error(tiny_encoder: Any, sentences: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        tiny_encoder.encode(sentences)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be a positive int"),
        ({"max_length": 1}, "max_length must be an int >= 2"),
    ],
)
def test_bad_encode_arguments(tiny_encoder: Any, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny_encoder.encode(["text"], **kwargs)


def test_compute_score_single_pair_and_bad_pairs(tiny_encoder: Any) -> None:
    single = tiny_encoder.compute_score(("query", "passage"))
    listed = tiny_encoder.compute_score([("query", "passage")])
    assert (
        set(single) == set(listed) == {"dense", "sparse", "colbert", "sparse+dense", "colbert+sparse+dense"}
    )
    for key in single:
        assert single[key] == pytest.approx(listed[key][0])
    # Default weights are [1, 1, 1] as in the reference: the combination is the plain mean.
    assert single["colbert+sparse+dense"] == pytest.approx(
        (single["dense"] + single["sparse"] + single["colbert"]) / 3
    )
    with pytest.raises(TypeError, match=r"sentence_pairs\[0\] must be a \(query: str, passage: str\) pair"):
        tiny_encoder.compute_score([("only one",)])
    with pytest.raises(ValueError, match="needs 3 numbers"):
        tiny_encoder.compute_score([("a", "b")], weights_for_different_modes=[1, 1])


def test_convert_id_to_token(tiny_encoder: Any) -> None:
    lw = tiny_encoder.encode(["What is BGE M3?"], return_sparse=True)["lexical_weights"]
    converted = tiny_encoder.convert_id_to_token(lw[0])
    assert isinstance(converted, dict) and len(converted) <= len(lw[0])
    expected = {tiny_encoder.tokenizer.decode([int(k)]): v for k, v in lw[0].items()}
    assert converted == expected
    assert tiny_encoder.convert_id_to_token(lw) == [expected]


def test_progress_bar_is_switchable(tiny_encoder: Any, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tiny_encoder.show_progress
    try:
        tiny_encoder.show_progress = True
        tiny_encoder.encode(["one", "two"])
        assert "BGE-M3 encode" in capsys.readouterr().err
        tiny_encoder.show_progress = None  # default: off for short inputs
        tiny_encoder.encode(["one", "two"])
        assert "BGE-M3 encode" not in capsys.readouterr().err
    finally:
        tiny_encoder.show_progress = saved


def test_token_budget_changes_batching_not_results(tiny_encoder: Any) -> None:
    texts = ["short", "a much longer text than the others, with many tokens in it", "mid length text", "x"]
    assert tiny_encoder.max_tokens_per_batch == 8192  # the documented default
    saved = tiny_encoder.max_tokens_per_batch
    try:
        tiny_encoder.max_tokens_per_batch = None
        unbounded = tiny_encoder.encode(texts, return_colbert_vecs=True)
        tiny_encoder.max_tokens_per_batch = 16  # forces one text per batch for the long ones
        bounded = tiny_encoder.encode(texts, return_colbert_vecs=True)
    finally:
        tiny_encoder.max_tokens_per_batch = saved
    np.testing.assert_allclose(bounded["dense_vecs"], unbounded["dense_vecs"], **UNIT_VECTORS)
    for a, b in zip(bounded["colbert_vecs"], unbounded["colbert_vecs"], strict=True):
        np.testing.assert_allclose(a, b, **UNIT_VECTORS)
