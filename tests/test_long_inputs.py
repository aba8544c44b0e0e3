"""Query-chunked attention gives the same outputs as full attention (tiny model)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from bgem3_embeddings.backends.portable import chunking
from bgem3_embeddings.backends.tensorflow.long_attention import chunked_attention
from tests.tolerances import SCALED, UNIT_VECTORS


def _attend(q: Any, k: Any, v: Any, mask_bias: Any) -> Any:
    scores = tf.matmul(q, k, transpose_b=True) / math.sqrt(q.shape[-1]) + mask_bias
    return tf.matmul(tf.nn.softmax(scores, axis=-1), v)


@pytest.mark.parametrize(("length", "chunk"), [(37, 8), (64, 16), (5, 64), (100, 1)])
def test_chunked_attention_equals_full(length: int, chunk: int) -> None:
    rng = np.random.default_rng(length)
    q, k, v = (tf.constant(rng.normal(size=(2, 3, length, 8)), tf.float32) for _ in range(3))
    mask = np.ones((2, length), np.float32)
    mask[1, length // 2 :] = 0  # padding in the second row
    bias = tf.constant(((1 - mask) * -1e9)[:, None, None, :])
    full = _attend(q, k, v, bias)
    chunked = tf.function(lambda q, k, v, b: chunked_attention(_attend, q, k, v, b, chunk))(q, k, v, bias)
    np.testing.assert_allclose(chunked.numpy(), full.numpy(), **SCALED)


def test_chunk_size_must_be_positive() -> None:
    x = tf.zeros((1, 1, 4, 2))
    with pytest.raises(ValueError):
        chunked_attention(_attend, x, x, x, tf.zeros((1, 1, 1, 4)), 0)


@pytest.fixture(scope="module")
def small_chunk_encoder(tiny_checkpoint: Path) -> Any:
    """An encoder using chunked attention above 48 tokens (chunks of 48): long inputs stay cheap."""
    from bgem3_embeddings import BGEM3Encoder

    patch = pytest.MonkeyPatch()
    patch.setattr(chunking, "LONG_INPUT_CHUNK", 48)
    encoder = BGEM3Encoder(tiny_checkpoint, precision="float32", device="cpu")
    yield encoder
    patch.undo()


def test_encoder_long_path_equals_full_attention(small_chunk_encoder: Any) -> None:
    texts = ["a longer passage about retrieval " * 12, "short", "mid length text " * 6]
    out = small_chunk_encoder.encode(texts, return_sparse=True, return_colbert_vecs=True)
    lengths = [len(t) for t in small_chunk_encoder.tokenize(texts, 8192)]
    assert max(lengths) > 48 and max(lengths) % 48 != 0, lengths  # chunked, with a partial last chunk
    assert any(key[1] for key in small_chunk_encoder.runner.functions), "the long-input function was used"
    # The same batch through the model with full attention.
    model = small_chunk_encoder.model
    from bgem3_embeddings.batching import pad_batch

    ids, mask = pad_batch(small_chunk_encoder.tokenize(texts, 8192), small_chunk_encoder.config.pad_token_id)
    model.set_query_chunk_size(None)
    full = {k: v.numpy() for k, v in model({"input_ids": ids, "attention_mask": mask}).items()}
    np.testing.assert_allclose(out["dense_vecs"], full["dense_vecs"], **UNIT_VECTORS)
    for i, n in enumerate(lengths):
        np.testing.assert_allclose(out["colbert_vecs"][i], full["colbert_vecs"][i, : n - 1], **UNIT_VECTORS)


def test_model_chunked_hidden_states_equal_full(tiny_encoder: Any) -> None:
    model = tiny_encoder.model
    rng = np.random.default_rng(0)
    ids = rng.integers(4, 200, size=(2, 300)).astype(np.int32)
    ids[:, 0], ids[0, -1] = 0, 2
    mask = np.ones_like(ids)
    ids[1, 200:], mask[1, 200:] = 1, 0
    ids[1, 199] = 2
    full = model.encode_hidden(ids, mask).numpy()
    try:
        model.set_query_chunk_size(64)
        chunked = model.encode_hidden(ids, mask).numpy()
    finally:
        model.set_query_chunk_size(None)
    # Same math, different matmul shapes: oneDNN may sum in another order, so allow a few float32 ulps of
    # the largest value (LayerNorm spreads one row's rounding over all of it). A fixed atol=1e-6 is below
    # float32 resolution at these magnitudes (|h| up to ~4.3: 1 ulp = 4.8e-7) and failed by 1.2e-6 on
    # TF 2.18.1, and by 1.4e-6 on TF 2.21 with another tiny vocabulary.
    real = mask.astype(bool)
    atol = 8 * np.finfo(np.float32).eps * float(np.abs(full[real]).max())
    np.testing.assert_allclose(chunked[real], full[real], rtol=0, atol=atol)


def test_an_8192_token_passage_encodes(tiny_encoder: Any) -> None:
    """The model's full length through the real long-input path (chunks of LONG_INPUT_CHUNK)."""
    ids = np.full((1, 8192), 5, np.int32)
    ids[0, 0], ids[0, -1] = 0, 2
    out = tiny_encoder.run_batch(ids, np.ones_like(ids), ("dense_vecs", "colbert_vecs"))
    assert out["colbert_vecs"].shape == (1, 8191, tiny_encoder.hidden_size)
    assert np.isfinite(out["dense_vecs"]).all()
