"""Shared fixtures for the langchain-bgem3 tests.

The real model is replaced by the tiny checkpoint from the root conftest (`tiny_checkpoint`,
`tiny_encoder`) in integration tests; unit tests use `fake_encoder`, a numpy stand-in that follows the
core API contract (docs/CORE_API.md) and records its calls.
"""

from __future__ import annotations

import inspect
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

HIDDEN = 16
TINY_MODEL_KWARGS = {"device": "cpu"}
_HERE = Path(__file__).parent


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> Any:
    """Run this package's coroutine tests (the standard suites' async ones too) under pytest-asyncio.

    LangChain packages set asyncio_mode = "auto"; the repository's shared pytest config does not, so we
    mark only our own async tests. trylast makes this wrapper inner to pytest-asyncio's, so the mark is
    there when pytest-asyncio turns the collected function into an async item.
    """
    outcome = yield
    if not inspect.iscoroutinefunction(obj) or _HERE not in Path(collector.path).parents:
        return
    result = outcome.get_result()
    for node in result if isinstance(result, list) else [result]:
        if isinstance(node, pytest.Function):
            node.add_marker(pytest.mark.asyncio)


def _token_ids(text: str) -> list[int]:
    return [zlib.crc32(w.lower().encode()) % 997 + 5 for w in text.split()] or [3]


def _vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(HIDDEN).astype(np.float32)
    return v / np.linalg.norm(v)


class FakeEncoder:
    """Deterministic bag-of-words encoder with BGEM3Encoder's encode signature."""

    hidden_size = HIDDEN

    def __init__(self, model_id: str = "fake/bge-m3") -> None:
        self.model_id = model_id
        self.calls: list[tuple[str, int, dict[str, Any]]] = []

    def _encode(self, kind: str, sentences: Any, batch_size: int | None = None, max_length: int | None = None,
                return_dense: bool = True, return_sparse: bool = False,
                return_colbert_vecs: bool = False) -> dict[str, Any]:
        single = isinstance(sentences, str)
        texts = [sentences] if single else list(sentences)
        self.calls.append((kind, len(texts), {"batch_size": batch_size, "max_length": max_length}))
        ids = [_token_ids(t)[: max_length or None] for t in texts]
        dense = np.stack([sum(_vec(i) for i in row) for row in ids]).astype(np.float32)
        dense /= np.linalg.norm(dense, axis=1, keepdims=True)
        lexical = [{str(i): round(0.1 + (i % 7) / 10, 4) for i in row} for row in ids]
        colbert = [np.stack([_vec(i) for i in row]) for row in ids]
        out = {
            "dense_vecs": dense if return_dense else None,
            "lexical_weights": lexical if return_sparse else None,
            "colbert_vecs": colbert if return_colbert_vecs else None,
        }
        if single:
            out = {k: (v[0] if v is not None else None) for k, v in out.items()}
        return out

    def encode(self, sentences: Any, **kw: Any) -> dict[str, Any]:
        return self._encode("encode", sentences, **kw)

    def encode_queries(self, sentences: Any, **kw: Any) -> dict[str, Any]:
        return self._encode("query", sentences, **kw)

    def encode_corpus(self, sentences: Any, **kw: Any) -> dict[str, Any]:
        return self._encode("corpus", sentences, **kw)

    def colbert_score(self, q: np.ndarray, p: np.ndarray) -> float:
        return float((q @ p.T).max(axis=1).mean())


@pytest.fixture
def fake_encoder() -> FakeEncoder:
    return FakeEncoder()


@pytest.fixture(scope="session")
def lc_encoder(tiny_checkpoint: Any) -> Any:
    """One real BGEM3Encoder on the tiny checkpoint for the whole session.

    Loaded through langchain_bgem3's own loader with TINY_MODEL_KWARGS, so components built in tests from
    `model_name=<tiny path>, model_kwargs=TINY_MODEL_KWARGS` reuse it instead of loading (and tracing)
    the model again in every test.
    """
    from langchain_bgem3._encoder import load_encoder

    return load_encoder(str(tiny_checkpoint), None, TINY_MODEL_KWARGS, False)


# The tiny checkpoint's random sparse head keeps only a few tokens per text (most weights are <= 0, and
# some texts get none at all): these texts all have lexical weights, and each one's lexical score with
# itself beats its score with every other text, so sparse search can find each one by its exact text.
CORPUS = [
    "What is BGE M3?",
    "BM25 is a bag-of-words retrieval function that ranks a set of documents based on the query terms "
    "appearing in each document",
    "Dense retrieval maps each text to a single vector; sparse retrieval weights the tokens of the text.",
    "Machine learning models learn patterns from data and generalise to new examples.",
    "L'apprentissage automatique est une branche de l'intelligence artificielle.",
    "Un motor de búsqueda encuentra los documentos más relevantes para una consulta.",
    "Qdrant stores dense, sparse and multi-vector embeddings in named vectors.",
    "Photosynthesis converts sunlight, water and carbon dioxide into sugar.",
]


@pytest.fixture
def corpus() -> list[str]:
    return list(CORPUS)
