"""langchain-tests' standard retriever suite for BGEM3Retriever on the embedded Qdrant."""

from __future__ import annotations

from typing import Any

import pytest

from tests.optional import require_module

require_module("bgem3_qdrant")

from langchain_bgem3 import BGEM3QdrantIndex, BGEM3Retriever  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_tests.integration_tests import RetrieversIntegrationTests  # noqa: E402
from qdrant_client import QdrantClient  # noqa: E402


@pytest.fixture(scope="module")
def filled_client(lc_encoder: Any) -> QdrantClient:
    client = QdrantClient(location=":memory:")
    BGEM3QdrantIndex(client=client, collection_name="std", encoder=lc_encoder).add_documents(
        [Document(page_content=f"note {i}: the meeting about project {name} moved to room {i}")
         for i, name in enumerate(["apollo", "gemini", "mercury", "vostok", "soyuz"])]
    )
    return client


class TestBGEM3RetrieverStandard(RetrieversIntegrationTests):
    @pytest.fixture(autouse=True)
    def _store(self, filled_client: QdrantClient, lc_encoder: Any) -> None:
        self._params = {"client": filled_client, "collection_name": "std", "encoder": lc_encoder}

    @property
    def retriever_constructor(self) -> type[BGEM3Retriever]:
        return BGEM3Retriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return self._params

    @property
    def retriever_query_example(self) -> str:
        return "where is the apollo meeting?"
