"""BGEM3SparseEmbeddings: Qdrant-ready sparse vectors from lexical weights."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from tests.optional import require_module

require_module("langchain_qdrant")

from langchain_bgem3 import BGEM3SparseEmbeddings  # noqa: E402
from langchain_bgem3.sparse import to_sparse_vector  # noqa: E402
from langchain_qdrant import SparseEmbeddings, SparseVector  # noqa: E402


def test_to_sparse_vector_sorted_unique_positive() -> None:
    vec = to_sparse_vector({"30": 0.5, "7": 0.25, 7: 0.75, "12": 0.0, "9": -1.0})
    assert vec == SparseVector(indices=[7, 30], values=[0.75, 0.5])
    assert to_sparse_vector({}) == SparseVector(indices=[], values=[])


def test_sparse_embeddings_interface(fake_encoder: Any) -> None:
    sparse = BGEM3SparseEmbeddings(encoder=fake_encoder, encode_kwargs={"batch_size": 4})
    assert isinstance(sparse, SparseEmbeddings)
    texts = ["alpha beta beta gamma", "delta"]
    docs = sparse.embed_documents(texts)
    assert fake_encoder.calls[-1] == ("corpus", 2, {"batch_size": 4, "max_length": None})
    ref = fake_encoder.encode_corpus(texts, return_dense=False, return_sparse=True)["lexical_weights"]
    for vec, weights in zip(docs, ref, strict=True):
        assert vec.indices == sorted(set(vec.indices))
        # Sparse values are float32, as Qdrant stores them (the real encoder's weights are float32 already).
        want = {int(k): float(np.float32(v)) for k, v in weights.items()}
        assert dict(zip(vec.indices, vec.values, strict=True)) == want
    query = sparse.embed_query("alpha beta")
    assert fake_encoder.calls[-1][0] == "query"
    assert asyncio.run(sparse.aembed_query("alpha beta")) == query
    assert asyncio.run(sparse.aembed_documents(texts)) == docs
    assert sparse.embed_documents([]) == []
