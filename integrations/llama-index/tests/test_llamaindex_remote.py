"""BGEM3Embedding / BGEM3SparseEmbedding with `base_url`: encoding through a running `bgem3 serve`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.optional import require_module

require_module("fastapi", reason="the server needs the serve extra")

from llama_index.embeddings.bgem3 import BGEM3Embedding, BGEM3SparseEmbedding  # noqa: E402

from bgem3_embeddings.remote import RemoteEncoder  # noqa: E402
from tests.support import ReferenceM3, tiny_server  # noqa: E402
from tests.tolerances import UNIT_VECTORS  # noqa: E402

KEY = "li-key"
TEXTS = [
    "What is BGE M3?",
    "BM25 is a bag-of-words retrieval function.",
    "Ein deutscher Satz über Windkraft.",
]


@pytest.fixture(scope="module")
def server_url(tiny_checkpoint: Path) -> Iterator[str]:
    with tiny_server(tiny_checkpoint, api_key=KEY) as url:
        yield url


def test_dense_and_sparse_through_the_server_are_the_reference(
    server_url: str, tiny_checkpoint: Path
) -> None:
    ref = ReferenceM3(tiny_checkpoint).encode(TEXTS)
    embed = BGEM3Embedding(base_url=server_url, api_key=KEY)
    assert isinstance(embed.encoder, RemoteEncoder)
    assert KEY not in repr(embed) and "api_key" not in embed.to_dict()
    np.testing.assert_allclose(embed.get_text_embedding_batch(TEXTS), ref["dense_vecs"], **UNIT_VECTORS)
    np.testing.assert_allclose(embed.get_query_embedding(TEXTS[0]), ref["dense_vecs"][0], **UNIT_VECTORS)
    sparse = BGEM3SparseEmbedding(encoder=embed)
    for got, want in zip(sparse.get_text_embedding_batch(TEXTS), ref["lexical_weights"], strict=True):
        assert set(got) == {int(k) for k in want}
        for token, weight in got.items():
            assert weight == pytest.approx(want[str(token)], rel=1e-5, abs=1e-5)


def test_async_calls_go_through_the_server(server_url: str, tiny_checkpoint: Path) -> None:
    ref = ReferenceM3(tiny_checkpoint).encode(TEXTS[:1])
    embed = BGEM3Embedding(base_url=server_url, api_key=KEY)
    np.testing.assert_allclose(
        asyncio.run(embed.aget_query_embedding(TEXTS[0])), ref["dense_vecs"][0], **UNIT_VECTORS
    )
