"""Plumbing of the LlamaIndex wrappers against a recording stand-in encoder (no model, no TensorFlow)."""

from __future__ import annotations

import asyncio
import re
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest
from llama_index.embeddings.bgem3 import (
    BGEM3Embedding,
    BGEM3SparseEmbedding,
    qdrant_hybrid_vector_store,
    sparse_doc_fn,
    sparse_query_fn,
)

from tests.install_forms import clone_pip_install


class RecordingEncoder:
    """Follows the BGEM3Encoder contract (docs/CORE_API.md) and records every call."""

    model_id = "fake/bge-m3"
    hidden_size = 4

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.active = 0
        self.max_active = 0
        self._guard = threading.Lock()

    def _encode(self, kind: str, sentences: list[str], **kw: Any) -> dict[str, Any]:
        with self._guard:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        time.sleep(0.01)  # widen the window in which overlapping calls would be seen
        self.calls.append({"kind": kind, "texts": list(sentences), **kw})
        dense = np.array([[len(s), 1.0, 0.0, float(i)] for i, s in enumerate(sentences)], np.float32)
        dense /= np.linalg.norm(dense, axis=1, keepdims=True)
        sparse = [{str(len(s) + 100): 0.5, "7": 0.25} for s in sentences]
        with self._guard:
            self.active -= 1
        return {
            "dense_vecs": dense if kw.get("return_dense", True) else None,
            "lexical_weights": sparse if kw.get("return_sparse") else None,
            "colbert_vecs": None,
        }

    def encode_queries(self, sentences: list[str], **kw: Any) -> dict[str, Any]:
        return self._encode("query", sentences, **kw)

    def encode_corpus(self, sentences: list[str], **kw: Any) -> dict[str, Any]:
        return self._encode("corpus", sentences, **kw)


TEXTS = ["a", "bb", "ccc", "dddd", "eeeee"]


def test_batches_follow_embed_batch_size_and_lengths_route_by_kind() -> None:
    enc = RecordingEncoder()
    emb = BGEM3Embedding(encoder=enc, embed_batch_size=2, query_max_length=16, passage_max_length=64)
    assert emb.model_name == "fake/bge-m3"
    vecs = emb.get_text_embedding_batch(TEXTS)
    assert len(vecs) == 5 and all(isinstance(x, float) for x in vecs[0])
    assert [c["texts"] for c in enc.calls] == [["a", "bb"], ["ccc", "dddd"], ["eeeee"]]
    assert {(c["kind"], c["max_length"], c["batch_size"]) for c in enc.calls} == {("corpus", 64, 2)}
    assert all(c["return_dense"] and not (c["return_sparse"] or c["return_colbert_vecs"]) for c in enc.calls)
    enc.calls.clear()
    emb.get_query_embedding("q")
    assert enc.calls[0]["kind"] == "query" and enc.calls[0]["max_length"] == 16


def test_none_lengths_defer_to_the_encoder() -> None:
    enc = RecordingEncoder()
    BGEM3Embedding(encoder=enc).get_text_embedding("x")
    assert enc.calls[0]["max_length"] is None


def test_async_batches_do_not_overlap_on_a_shared_encoder() -> None:
    enc = RecordingEncoder()
    dense = BGEM3Embedding(encoder=enc, embed_batch_size=1)
    sparse = BGEM3SparseEmbedding(encoder=dense, embed_batch_size=1)
    assert sparse.encoder is enc

    async def both() -> tuple[Any, Any]:
        return await asyncio.gather(
            dense.aget_text_embedding_batch(TEXTS), sparse.aget_text_embedding_batch(TEXTS)
        )

    d, s = asyncio.run(both())
    assert len(d) == len(s) == 5
    assert enc.max_active == 1  # the per-encoder lock serialised worker threads
    assert s[0] == {101: 0.5, 7: 0.25}


def test_sparse_fns_return_qdrant_shapes() -> None:
    enc = RecordingEncoder()
    indices, values = sparse_doc_fn(enc, max_length=99)(["ab", "c"])
    # Token ids sorted and unique (the core's one sparse conversion), weights with them.
    assert indices == [[7, 102], [7, 101]] and values == [[0.25, 0.5], [0.25, 0.5]]
    assert enc.calls[-1]["kind"] == "corpus" and enc.calls[-1]["max_length"] == 99
    sparse_query_fn(enc)(["q"])
    assert enc.calls[-1]["kind"] == "query"
    assert sparse_doc_fn(enc)([]) == ([], [])
    with pytest.raises(TypeError, match="only apply when a model name"):
        sparse_doc_fn(enc, device="cpu")


def test_serialisation_leaves_the_model_out() -> None:
    emb = BGEM3Embedding(encoder=RecordingEncoder(), embed_batch_size=8)
    data = emb.to_dict()
    assert "encoder" not in data
    assert data["model_name"] == "fake/bge-m3" and data["embed_batch_size"] == 8
    assert data["class_name"] == "BGEM3Embedding"


def test_rejects_objects_that_are_not_encoders() -> None:
    with pytest.raises(TypeError, match="expected a BGEM3Encoder"):
        BGEM3SparseEmbedding(encoder=object())


def test_missing_core_package_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "bgem3_embeddings", None)  # makes `import bgem3_embeddings` fail
    with pytest.raises(ImportError, match=re.escape(clone_pip_install("."))):
        BGEM3Embedding(model_name="BAAI/bge-m3")


def test_missing_qdrant_extra_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_index.vector_stores.qdrant", None)
    with pytest.raises(ImportError, match=re.escape(clone_pip_install("integrations/llama-index", "qdrant"))):
        qdrant_hybrid_vector_store("c", encoder=RecordingEncoder(), path="/nonexistent")
