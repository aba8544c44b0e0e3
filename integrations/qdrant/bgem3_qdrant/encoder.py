"""The encoder this package relies on, loading one by name, and encoding texts into their three vectors."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np

from bgem3_embeddings.outputs import sparse_arrays

from .errors import BGEM3QdrantError

logger = logging.getLogger(__name__)

Sparse = tuple[np.ndarray, np.ndarray]  # (int64 token ids, float32 weights), ids sorted and unique


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

    def explain_many(
        self, query: str, passages: Any, *, weights: Any = ..., colbert_matrix: bool = ...
    ) -> Any:
        """Explanations of passages for a query (`bgem3_embeddings.explain`): `search --explain`, the page."""
        ...


def load_encoder(model: str, **kwargs: Any) -> EncoderLike:
    """Build a BGEM3Encoder from a hub id or a local checkpoint directory."""
    # Imported here so that `--help` and the pure helpers don't pay for loading TensorFlow.
    from bgem3_embeddings import BGEM3Encoder

    logger.info("loading encoder %s", model)
    encoder: EncoderLike = BGEM3Encoder(model, **kwargs)
    return encoder


def connect_encoder(url: str, api_key: str | None = None) -> EncoderLike:
    """An encoder whose model runs in a `bgem3 serve` process at `url` (`bgem3_embeddings.remote`): no
    TensorFlow and no model in this process. Asks the server about its model at once, so an unreachable
    server or a refused key fails before any work (a one-line RemoteEncoderError)."""
    from bgem3_embeddings.remote import RemoteEncoder

    try:
        encoder = RemoteEncoder(url, api_key=api_key)
    except ValueError as e:
        raise BGEM3QdrantError(f"{e} (--encoder-url): e.g. http://127.0.0.1:8000 from `bgem3 serve`") from e
    logger.info("encoding through %s (%s)", url, encoder.info["model"])
    # its hidden_size and tokenizer are read-only properties (asked of the server), which the protocol's
    # plain attributes accept at run time
    return cast(EncoderLike, encoder)


@dataclass
class EncodedTexts:
    """The three BGE-M3 outputs of some texts, in input order."""

    dense: np.ndarray  # (n, hidden) float32, L2-normalised
    sparse: list[Sparse]  # per text
    colbert: list[np.ndarray]  # per text: (tokens, hidden) float32

    def __len__(self) -> int:
        return len(self.colbert)


def encode_texts(
    encoder: EncoderLike,
    texts: list[str],
    *,
    query: bool,
    max_length: int | None = None,
    batch_size: int | None = None,
) -> EncodedTexts:
    """Run the encoder once for all three outputs (`encode_queries` for queries, else `encode_corpus`)."""
    method = encoder.encode_queries if query else encoder.encode_corpus
    out = method(
        texts,
        batch_size=batch_size,
        max_length=max_length,
        return_dense=True,
        return_sparse=True,
        return_colbert_vecs=True,
    )
    return EncodedTexts(
        dense=np.asarray(out["dense_vecs"], dtype=np.float32),
        sparse=[sparse_arrays(lw) for lw in out["lexical_weights"]],
        colbert=[np.asarray(c, dtype=np.float32) for c in out["colbert_vecs"]],
    )
