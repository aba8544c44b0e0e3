"""langchain-tests' standard integration suite for BGEM3Embeddings on the tiny checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_bgem3 import BGEM3Embeddings
from langchain_tests.integration_tests import EmbeddingsIntegrationTests


class TestBGEM3EmbeddingsStandardIntegration(EmbeddingsIntegrationTests):
    @pytest.fixture(autouse=True)
    def _tiny(self, tiny_checkpoint: Path, lc_encoder: Any) -> None:
        # Built by path (the user's way), with the settings of the session's lc_encoder: that live model is
        # reused instead of loading and tracing a new one per test.
        self._params = {"model_name": str(tiny_checkpoint), "model_kwargs": {"device": "cpu"}}

    @property
    def embeddings_class(self) -> type[BGEM3Embeddings]:
        return BGEM3Embeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return self._params
