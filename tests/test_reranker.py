"""BGEM3Reranker against FlagEmbedding's FlagReranker (1.4.2, on the installed transformers) on tiny random
bge-reranker-v2-m3 layout checkpoints: scores, ranks, pair token ids, both weight formats and padding sides,
bf16, and each bad input's error."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.flagembedding_ref import flag_reranker
from tests.tiny_checkpoint import SAMPLE_TEXT, make_tiny_reranker_checkpoint
from tests.tolerances import APPROX, SCALED

# Multilingual pairs: CJK, Arabic, emoji, combining marks (e + U+0301), a query long enough to be cut at
# 3/4 of max_length, a passage long enough to be cut by 'only_second', an empty passage.
LONG_QUERY = " ".join(SAMPLE_TEXT[:12]) * 4
LONG_PASSAGE = " ".join(SAMPLE_TEXT) * 3
PAIRS = [
    ("What is BGE M3?", "BGE M3 is an embedding model supporting dense retrieval, lexical matching."),
    ("What is BGE M3?", "Defination of BM25"),
    ("搜索引擎返回什么?", "搜索引擎返回与查询最相关的文档。"),
    ("検索エンジン", "검색 엔진은 질문과 가장 관련 있는 문서를 찾습니다."),
    ("الثعلب البني", "الثعلب البني السريع يقفز فوق الكلب الكسول."),
    ("café 😀 naïve", "Cafe\u0301 🚀 nai\u0308ve: combining marks and emoji 👍🏽 in one passage."),
    (LONG_QUERY, "Paris is the capital of France."),
    ("Which animal jumps?", LONG_PASSAGE),
    (LONG_QUERY, LONG_PASSAGE),
    ("Der schnelle braune Fuchs", ""),
    ("", "The quick brown fox jumps over the lazy dog."),
    ("Быстрая лиса", "Быстрая коричневая лиса прыгает через ленивую собаку."),
]
# bf16 weights and matmul inputs carry about 3 significant digits: on the tiny checkpoint (seed 0) the
# largest difference from the float32 reference measured 4.9e-3 on logits of size ~1; 10x margin.
BF16_ATOL = 5e-2
# int8 weights (per output channel) and activations (per row): 1.53e-2 measured on the same checkpoint (both
# padding sides, split or alone: the same scores to the bit); 2x margin.
INT8_ATOL = 3e-2


@pytest.fixture(scope="module")
def checkpoint_pt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny reranker's weights as pytorch_model.bin only (the safe torch-pickle route)."""
    return make_tiny_reranker_checkpoint(tmp_path_factory.mktemp("reranker_pt"), weights="pytorch", seed=1)


@pytest.fixture(scope="module")
def reference(tiny_reranker_checkpoint: Path) -> Any:
    return flag_reranker(tiny_reranker_checkpoint)


@pytest.fixture(scope="module")
def reranker(tiny_reranker_checkpoint: Path) -> Any:
    from bgem3_embeddings import BGEM3Reranker

    return BGEM3Reranker(tiny_reranker_checkpoint, precision="float32", device="cpu")


def _assert_same_scores_and_ranks(ours: list[float], ref: list[float]) -> None:
    np.testing.assert_allclose(ours, ref, **SCALED)
    # Every two pairs whose reference scores are apart by more than the tolerance come in the same order.
    mine, theirs = np.asarray(ours), np.asarray(ref)
    apart = np.abs(theirs[:, None] - theirs[None, :]) > 1e-4
    assert apart.sum() >= 0.9 * len(ref) * (len(ref) - 1), "the test pairs score too close together to rank"
    order = np.sign(mine[:, None] - mine[None, :])
    assert np.array_equal(order[apart], np.sign(theirs[:, None] - theirs[None, :])[apart])


@pytest.mark.parametrize("normalize", [False, True])
def test_scores_equal_flagreranker(reranker: Any, reference: Any, normalize: bool) -> None:
    ours = reranker.compute_score(PAIRS, normalize=normalize)
    ref = reference.compute_score(PAIRS, normalize=normalize)
    assert isinstance(ours, list) and all(isinstance(s, float) for s in ours)
    _assert_same_scores_and_ranks(ours, ref)
    if normalize:
        assert all(0.0 < s < 1.0 for s in ours)


@pytest.mark.parametrize("max_length", [24, 64])
def test_truncation_equals_flagreranker(reranker: Any, reference: Any, max_length: int) -> None:
    ours = reranker.compute_score(PAIRS[:9], max_length=max_length, batch_size=4)
    ref = reference.compute_score(PAIRS[:9], max_length=max_length, batch_size=4)
    np.testing.assert_allclose(ours, ref, **SCALED)
    assert max(len(ids) for ids in reranker.tokenize_pairs(PAIRS, max_length=max_length)) == max_length


def test_pair_token_ids_equal_flagrerankers(reranker: Any, reference: Any) -> None:
    """FlagReranker's own tokenization steps (its tokenizer, prepare_for_model_compat) on random pairs."""
    from FlagEmbedding.utils.tokenizer_compat import prepare_for_model_compat

    def theirs(query: str, passage: str, max_length: int) -> list[int] | None:
        tok = reference.tokenizer
        q = tok([query], add_special_tokens=False, max_length=max_length * 3 // 4, truncation=True)
        p = tok([passage], add_special_tokens=False, max_length=max_length, truncation=True)
        try:
            out = prepare_for_model_compat(
                tok, q["input_ids"][0], p["input_ids"][0], truncation="only_second", max_length=max_length
            )
        except Exception:  # the tokenizers library refuses a pair whose passage cannot be cut enough
            return None
        return list(out["input_ids"])

    from bgem3_embeddings.reranker.pairs import PairTooLongError

    rng = random.Random(0)
    texts = [*SAMPLE_TEXT, *(t for pair in PAIRS[:6] for t in pair), "  spaced   out  ", "a<unk>b", ""]
    checked = refused = 0
    for max_length in (4, 8, 20, 48, 512):
        for _ in range(60):
            query = " ".join(rng.sample(texts, rng.randint(1, 3)))[: rng.randint(0, 200)]
            passage = " ".join(rng.sample(texts, rng.randint(1, 5)))
            expected = theirs(query, passage, max_length)
            if expected is None:
                with pytest.raises(PairTooLongError, match="max_length"):
                    reranker.tokenize_pairs([(query, passage)], max_length=max_length)
                refused += 1
                continue
            assert reranker.tokenize_pairs([(query, passage)], max_length=max_length) == [expected]
            checked += 1
    assert checked > 200 and refused > 0  # both FlagReranker's results and its refusals were met


def test_pytorch_model_bin_equals_flagreranker(checkpoint_pt: Path) -> None:
    from bgem3_embeddings import BGEM3Reranker

    ours = BGEM3Reranker(checkpoint_pt, precision="float32", device="cpu", weights_cache=False)
    assert ours.files.weights.name == "pytorch_model.bin"
    _assert_same_scores_and_ranks(
        ours.compute_score(PAIRS), flag_reranker(checkpoint_pt).compute_score(PAIRS)
    )


def test_left_padding_and_small_batches_give_the_same_scores(
    tiny_reranker_checkpoint: Path, reranker: Any
) -> None:
    from bgem3_embeddings import BGEM3Reranker

    left = BGEM3Reranker(
        tiny_reranker_checkpoint, precision="float32", device="cpu", padding_side="left", batch_size=3
    )
    expected = reranker.compute_score(PAIRS)
    np.testing.assert_allclose(left.compute_score(PAIRS), expected, **SCALED)
    # Batches capped by padded tokens: the longest pairs alone, the rest together; input order kept.
    capped = reranker.score_token_ids(reranker.tokenize_pairs(PAIRS), batch_size=5)
    np.testing.assert_allclose(capped, expected, **SCALED)


def test_bfloat16_within_its_tolerance(tiny_reranker_checkpoint: Path, reference: Any) -> None:
    from bgem3_embeddings import BGEM3Reranker

    bf16 = BGEM3Reranker(tiny_reranker_checkpoint, precision="bfloat16", device="cpu")
    assert bf16.precision == "bfloat16"
    ours = np.array(bf16.compute_score(PAIRS))
    ref = np.array(reference.compute_score(PAIRS))
    np.testing.assert_allclose(ours, ref, rtol=0, atol=BF16_ATOL)
    assert not np.allclose(ours, ref, **SCALED)  # it did run in bf16


def test_int8_within_its_tolerance(tiny_reranker_checkpoint: Path, reference: Any, tmp_path: Path) -> None:
    """precision="int8": the float32 model converted once to a dynamic-range int8 TFLite flatbuffer, then
    mapped from the cache by the next reranker."""
    from bgem3_embeddings import BGEM3Reranker

    int8 = BGEM3Reranker(tiny_reranker_checkpoint, precision="int8", device="cpu", weights_cache=tmp_path)
    assert int8.model is None and len(list(tmp_path.glob("*-int8-*.tflite"))) == 1
    ours, ref = np.array(int8.compute_score(PAIRS)), np.array(reference.compute_score(PAIRS))
    np.testing.assert_allclose(ours, ref, rtol=0, atol=INT8_ATOL)
    apart = np.abs(ref[:, None] - ref[None, :]) > 2 * INT8_ATOL  # pairs int8 cannot swap
    # most of the 66 pairs of pairs (51 here), so the order check below covers the ranking, not one swap
    assert apart.sum() // 2 >= 40, f"only {apart.sum() // 2} of 66 pairs of pairs apart"
    assert np.array_equal(
        np.sign(ours[:, None] - ours[None, :])[apart], np.sign(ref[:, None] - ref[None, :])[apart]
    )
    again = BGEM3Reranker(tiny_reranker_checkpoint, precision="int8", device="cpu", weights_cache=tmp_path)
    np.testing.assert_array_equal(again.compute_score(PAIRS), ours)


@pytest.mark.parametrize("side", ["right", "left"])
def test_int8_splits_mixed_pairs_and_scores_each_as_alone(
    tiny_reranker_checkpoint: Path, reference: Any, side: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """int8 pairs of mixed lengths (13 to 512 tokens) run as length-sorted groups at their own lengths
    (backends/portable/sub_batches.py), as the encoder's int8 batches do, on either padding side: fewer padded
    tokens computed, and each pair's score in the batch equals, to the bit, its score alone."""
    from bgem3_embeddings import BGEM3Reranker

    int8 = BGEM3Reranker(tiny_reranker_checkpoint, precision="int8", device="cpu", padding_side=side)
    runner = int8.runner._run  # int8.Int8Runner
    shapes: list[tuple[int, int]] = []
    run_padded = runner._run_padded
    monkeypatch.setattr(
        runner,
        "_run_padded",
        lambda ids, mask, outputs: shapes.append(ids.shape) or run_padded(ids, mask, outputs),
    )
    scores = int8.compute_score(PAIRS)
    lengths = [len(ids) for ids in int8.tokenize_pairs(PAIRS)]
    assert runner.splitter.split_batches == 1 and len(shapes) > 1, shapes
    assert sum(rows * length for rows, length in shapes) < len(PAIRS) * max(lengths), shapes
    assert scores == [int8.compute_score([pair])[0] for pair in PAIRS]
    np.testing.assert_allclose(scores, reference.compute_score(PAIRS), rtol=0, atol=INT8_ATOL)


def test_single_pair_rerank_and_empty_inputs(reranker: Any, reference: Any) -> None:
    one = reranker.compute_score(PAIRS[0])
    assert isinstance(one, float)
    assert one == pytest.approx(reference.compute_score(PAIRS[0])[0], **APPROX)
    assert reranker.compute_score(list(PAIRS[0]), normalize=True) == pytest.approx(
        reference.compute_score(list(PAIRS[0]), normalize=True)[0], **APPROX
    )
    assert reranker.compute_score([]) == []
    query, documents = PAIRS[0][0], [p for _, p in PAIRS]
    ranked = reranker.rerank(query, documents)
    scores = reference.compute_score([(query, d) for d in documents])
    assert [i for i, _ in ranked] == sorted(range(len(documents)), key=lambda i: -scores[i])
    np.testing.assert_allclose([s for _, s in ranked], sorted(scores, reverse=True), **SCALED)
    assert reranker.rerank(query, documents, top_n=3) == ranked[:3]
    normalized = reranker.rerank(query, documents, top_n=2, normalize=True)
    assert [i for i, _ in normalized] == [i for i, _ in ranked[:2]] and 0 < normalized[0][1] < 1
    assert reranker.rerank(query, []) == []


@pytest.mark.parametrize(
    ("call", "error", "phrase"),
    [
        (lambda r: r.compute_score(None), TypeError, "got NoneType"),
        (lambda r: r.compute_score("what is it?"), TypeError, "got str"),
        (lambda r: r.compute_score([("q", "p", "extra")]), TypeError, "sentence_pairs[0] must be a"),
        (lambda r: r.compute_score([("q", "p"), ("q", 3)]), TypeError, "sentence_pairs[1]: the passage"),
        (lambda r: r.compute_score([(None, "p")]), TypeError, "the query must be a str"),
        (lambda r: r.compute_score([("q", "p")], max_length=3), ValueError, "max_length must be an int >= 4"),
        (lambda r: r.compute_score([("q", "p")], max_length="512"), ValueError, "max_length"),
        (lambda r: r.compute_score([("q", "p")], batch_size=0), ValueError, "batch_size"),
        (lambda r: r.rerank("", ["p"]), ValueError, "the query is empty"),
        (lambda r: r.rerank("   ", ["p"]), ValueError, "the query is empty"),
        (lambda r: r.rerank(None, ["p"]), TypeError, "the query must be text"),
        (lambda r: r.rerank("q", "p"), TypeError, "documents must be a list of str"),
        (lambda r: r.rerank("q", ["p", None]), TypeError, "documents[1] must be a str"),
        (lambda r: r.rerank("q", ["p"], top_n=0), ValueError, "top_n"),
        (lambda r: r.score_token_ids([[0, 2], []]), ValueError, "token_ids[1] has 0 tokens"),
        (lambda r: r.tokenize_pairs(("q", "p")), TypeError, "got one pair"),
    ],
)
def test_bad_input_is_named(reranker: Any, call: Any, error: type[Exception], phrase: str) -> None:
    with pytest.raises(error) as info:
        call(reranker)
    assert phrase in str(info.value)


def test_an_embedding_checkpoint_is_refused(tiny_checkpoint: Path) -> None:
    from bgem3_embeddings import BGEM3Reranker
    from bgem3_embeddings.config import ConfigError

    with pytest.raises(ConfigError, match="not a cross-encoder reranker.*BAAI/bge-reranker-v2-m3"):
        BGEM3Reranker(tiny_checkpoint, precision="float32", device="cpu")


def test_a_classifier_with_two_labels_is_refused(tmp_path: Path, tiny_reranker_checkpoint: Path) -> None:
    from bgem3_embeddings import BGEM3Reranker
    from bgem3_embeddings.config import ConfigError

    folder = tmp_path / "two_labels"
    folder.mkdir()
    for file in tiny_reranker_checkpoint.iterdir():
        (folder / file.name).symlink_to(file)
    config = json.loads((tiny_reranker_checkpoint / "config.json").read_text())
    config["id2label"] = {"0": "no", "1": "yes"}
    (folder / "config.json").unlink()
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="2 labels"):
        BGEM3Reranker(folder, precision="float32", device="cpu")


def test_converted_weights_cache_is_used(
    tmp_path: Path, tiny_reranker_checkpoint: Path, reranker: Any
) -> None:
    from bgem3_embeddings import BGEM3Reranker

    cache = tmp_path / "converted"
    first = BGEM3Reranker(tiny_reranker_checkpoint, precision="float32", device="cpu", weights_cache=cache)
    written = sorted(cache.glob("*.safetensors"))
    assert len(written) == 1
    second = BGEM3Reranker(tiny_reranker_checkpoint, precision="float32", device="cpu", weights_cache=cache)
    assert not second.model.embeddings.gather_from_variables  # mapped from the cache, not ported
    expected = reranker.compute_score(PAIRS)
    np.testing.assert_allclose(first.compute_score(PAIRS), expected, **SCALED)
    np.testing.assert_allclose(second.compute_score(PAIRS), expected, **SCALED)
    assert first.fingerprint() == second.fingerprint() == reranker.fingerprint()
