"""BGE-M3 dense embeddings for LlamaIndex, on the Keras/TensorFlow encoder of bgem3-embeddings."""

from __future__ import annotations

import asyncio
import logging

from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding

from bgem3_embeddings.query_text import check_query, log_cut_queries

from ._shared import EncoderSettingsMixin, locked_call

logger = logging.getLogger("llama_index.embeddings.bgem3")


class BGEM3Embedding(EncoderSettingsMixin, BaseEmbedding):
    """BGE-M3 dense embeddings (CLS, L2-normalised; 1024 dimensions for the real model).

    Pass `encoder=` (a `bgem3_embeddings.BGEM3Encoder`, or `other.encoder`) to share one loaded model
    (2.3 GB for BGE-M3) with `BGEM3SparseEmbedding` or anything else. Progress bars come from LlamaIndex's
    own `show_progress` flag (e.g. `VectorStoreIndex(..., show_progress=True)`).
    """

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
        log_cut_queries(logger, self.encoder, [check_query(query)], self.query_max_length)  # said, not silent
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
