"""BGEM3Embeddings / BGEM3SparseEmbeddings logic against a numpy stand-in encoder (fast, no TensorFlow)."""

from __future__ import annotations

import asyncio
import gc
import sys
import types
from typing import Any

import numpy as np
import pytest
from langchain_bgem3 import BGEM3Embeddings
from langchain_bgem3._encoder import load_encoder, resolve_encoder

from tests.optional import require_module


def test_embed_documents_is_one_batched_call(fake_encoder: Any) -> None:
    emb = BGEM3Embeddings(encoder=fake_encoder, encode_kwargs={"batch_size": 2, "max_length": 64})
    texts = [f"text number {i}" for i in range(5)]
    vectors = emb.embed_documents(texts)
    assert fake_encoder.calls == [("corpus", 5, {"batch_size": 2, "max_length": 64})]
    ref = fake_encoder.encode_corpus(texts)["dense_vecs"]
    np.testing.assert_array_equal(np.asarray(vectors, dtype=np.float32), ref)
    assert all(isinstance(x, float) for x in vectors[0])


def test_embed_query_uses_query_settings(fake_encoder: Any) -> None:
    emb = BGEM3Embeddings(encoder=fake_encoder, query_encode_kwargs={"max_length": 8})
    vec = emb.embed_query("what is bge m3")
    assert fake_encoder.calls == [("query", 1, {"batch_size": None, "max_length": 8})]
    assert len(vec) == fake_encoder.hidden_size


def test_empty_input_skips_the_model(fake_encoder: Any) -> None:
    assert BGEM3Embeddings(encoder=fake_encoder).embed_documents([]) == []
    assert fake_encoder.calls == []


def test_model_name_follows_a_given_encoder(fake_encoder: Any) -> None:
    assert BGEM3Embeddings(encoder=fake_encoder).model_name == "fake/bge-m3"
    assert BGEM3Embeddings.model_fields["model_name"].default == "BAAI/bge-m3"


def test_reserved_encode_kwargs_rejected(fake_encoder: Any) -> None:
    with pytest.raises(ValueError, match="return_sparse"):
        BGEM3Embeddings(encoder=fake_encoder, encode_kwargs={"return_sparse": True})


def test_encoder_must_follow_the_core_api() -> None:
    with pytest.raises(TypeError, match="BGEM3Encoder"):
        BGEM3Embeddings(encoder=object())


def test_unknown_fields_rejected(fake_encoder: Any) -> None:
    with pytest.raises(ValueError):
        BGEM3Embeddings(encoder=fake_encoder, model="typo")


def test_components_share_one_encoder(fake_encoder: Any) -> None:
    require_module("langchain_qdrant")
    from langchain_bgem3 import BGEM3SparseEmbeddings

    dense = BGEM3Embeddings(encoder=fake_encoder)
    sparse = BGEM3SparseEmbeddings(encoder=dense)  # a component is accepted in place of an encoder
    assert sparse.encoder is dense.encoder is fake_encoder
    assert resolve_encoder(sparse) is fake_encoder


class _CountingCore(types.ModuleType):
    """Stands in for bgem3_embeddings so load_encoder can be tested without building a model."""

    def __init__(self, factory: Any) -> None:
        super().__init__("bgem3_embeddings")
        self.loads: list[tuple[str, dict[str, Any]]] = []
        self._factory = factory

    def BGEM3Encoder(self, name: str, **kwargs: Any) -> Any:  # noqa: N802 - mirrors the class name
        self.loads.append((name, kwargs))
        return self._factory(name)


def test_same_settings_load_the_model_once(monkeypatch: pytest.MonkeyPatch, fake_encoder: Any) -> None:
    FakeEncoder = type(fake_encoder)

    core = _CountingCore(FakeEncoder)
    monkeypatch.setitem(sys.modules, "bgem3_embeddings", core)
    a = BGEM3Embeddings(model_name="some/model", model_kwargs={"precision": "float32"}, cache_folder="/c")
    b = BGEM3Embeddings(model_name="some/model", model_kwargs={"precision": "float32"}, cache_folder="/c")
    assert a.encoder is b.encoder
    assert core.loads == [("some/model", {"precision": "float32", "cache_dir": "/c", "show_progress": False})]
    c = BGEM3Embeddings(model_name="some/model", model_kwargs={"precision": "bfloat16"}, cache_folder="/c")
    assert c.encoder is not a.encoder and len(core.loads) == 2
    # Nothing keeps an encoder alive once its components are gone.
    del a, b, c
    gc.collect()
    load_encoder("some/model", "/c", {"precision": "float32"}, False)
    assert len(core.loads) == 3


def test_async_methods_match_sync(fake_encoder: Any) -> None:
    emb = BGEM3Embeddings(encoder=fake_encoder)

    async def run() -> tuple[Any, ...]:
        return await asyncio.gather(
            emb.aembed_documents(["a b", "c d e"]), emb.aembed_query("a b"), emb.aembed_query("x")
        )

    docs, q1, _ = asyncio.run(run())
    assert docs == emb.embed_documents(["a b", "c d e"])
    assert q1 == emb.embed_query("a b")
