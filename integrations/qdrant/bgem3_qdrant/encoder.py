"""The encoder interface this package relies on, and loading one by name."""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

logger = logging.getLogger(__name__)


@runtime_checkable
class EncoderLike(Protocol):
    """What bgem3_embeddings.BGEM3Encoder offers and this package uses (see docs/CORE_API.md)."""

    tokenizer: Any
    hidden_size: int

    def encode_corpus(
        self,
        corpus: Any,
        batch_size: int | None = ...,
        max_length: int | None = ...,
        return_dense: bool = ...,
        return_sparse: bool = ...,
        return_colbert_vecs: bool = ...,
    ) -> dict[str, Any]: ...

    def encode_queries(
        self,
        queries: Any,
        batch_size: int | None = ...,
        max_length: int | None = ...,
        return_dense: bool = ...,
        return_sparse: bool = ...,
        return_colbert_vecs: bool = ...,
    ) -> dict[str, Any]: ...


def load_encoder(model: str, **kwargs: Any) -> EncoderLike:
    """Build a BGEM3Encoder from a hub id or a local checkpoint directory."""
    # Imported here so that `--help` and the pure helpers don't pay for loading TensorFlow.
    from bgem3_embeddings import BGEM3Encoder

    logger.info("loading encoder %s", model)
    encoder: EncoderLike = BGEM3Encoder(model, **kwargs)
    return encoder
