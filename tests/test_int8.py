"""precision="int8" (TFLite dynamic-range int8 on CPU) against the reference: int8-appropriate tolerances."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bgem3_embeddings.bench.quality import compare_outputs, encode_all
from bgem3_embeddings.devices import DeviceError
from tests.reference_m3 import ReferenceM3

TEXTS = [
    "What is BGE M3?",
    "Defination of BM25",
    "how do sparse and dense retrieval differ",
    "BGE M3 is an embedding model supporting dense retrieval, lexical matching and multi-vector interaction.",
    "BM25 is a bag-of-words retrieval function that ranks a set of documents based on the query terms "
    "appearing in each document",
    "Der schnelle braune Fuchs springt über den faulen Hund. 東京は日本の首都です。",
]


@pytest.fixture(scope="module")
def int8_encoder(tiny_checkpoint: Path) -> Any:
    from bgem3_embeddings import BGEM3Encoder

    return BGEM3Encoder(tiny_checkpoint, precision="int8", device="cpu")


def test_int8_quality_against_the_reference(int8_encoder: Any, tiny_checkpoint: Path) -> None:
    ref = ReferenceM3(tiny_checkpoint).encode(TEXTS)
    ours = encode_all(int8_encoder, TEXTS, 8192)
    # the encoder's int8 runner ran its mixed-length batches as groups at their own lengths
    assert int8_encoder._int8.splitter.split_batches > 0
    report = compare_outputs(ref, ours, queries=[0, 1, 2], passages=[3, 4, 5])
    # int8 weights and activations: about 2 significant digits per product, so the int8 bounds
    # (dense cosine >= 0.99, ColBERT score within 0.02), not float32's.
    assert report["dense_cosine_mean"] >= 0.99, report
    assert report["colbert_score_diff_max"] <= 0.02, report
    # Lexical scores here reach 5 (sums of weight products); a 1-4% error on them is int8's precision
    # (measured: at most 3.5%, TF 2.18 and 2.21, Intel AVX-512), so the bound is relative.
    assert report["lexical_score_rel_diff_max"] <= 0.1, report
    # Not trivially equal: the int8 path really quantizes (float32 agrees with the reference to ~1e-6).
    assert report["dense_cosine_min"] < 1 - 1e-6, report


def test_int8_outputs_have_the_float_layout(int8_encoder: Any) -> None:
    out = int8_encoder.encode(TEXTS[:2], return_dense=True, return_sparse=True, return_colbert_vecs=True)
    assert out["dense_vecs"].shape == (2, int8_encoder.hidden_size)
    assert out["dense_vecs"].dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out["dense_vecs"], axis=1), 1.0, atol=1e-5)
    n = [len(t) for t in int8_encoder.tokenize(TEXTS[:2], 8192)]
    assert [v.shape[0] for v in out["colbert_vecs"]] == [k - 1 for k in n]
    assert int8_encoder.model is None and int8_encoder.compute_dtype == "int8"


def test_int8_second_load_reuses_the_converted_flatbuffer(
    int8_encoder: Any, tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bgem3_embeddings import BGEM3Encoder
    from bgem3_embeddings.backends.tensorflow import int8

    def fail(model: Any) -> bytes:
        raise AssertionError("converted again although the flatbuffer is cached")

    monkeypatch.setattr(int8, "convert_to_int8", fail)
    again = BGEM3Encoder(tiny_checkpoint, precision="int8", device="cpu")
    assert again._int8.path == int8_encoder._int8.path


def test_int8_is_cpu_only_and_takes_no_compute_dtype(tiny_checkpoint: Path) -> None:
    from bgem3_embeddings import BGEM3Encoder

    with pytest.raises(DeviceError, match="compute_dtype"):
        BGEM3Encoder(tiny_checkpoint, precision="int8", compute_dtype="float32", device="cpu")


@pytest.mark.slow
def test_full_size_int8_quality(tmp_path_factory: pytest.TempPathFactory) -> None:
    """BGE-M3 size, random init: the issue's int8 bounds against float32 (dense cosine >= 0.99 mean,
    ColBERT score difference <= 0.02)."""
    from bgem3_embeddings import BGEM3Encoder
    from bgem3_embeddings.bench.corpus import build_corpus
    from bgem3_embeddings.bench.quality import quality_report
    from tests.tiny_checkpoint import make_tiny_checkpoint

    path = make_tiny_checkpoint(tmp_path_factory.mktemp("full_int8"), size="full", seed=1)
    ref = BGEM3Encoder(path, precision="float32", device="cpu", max_tokens_per_batch=4096)
    corpus = build_corpus(ref.tokenizer, 12, seed=3, max_length=256)
    int8 = BGEM3Encoder(path, precision="int8", device="cpu", max_tokens_per_batch=4096)
    report = quality_report(ref, int8, corpus.texts, [len(t) for t in corpus.token_ids], max_length=256)
    assert report["dense_cosine_mean"] >= 0.99, report
    assert report["colbert_score_diff_max"] <= 0.02, report


@pytest.mark.parametrize("side", ["right", "left"])
def test_int8_row_groups_hold_the_reference_outputs(
    int8_encoder: Any, tiny_checkpoint: Path, side: str
) -> None:
    """A batch run as one-row interpreter calls (what long batches get) keeps every row's own outputs."""
    from bgem3_embeddings.backends.tensorflow.int8 import Int8Runner, rows_per_call
    from bgem3_embeddings.batching import pad_batch
    from tests.reference_m3 import assert_batch_matches_reference

    token_ids = int8_encoder.tokenize(TEXTS, 8192)
    input_ids, mask = pad_batch(token_ids, pad_id=1, side=side)
    outputs = ("dense_vecs", "sparse_weights", "colbert_vecs")
    one_row = Int8Runner(int8_encoder._int8.path, tokens_per_call=1)
    assert rows_per_call(input_ids.shape[1], one_row.tokens_per_call) == 1
    grouped = one_row(input_ids, mask, outputs)
    # Each row got, to the float32 bit, what its text gets alone: a row's outputs do not depend on its
    # padding or on the call it ran in (a 1e-2 pad leak would pass the int8 bounds below, not this).
    assert_rows_hold_their_alone_outputs(grouped, mask, _alone(one_row, token_ids, outputs))
    ref = ReferenceM3(tiny_checkpoint).encode_ids(token_ids)
    # ... and what a text gets alone is the reference's within int8's bounds: measured up to 0.006 (dense),
    # 0.015 (ColBERT) and 0.028 (sparse weights up to 2.3) per value; a misplaced row or token would differ
    # by the values themselves (0.1-2).
    assert_batch_matches_reference(grouped, input_ids, mask, ref, atol=0.05, rtol=0.02)


@pytest.mark.parametrize("side", ["right", "left"])
def test_int8_splits_mixed_lengths_and_holds_the_reference_outputs(
    int8_encoder: Any, tiny_checkpoint: Path, side: str
) -> None:
    """A batch of mixed lengths runs as length-sorted groups at their own lengths, as the float runners
    do on the CPU (backends/portable/sub_batches.py): fewer padded tokens, every row back in place, the
    reference's outputs within int8's bounds, for either padding side."""
    from bgem3_embeddings.backends.portable.sub_batches import exact_length_splitter
    from bgem3_embeddings.backends.tensorflow.int8 import Int8Runner
    from bgem3_embeddings.batching import pad_batch
    from bgem3_embeddings.model import BGEM3Model
    from tests.reference_m3 import assert_batch_matches_reference

    token_ids = int8_encoder.tokenize(TEXTS, 8192)
    input_ids, mask = pad_batch(token_ids, pad_id=1, side=side)
    splitter = exact_length_splitter(int8_encoder.hidden_size, BGEM3Model.OUTPUT_LAYOUT, side)
    runner = Int8Runner(int8_encoder._int8.path, splitter=splitter)
    seen: list[tuple[int, int]] = []
    run_padded = runner._run_padded
    runner._run_padded = lambda ids, m, outputs: seen.append(ids.shape) or run_padded(ids, m, outputs)
    got = runner(input_ids, mask, ("dense_vecs", "sparse_weights", "colbert_vecs"))
    assert splitter.split_batches == 1 and len(seen) > 1
    assert sum(rows * length for rows, length in seen) < input_ids.size  # padding not computed
    outputs = ("dense_vecs", "sparse_weights", "colbert_vecs")
    assert_rows_hold_their_alone_outputs(got, mask, _alone(runner, token_ids, outputs))  # to the bit
    ref = ReferenceM3(tiny_checkpoint).encode_ids(token_ids)
    assert_batch_matches_reference(got, input_ids, mask, ref, atol=0.05, rtol=0.02)  # bounds: above


@pytest.mark.parametrize("side", ["right", "left"])
def test_int8_text_gets_the_outputs_it_gets_alone_in_any_batch(
    int8_encoder: Any, tiny_checkpoint: Path, side: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The int8 split (docs/precision-and-devices.md#int8-cpu): each text encoded alone, then inside mixed
    batches of other companions, padded on either side: the same dense vector, lexical weights and ColBERT
    vectors, to the float32 bit. The tiny checkpoint's int8 outputs never move with padding, so this holds
    for a text padded within its group too; at full size such a text can move (by 4.8e-3, measured)."""
    from bgem3_embeddings import BGEM3Encoder

    encoder = (
        int8_encoder
        if side == "right"
        else BGEM3Encoder(tiny_checkpoint, precision="int8", device="cpu", padding_side="left")
    )
    kinds = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    alone = [encoder.encode([text], **kinds) for text in TEXTS]
    calls: list[np.ndarray] = []  # each interpreter call's real lengths, its padded length last
    run_padded = encoder._int8._run_padded
    monkeypatch.setattr(
        encoder._int8,
        "_run_padded",
        lambda ids, mask, outputs: (
            calls.append(np.append(mask.sum(axis=1), ids.shape[1])) or run_padded(ids, mask, outputs)
        ),
    )
    splits = encoder._int8.splitter.split_batches
    mixes = [[0, 1, 2, 3, 4, 5], [5, 0, 4, 1], [2, 3], [4, 4, 0]]
    for mix in mixes:
        out = encoder.encode([TEXTS[i] for i in mix], batch_size=len(mix), **kinds)
        for row, i in enumerate(mix):
            where = f"text {i} in batch {mix} ({side} padding)"
            np.testing.assert_array_equal(out["dense_vecs"][row], alone[i]["dense_vecs"][0], err_msg=where)
            assert out["lexical_weights"][row] == alone[i]["lexical_weights"][0], where
            np.testing.assert_array_equal(
                out["colbert_vecs"][row], alone[i]["colbert_vecs"][0], err_msg=where
            )
    # The batches ran split (not as one padded call), and the check covered both kinds of row the split
    # makes: a text alone in its group, and a text padded to a longer companion within its group.
    assert encoder._int8.splitter.split_batches > splits
    assert any(len(c) == 2 for c in calls) and any((c[:-1] < c[-1]).any() for c in calls), calls


def _alone(runner: Any, token_ids: list[list[int]], outputs: tuple[str, ...]) -> list[dict[str, np.ndarray]]:
    """Each text's outputs from the runner on its own, unpadded."""
    return [runner(np.array([ids], np.int32), np.ones((1, len(ids)), np.int32), outputs) for ids in token_ids]


def assert_rows_hold_their_alone_outputs(
    out: dict[str, np.ndarray], attention_mask: np.ndarray, alone: list[dict[str, np.ndarray]]
) -> None:
    """Row by row (either padding side), a padded batch's raw outputs equal, to the bit, its text's outputs
    alone: the dense vector, the sparse weights of its real tokens (zero on padding), its ColBERT rows."""
    for row, mask in enumerate(np.asarray(attention_mask)):
        real = np.nonzero(mask)[0]
        one, where = alone[row], f"row {row} ({len(real)} of {len(mask)} tokens real)"
        np.testing.assert_array_equal(out["dense_vecs"][row], one["dense_vecs"][0], err_msg=where)
        np.testing.assert_array_equal(
            out["sparse_weights"][row][real], one["sparse_weights"][0], err_msg=where
        )
        assert not out["sparse_weights"][row][mask == 0].any(), where
        n = len(real) - 1  # ColBERT rows: the text's tokens after <s>, first, then zero rows
        np.testing.assert_array_equal(out["colbert_vecs"][row][:n], one["colbert_vecs"][0], err_msg=where)
        assert not out["colbert_vecs"][row][n:].any(), where


def test_rows_per_call_bounds_each_call() -> None:
    from bgem3_embeddings.backends.tensorflow.int8 import rows_per_call

    assert [rows_per_call(s) for s in (8192, 992, 512, 256, 16)] == [1, 1, 2, 4, 64]
    assert rows_per_call(100, tokens_per_call=1) == 1


def test_int8_warns_once_about_long_rows(int8_encoder: Any, caplog: pytest.LogCaptureFixture) -> None:
    from bgem3_embeddings.backends.tensorflow.int8 import LONG_ROW_WARNING_TOKENS, Int8Runner

    runner = Int8Runner(int8_encoder._int8.path)
    short = np.array([[0, 5, 2]], np.int32)
    runner(short, np.ones_like(short), ("dense_vecs",))
    assert "plain attention" not in caplog.text
    n = LONG_ROW_WARNING_TOKENS + 1
    long_ids = np.array([[0] + [5] * (n - 2) + [2]], np.int32)
    for _ in range(2):
        out = runner(long_ids, np.ones_like(long_ids), ("dense_vecs",))
    assert out["dense_vecs"].shape == (1, int8_encoder.hidden_size)
    assert caplog.text.count("int8 runs plain attention") == 1, caplog.text
