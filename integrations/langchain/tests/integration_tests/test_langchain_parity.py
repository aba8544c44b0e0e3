"""Vectors from the LangChain components equal the core encoder's output for the same texts."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from langchain_bgem3 import BGEM3Embeddings

from tests.optional import require_module

# Unit vectors computed in other batch shapes sum in another order: a few float32 ulps apart.
UNIT = {"atol": 1e-5, "rtol": 0.0}


def test_dense_equals_core(lc_encoder: Any, corpus: list[str]) -> None:
    emb = BGEM3Embeddings(encoder=lc_encoder)
    docs = np.asarray(emb.embed_documents(corpus))
    ref = lc_encoder.encode_corpus(corpus)["dense_vecs"]
    np.testing.assert_allclose(docs, ref, **UNIT)
    query = np.asarray(emb.embed_query(corpus[1]))
    ref_q = lc_encoder.encode_queries([corpus[1]])["dense_vecs"][0]
    np.testing.assert_allclose(query, ref_q, **UNIT)
    assert docs.shape == (len(corpus), lc_encoder.hidden_size)


def test_dense_loaded_by_path_equals_core(tiny_checkpoint: Any, lc_encoder: Any, corpus: list[str]) -> None:
    emb = BGEM3Embeddings(
        model_name=str(tiny_checkpoint),
        model_kwargs={"device": "cpu", "precision": "float32"},
        encode_kwargs={"batch_size": 2},
    )
    assert emb.encoder is not lc_encoder  # a second, independently loaded model with the same weights
    ref = lc_encoder.encode_corpus(corpus)["dense_vecs"]
    np.testing.assert_allclose(np.asarray(emb.embed_documents(corpus)), ref, **UNIT)


def test_sparse_equals_core(lc_encoder: Any, corpus: list[str]) -> None:
    require_module("langchain_qdrant")
    from langchain_bgem3 import BGEM3SparseEmbeddings

    sparse = BGEM3SparseEmbeddings(encoder=lc_encoder)
    ref = lc_encoder.encode_corpus(corpus, return_dense=False, return_sparse=True)["lexical_weights"]
    for vec, weights in zip(sparse.embed_documents(corpus), ref, strict=True):
        assert vec.indices == sorted(set(vec.indices))
        got = dict(zip(vec.indices, vec.values, strict=True))
        assert got.keys() == {int(k) for k in weights}
        for key, value in weights.items():
            assert abs(got[int(key)] - float(value)) <= 1e-6
    q = sparse.embed_query(corpus[0])
    q_out = lc_encoder.encode_queries([corpus[0]], return_dense=False, return_sparse=True)
    q_ref = q_out["lexical_weights"][0]
    expected = {int(k): v for k, v in q_ref.items()}
    assert dict(zip(q.indices, q.values, strict=True)) == pytest.approx(expected, rel=1e-5, abs=1e-5)
