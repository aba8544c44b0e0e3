"""BGE-M3 sparse (lexical) embeddings for LlamaIndex, and sparse encoders for QdrantVectorStore."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.embeddings.base_sparse import BaseSparseEmbedding, SparseEmbedding

from bgem3_embeddings.outputs import sparse_arrays
from bgem3_embeddings.query_text import check_query, log_cut_queries

from ._shared import (
    DEFAULT_EMBED_BATCH_SIZE,
    DEFAULT_MODEL,
    EncoderSettingsMixin,
    build_encoder,
    locked_call,
    resolve_encoder,
)

# Same shapes as llama_index.vector_stores.qdrant.utils (BatchSparseEncoding / SparseEncoderCallable),
# restated here so this module does not need the Qdrant extra.
BatchSparseEncoding = tuple[list[list[int]], list[list[float]]]

logger = logging.getLogger("llama_index.embeddings.bgem3")


def encode_lexical(
    encoder: Any,
    texts: Sequence[str],
    *,
    query: bool,
    batch_size: int | None = None,
    max_length: int | None = None,
) -> list[SparseEmbedding]:
    """BGE-M3 lexical weights as {token_id: weight} dicts, in input order (the reference's weights). A
    query without text is refused (EmptyQueryError, a ValueError): the rule every query follows."""
    if not texts:
        return []
    if query:
        texts = [check_query(t) for t in texts]
        log_cut_queries(logger, encoder, texts, max_length)
    method = encoder.encode_queries if query else encoder.encode_corpus
    out = locked_call(
        encoder,
        lambda: method(
            list(texts),
            batch_size=batch_size,
            max_length=max_length,
            return_dense=False,
            return_sparse=True,
            return_colbert_vecs=False,
        ),
    )
    # The encoder keys weights by str(token_id), like FlagEmbedding; LlamaIndex and Qdrant want ints.
    return [dict(zip(*(a.tolist() for a in sparse_arrays(lw)), strict=True)) for lw in out["lexical_weights"]]


class BGEM3SparseEmbedding(EncoderSettingsMixin, BaseSparseEmbedding):
    """BGE-M3 sparse embeddings: {token_id: weight}, relu(sparse_linear(hidden)) max-pooled per token.

    The dot product of two of these is the reference lexical matching score. Pass `encoder=` (for instance
    `dense_embedding.encoder`) to share one loaded model with `BGEM3Embedding`.
    """

    @classmethod
    def class_name(cls) -> str:
        return "BGEM3SparseEmbedding"

    def _encode(self, texts: list[str], *, query: bool) -> list[SparseEmbedding]:
        return encode_lexical(
            self.encoder,
            texts,
            query=query,
            batch_size=self.embed_batch_size,
            max_length=self.query_max_length if query else self.passage_max_length,
        )

    def _get_query_embedding(self, query: str) -> SparseEmbedding:
        return self._encode([query], query=True)[0]

    def _get_text_embedding(self, text: str) -> SparseEmbedding:
        return self._encode([text], query=False)[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[SparseEmbedding]:
        return self._encode(texts, query=False)

    async def _aget_query_embedding(self, query: str) -> SparseEmbedding:
        return await asyncio.to_thread(self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> SparseEmbedding:
        return await asyncio.to_thread(self._get_text_embedding, text)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[SparseEmbedding]:
        return await asyncio.to_thread(self._get_text_embeddings, texts)


class BGEM3SparseEncoder:
    """A SparseEncoderCallable for QdrantVectorStore: texts -> (indices per text, values per text).

    Built by `sparse_doc_fn` / `sparse_query_fn`; holds a reference to a shared encoder, not a copy.
    """

    def __init__(
        self, encoder: Any, *, query: bool, batch_size: int | None = None, max_length: int | None = None
    ) -> None:
        self.encoder = encoder
        self.query = query
        self.batch_size = batch_size
        self.max_length = max_length

    def __call__(self, texts: list[str]) -> BatchSparseEncoding:
        weights = encode_lexical(
            self.encoder, texts, query=self.query, batch_size=self.batch_size, max_length=self.max_length
        )
        # token ids are unique per text (dict keys), as Qdrant requires for a SparseVector.
        return [list(w.keys()) for w in weights], [list(w.values()) for w in weights]

    def __repr__(self) -> str:
        kind = "query" if self.query else "doc"
        return f"BGEM3SparseEncoder({kind}, model={getattr(self.encoder, 'model_id', '?')!r})"


def _source_encoder(source: Any, encoder_kwargs: dict[str, Any]) -> Any:
    if isinstance(source, str):
        return build_encoder(
            source,
            precision=encoder_kwargs.pop("precision", "auto"),
            device=encoder_kwargs.pop("device", "auto"),
            batch_size=encoder_kwargs.pop("batch_size", DEFAULT_EMBED_BATCH_SIZE),
            query_max_length=encoder_kwargs.pop("query_max_length", None),
            passage_max_length=encoder_kwargs.pop("passage_max_length", None),
            cache_folder=encoder_kwargs.pop("cache_folder", None),
            model_kwargs=encoder_kwargs,
        )
    if encoder_kwargs:
        raise TypeError(f"encoder options {sorted(encoder_kwargs)} only apply when a model name is given")
    return resolve_encoder(source)


def sparse_doc_fn(
    source: Any = DEFAULT_MODEL,
    *,
    batch_size: int | None = None,
    max_length: int | None = None,
    **encoder_kwargs: Any,
) -> BGEM3SparseEncoder:
    """Sparse encoder for documents, for `QdrantVectorStore(enable_hybrid=True, sparse_doc_fn=...)`.

    `source`: a BGEM3Encoder, a BGEM3Embedding / BGEM3SparseEmbedding (its encoder is shared), or a model
    name/path (a new encoder is loaded, with `encoder_kwargs` passed to it). `max_length` None: the
    encoder's passage limit.
    """
    encoder = _source_encoder(source, dict(encoder_kwargs))
    return BGEM3SparseEncoder(encoder, query=False, batch_size=batch_size, max_length=max_length)


def sparse_query_fn(
    source: Any = DEFAULT_MODEL,
    *,
    batch_size: int | None = None,
    max_length: int | None = None,
    **encoder_kwargs: Any,
) -> BGEM3SparseEncoder:
    """Sparse encoder for queries, for `QdrantVectorStore(enable_hybrid=True, sparse_query_fn=...)`.

    Same arguments as `sparse_doc_fn`; `max_length` None: the encoder's query limit.
    """
    encoder = _source_encoder(source, dict(encoder_kwargs))
    return BGEM3SparseEncoder(encoder, query=True, batch_size=batch_size, max_length=max_length)
