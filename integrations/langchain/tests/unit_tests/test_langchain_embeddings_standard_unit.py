"""langchain-tests' standard unit suite for BGEM3Embeddings on the tiny checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_bgem3 import BGEM3Embeddings
from langchain_tests.unit_tests import EmbeddingsUnitTests


class TestBGEM3EmbeddingsStandardUnit(EmbeddingsUnitTests):
    @pytest.fixture(autouse=True)
    def _tiny(self, tiny_checkpoint: Path, lc_encoder: Any) -> None:
        # Same settings as the session's lc_encoder: constructing reuses that live model.
        self._params = {"model_name": str(tiny_checkpoint), "model_kwargs": {"device": "cpu"}}

    @property
    def embeddings_class(self) -> type[BGEM3Embeddings]:
        return BGEM3Embeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return self._params
