"""After warm-up, no tf.function is traced again, whatever the batch sizes and lengths; short batches
run eagerly and trace nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest


@pytest.fixture(scope="module")
def fresh_encoder(tiny_checkpoint: Path) -> Any:
    from bgem3_embeddings import BGEM3Encoder

    # eager_batches=0: every batch goes through the traced functions whose tracing is counted here.
    return BGEM3Encoder(tiny_checkpoint, precision="float32", device="cpu", eager_batches=0)


def _text(n_words: int) -> str:
    return " ".join(["retrieval", "模型", "Suche", "vector"][i % 4] for i in range(n_words))


def test_no_retracing_across_varied_lengths_and_batch_sizes(fresh_encoder: Any) -> None:
    kwargs = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    # Warm-up: one short batch and one input above LONG_INPUT_CHUNK (the chunked-attention function).
    fresh_encoder.encode(["warm up"], **kwargs)
    fresh_encoder.encode([_text(1200)], **kwargs)
    warm = fresh_encoder.trace_count()
    assert warm == 2, f"expected one trace per function, got {warm}"

    rng = np.random.default_rng(0)
    corpus = [_text(int(n)) for n in rng.integers(0, 300, size=40)] + [_text(1100), _text(1500), ""]
    for batch_size in (1, 3, 7, 64):
        fresh_encoder.encode(corpus, batch_size=batch_size, **kwargs)
    fresh_encoder.max_tokens_per_batch = 512
    try:
        fresh_encoder.encode(corpus, batch_size=256, **kwargs)
    finally:
        fresh_encoder.max_tokens_per_batch = None
    assert fresh_encoder.trace_count() == warm


def test_each_output_set_is_traced_once(fresh_encoder: Any) -> None:
    before = fresh_encoder.trace_count()
    fresh_encoder.encode(["a", "b c"], return_dense=True)
    after_first = fresh_encoder.trace_count()
    fresh_encoder.encode([_text(50), "x"], return_dense=True)
    fresh_encoder.encode([_text(7)] * 5, return_dense=True)
    assert after_first - before <= 1
    assert fresh_encoder.trace_count() == after_first


def test_first_short_batches_run_eagerly_then_traced(tiny_checkpoint: Path) -> None:
    from bgem3_embeddings import BGEM3Encoder

    encoder = BGEM3Encoder(
        tiny_checkpoint, precision="float32", device="cpu", eager_max_tokens=64, eager_batches=2
    )
    kwargs = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    encoder.encode([_text(40)] * 4, **kwargs)  # 4 x ~50 padded tokens: above the threshold, traced
    assert encoder.trace_count() == 1 and encoder.eager_batches_left == 2
    encoder.encode("What is BGE M3?", return_dense=True)  # another output set: would need a new trace
    encoder.encode(["a", "b c", "d e f"], return_dense=True)
    assert encoder.trace_count() == 1, "a short batch must not build a graph"
    assert encoder.eager_batches_left == 0
    encoder.encode("the third short batch is traced", return_dense=True)
    assert encoder.trace_count() == 2


@pytest.mark.parametrize("name", ["eager_max_tokens", "eager_batches"])
def test_eager_settings_are_validated(tiny_checkpoint: Path, name: str) -> None:
    from bgem3_embeddings import BGEM3Encoder

    for bad in (-1, 1.5, "64", True):
        with pytest.raises(ValueError, match=f"{name} must be an int >= 0"):
            BGEM3Encoder(tiny_checkpoint, device="cpu", **{name: bad})
