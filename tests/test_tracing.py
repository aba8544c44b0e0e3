"""After warm-up, no tf.function is traced again, whatever the batch sizes and lengths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest


@pytest.fixture(scope="module")
def fresh_encoder(tiny_checkpoint: Path) -> Any:
    from bgem3_embeddings import BGEM3Encoder

    return BGEM3Encoder(tiny_checkpoint, precision="float32", device="cpu")


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
