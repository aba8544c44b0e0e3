"""BGE's cross-encoder (BAAI/bge-reranker-v2-m3, `bgem3_embeddings.BGEM3Reranker`) in LangChain.

Two ways in, one model (loaded once per configuration and shared, as the encoders are):

- `BGEM3CrossEncoderRerank`: a `BaseDocumentCompressor` for `ContextualCompressionRetriever` (the retriever's
  documents ordered by the cross-encoder, the best `top_n` kept, each with `metadata["relevance_score"]`).
- `BGEM3CrossEncoder`: langchain-core's `BaseCrossEncoder`, the model langchain-classic's
  `CrossEncoderReranker(model=..., top_n=...)` takes.

    from langchain_classic.retrievers import ContextualCompressionRetriever
    compressor = BGEM3CrossEncoderRerank(model_name="BAAI/bge-reranker-v2-m3", top_n=3)
    retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=base)

`BGEM3Retriever(reranker=...)` (and `BGEM3QdrantIndex.as_retriever(reranker=...)`) runs the same stage
inside the Qdrant retriever. Scores are `BGEM3Reranker.compute_score`'s: the logit, or its sigmoid with
`normalize=True` (FlagReranker's).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

from langchain_core.callbacks import Callbacks
from langchain_core.cross_encoders import BaseCrossEncoder
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import ConfigDict, Field, model_validator

from langchain_bgem3._encoder import _freeze, encoder_lock, import_optional

DEFAULT_RERANKER = "BAAI/bge-reranker-v2-m3"
_LIVE: weakref.WeakValueDictionary[tuple[Any, ...], Any] = weakref.WeakValueDictionary()
_LIVE_LOCK = threading.Lock()


def load_reranker(model_name: str, model_kwargs: dict[str, Any] | None = None) -> Any:
    """A BGEM3Reranker, or the live one already loaded with the same settings (the full model is 2.3 GB)."""
    kwargs = dict(model_kwargs or {})
    key = (str(model_name), _freeze(kwargs))
    with _LIVE_LOCK:
        reranker = _LIVE.get(key)
        if reranker is None:
            core = import_optional("bgem3_embeddings", "bgem3-embeddings")
            reranker = core.BGEM3Reranker(str(model_name), **kwargs)
            with suppress(TypeError):  # not weak-referenceable: not shared implicitly
                _LIVE[key] = reranker
        return reranker


def resolve_reranker(value: Any) -> Any:
    """A BGEM3Reranker, or a langchain_bgem3 component holding one (its model is shared, not reloaded)."""
    inner = getattr(value, "reranker", None)
    if inner is not None and not hasattr(value, "compute_score"):
        value = inner
    missing = [m for m in ("compute_score", "rerank") if not hasattr(value, m)]
    if missing:
        raise TypeError(
            "reranker must be a bgem3_embeddings.BGEM3Reranker (or a langchain_bgem3 component holding one); "
            f"got {type(value).__name__} without {', '.join(missing)}"
        )
    return value


class BGEM3CrossEncoder(BaseCrossEncoder):
    """langchain-core's `BaseCrossEncoder` on bge-reranker-v2-m3: what `CrossEncoderReranker` takes.

    Example:
        ```python
        from langchain_classic.retrievers.document_compressors import CrossEncoderReranker
        compressor = CrossEncoderReranker(model=BGEM3CrossEncoder("BAAI/bge-reranker-v2-m3"), top_n=3)
        ```
    """

    def __init__(
        self,
        model_name: str = DEFAULT_RERANKER,
        *,
        reranker: Any = None,
        normalize: bool = False,
        model_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """`reranker`: a loaded BGEM3Reranker (else `model_name` is loaded with `model_kwargs`);
        `normalize`: sigmoid scores in (0, 1) instead of logits (the order is the same)."""
        self.reranker = resolve_reranker(reranker) if reranker is not None else load_reranker(
            model_name, model_kwargs
        )
        self.normalize = normalize

    def score(self, text_pairs: list[tuple[str, str]]) -> list[float]:
        """One relevance score per (query, text) pair, FlagReranker's."""
        pairs = [(str(q), str(t)) for q, t in text_pairs]
        if not pairs:
            return []
        with encoder_lock(self.reranker):
            scores = self.reranker.compute_score(pairs, normalize=self.normalize)
        return [float(s) for s in scores]


class BGEM3CrossEncoderRerank(BaseDocumentCompressor):
    """Documents ordered by bge-reranker-v2-m3, the best `top_n` kept, each with
    `metadata["relevance_score"]`: a compressor for `ContextualCompressionRetriever`.

    Example:
        ```python
        compressor = BGEM3CrossEncoderRerank(model_name="BAAI/bge-reranker-v2-m3", top_n=3)
        retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=base)
        ```
    """

    model_name: str = DEFAULT_RERANKER
    model_kwargs: dict[str, Any] | None = None
    """BGEM3Reranker's options (precision, device, max_length, batch_size, ...)."""
    reranker: Any = Field(default=None, exclude=True, repr=False)
    """A loaded BGEM3Reranker (or a component holding one); default: `model_name`, loaded once."""
    top_n: int | None = Field(default=3, ge=1)
    """Documents kept (None: all, reordered)."""
    normalize: bool = False
    """relevance_score as the sigmoid of the logit, in (0, 1)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=(), extra="forbid")

    @model_validator(mode="after")
    def _load(self) -> BGEM3CrossEncoderRerank:
        if self.reranker is None:
            self.reranker = load_reranker(self.model_name, self.model_kwargs)
        else:
            self.reranker = resolve_reranker(self.reranker)
        return self

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """The documents best first by the cross-encoder, the first `top_n`."""
        docs = list(documents)
        if not docs:
            return []
        with encoder_lock(self.reranker):
            ranked = self.reranker.rerank(
                query, [d.page_content for d in docs], top_n=self.top_n, normalize=self.normalize
            )
        return [
            Document(
                id=docs[i].id,
                page_content=docs[i].page_content,
                metadata={**docs[i].metadata, "relevance_score": float(score)},
            )
            for i, score in ranked
        ]
