"""BGE-M3 sparse (lexical) embeddings for LlamaIndex, and sparse encoders for QdrantVectorStore."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.embeddings.base_sparse import BaseSparseEmbedding, SparseEmbedding
from llama_index.core.bridge.pydantic import Field

from ._shared import (
    DEFAULT_EMBED_BATCH_SIZE,
    DEFAULT_MODEL,
    build_encoder,
    locked_call,
    resolve_encoder,
)

# Same shapes as llama_index.vector_stores.qdrant.utils (BatchSparseEncoding / SparseEncoderCallable),
# restated here so this module does not need the Qdrant extra.
BatchSparseEncoding = tuple[list[list[int]], list[list[float]]]


def encode_lexical(
    encoder: Any,
    texts: Sequence[str],
    *,
    query: bool,
    batch_size: int | None = None,
    max_length: int | None = None,
) -> list[SparseEmbedding]:
    """BGE-M3 lexical weights as {token_id: weight} dicts, in input order (the reference's weights)."""
    if not texts:
        return []
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
    return [{int(tok): float(w) for tok, w in lw.items()} for lw in out["lexical_weights"]]


class BGEM3SparseEmbedding(BaseSparseEmbedding):
    """BGE-M3 sparse embeddings: {token_id: weight}, relu(sparse_linear(hidden)) max-pooled per token.

    The dot product of two of these is the reference lexical matching score. Pass `encoder=` (for instance
    `dense_embedding.encoder`) to share one loaded model with `BGEM3Embedding`.
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
