"""BGEM3Embeddings / BGEM3SparseEmbeddings with `base_url`: encoding through a running `bgem3 serve`, the
reference's vectors, LangChain's standard suite, and the API key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.optional import require_module

require_module("fastapi", reason="the server needs the serve extra")

from langchain_bgem3 import BGEM3Embeddings, BGEM3SparseEmbeddings  # noqa: E402
from langchain_tests.integration_tests import EmbeddingsIntegrationTests  # noqa: E402

from bgem3_embeddings.remote import RemoteEncoder, RemoteEncoderError  # noqa: E402
from tests.support import ReferenceM3, tiny_server  # noqa: E402
from tests.tolerances import UNIT_VECTORS  # noqa: E402

KEY = "lc-key"
TEXTS = [
    "What is BGE M3?",
    "BM25 is a bag-of-words retrieval function.",
    "Ein deutscher Satz über Windkraft.",
]


@pytest.fixture(scope="module")
def server_url(tiny_checkpoint: Path) -> Iterator[str]:
    with tiny_server(tiny_checkpoint, api_key=KEY) as url:
        yield url


@pytest.fixture(scope="module")
def reference(tiny_checkpoint: Path) -> ReferenceM3:
    return ReferenceM3(tiny_checkpoint)


def test_dense_and_sparse_through_the_server_are_the_reference(
    server_url: str, reference: ReferenceM3
) -> None:
    dense = BGEM3Embeddings(base_url=server_url, api_key=KEY)
    sparse = BGEM3SparseEmbeddings(encoder=dense)  # shares the remote encoder
    assert isinstance(dense.encoder, RemoteEncoder) and sparse.encoder is dense.encoder
    assert KEY not in repr(dense)
    ref = reference.encode(TEXTS)
    np.testing.assert_allclose(dense.embed_documents(TEXTS), ref["dense_vecs"], **UNIT_VECTORS)
    np.testing.assert_allclose(dense.embed_query(TEXTS[0]), ref["dense_vecs"][0], **UNIT_VECTORS)
    for vector, weights in zip(sparse.embed_documents(TEXTS), ref["lexical_weights"], strict=True):
        assert vector.indices == sorted(int(k) for k in weights)
        np.testing.assert_allclose(
            vector.values, [weights[str(i)] for i in vector.indices], rtol=1e-5, atol=1e-5
        )
    # the query side truncates at the server's query_max_length, as a local encoder does
    assert dense.encoder.query_max_length == 512


def test_wrong_key_is_a_clear_error(server_url: str) -> None:
    with pytest.raises(RemoteEncoderError, match="refused the API key"):
        BGEM3Embeddings(base_url=server_url, api_key="wrong").embed_query("x")


def test_encoder_and_base_url_exclude_each_other(server_url: str) -> None:
    with pytest.raises(ValueError, match="either encoder or base_url"):
        BGEM3Embeddings(base_url=server_url, encoder=RemoteEncoder(server_url))


class TestBGEM3EmbeddingsRemoteStandard(EmbeddingsIntegrationTests):
    """LangChain's standard integration suite, every call going through the server."""

    @pytest.fixture(autouse=True)
    def _remote(self, server_url: str) -> None:
        self._params: dict[str, Any] = {"base_url": server_url, "api_key": KEY}

    @property
    def embeddings_class(self) -> type[BGEM3Embeddings]:
        return BGEM3Embeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return self._params
