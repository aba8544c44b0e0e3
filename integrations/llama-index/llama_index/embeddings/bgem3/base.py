"""BGE-M3 dense embeddings for LlamaIndex, on the Keras/TensorFlow encoder of bgem3-embeddings."""

from __future__ import annotations

import asyncio
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import Field

from ._shared import DEFAULT_EMBED_BATCH_SIZE, DEFAULT_MODEL, build_encoder, locked_call, resolve_encoder


class BGEM3Embedding(BaseEmbedding):
    """BGE-M3 dense embeddings (CLS, L2-normalised; 1024 dimensions for the real model).

    Pass `encoder=` (a `bgem3_embeddings.BGEM3Encoder`, or `other.encoder`) to share one loaded model
    (2.3 GB for BGE-M3) with `BGEM3SparseEmbedding` or anything else. Progress bars come from LlamaIndex's
    own `show_progress` flag (e.g. `VectorStoreIndex(..., show_progress=True)`).
    """

    model_name: str = Field(default=DEFAULT_MODEL, description="Hub id or local checkpoint directory.")
    embed_batch_size: int = Field(
        default=DEFAULT_EMBED_BATCH_SIZE, gt=0, le=2048, description="Texts per forward pass."
    )
    query_max_length: int | None = Field(
        default=None, gt=0, description="Token limit for queries (None: the encoder's, 512)."
    )
    passage_max_length: int | None = Field(
        default=None, gt=0, description="Token limit for passages (None: the encoder's, 8192)."
    )
    precision: str = Field(default="auto", description='"auto", "float32", "bfloat16" or "float16".')
    device: str = Field(default="auto", description='"auto", "cpu", "gpu", "cuda", "metal", "/GPU:0"...')
    cache_folder: str | None = Field(default=None, description="Hugging Face cache directory.")
    model_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Extra BGEM3Encoder arguments (revision, local_files_only...)."
    )
    # excluded from serialisation: a loaded model is not configuration.
    encoder: Any = Field(default=None, exclude=True, description="An existing BGEM3Encoder to reuse.")

    def __init__(self, model_name: str | None = None, encoder: Any = None, **kwargs: Any) -> None:
        if encoder is not None:
            encoder = resolve_encoder(encoder)
        if model_name is None:
            model_name = str(getattr(encoder, "model_id", None) or DEFAULT_MODEL)
        # through the kwargs dict: type checkers see only the base class's fields in its __init__
        kwargs.update(model_name=model_name, encoder=encoder)
        super().__init__(**kwargs)
        if self.encoder is None:
            self.encoder = build_encoder(
                self.model_name,
                precision=self.precision,
                device=self.device,
                batch_size=self.embed_batch_size,
                query_max_length=self.query_max_length,
                passage_max_length=self.passage_max_length,
                cache_folder=self.cache_folder,
                model_kwargs=self.model_kwargs,
            )

    @classmethod
    def class_name(cls) -> str:
        return "BGEM3Embedding"

    def _encode(self, texts: list[str], *, query: bool) -> list[Embedding]:
        if not texts:
            return []
        enc = self.encoder
        method = enc.encode_queries if query else enc.encode_corpus
        max_length = self.query_max_length if query else self.passage_max_length
        out = locked_call(
            enc,
            lambda: method(
                list(texts),
                batch_size=self.embed_batch_size,
                max_length=max_length,
                return_dense=True,
                return_sparse=False,
                return_colbert_vecs=False,
            ),
        )
        return [row.tolist() for row in out["dense_vecs"]]

    def _get_query_embedding(self, query: str) -> Embedding:
        return self._encode([query], query=True)[0]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._encode([text], query=False)[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        # one encoder call per LlamaIndex batch: the encoder sorts by length and pads per batch.
        return self._encode(texts, query=False)

    # Async variants run the (blocking) forward pass in a worker thread so the event loop stays free.
    async def _aget_query_embedding(self, query: str) -> Embedding:
        return await asyncio.to_thread(self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> Embedding:
        return await asyncio.to_thread(self._get_text_embedding, text)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return await asyncio.to_thread(self._get_text_embeddings, texts)
