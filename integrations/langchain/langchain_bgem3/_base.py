"""Fields and encoder handling shared by the BGE-M3 LangChain components."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from bgem3_embeddings.query_text import check_query, log_cut_queries
from langchain_bgem3._encoder import encoder_lock, load_encoder, resolve_encoder

# Set by the component itself: a caller passing them in encode_kwargs would get the wrong output.
logger = logging.getLogger("langchain_bgem3")

_RESERVED_ENCODE_KEYS = frozenset({"return_dense", "return_sparse", "return_colbert_vecs"})


class BGEM3EncoderMixin(BaseModel):
    """Pydantic fields after the sentence-transformers convention, plus a shareable `encoder`."""

    model_name: str = "BAAI/bge-m3"
    """Hugging Face hub id or local checkpoint directory (BAAI/bge-m3 file layout)."""
    cache_folder: str | None = None
    """Where hub downloads are cached (huggingface_hub's cache_dir)."""
    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for `BGEM3Encoder`: precision, device, batch_size, query_max_length,
    passage_max_length, revision, local_files_only..."""
    encode_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for encoding documents (`encode_corpus`): batch_size, max_length."""
    query_encode_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for encoding queries (`encode_queries`): batch_size, max_length."""
    show_progress: bool = False
    """Show a progress bar while encoding (only when this component loads the encoder)."""
    encoder: Any = Field(default=None, exclude=True, repr=False)
    """An already loaded `BGEM3Encoder` (or another langchain_bgem3 component) to share: the model is
    loaded once and used by every component given it. Left empty, the component loads the model from
    `model_name`, reusing a live encoder loaded with the same settings."""
    base_url: str | None = None
    """URL of a running `bgem3 serve` (e.g. "http://127.0.0.1:8000"): encode through it instead of loading
    the model here (no TensorFlow in this process; one model shared by every process on the machine)."""
    api_key: SecretStr | None = None
    """The server's --api-key, when it has one (sent as a Bearer token)."""

    model_config = ConfigDict(protected_namespaces=(), arbitrary_types_allowed=True, extra="forbid")

    @model_validator(mode="after")
    def _load_encoder(self) -> BGEM3EncoderMixin:
        for name in ("encode_kwargs", "query_encode_kwargs"):
            bad = _RESERVED_ENCODE_KEYS.intersection(getattr(self, name))
            if bad:
                raise ValueError(f"{name} must not set {sorted(bad)}: the component chooses its outputs")
        if self.encoder is not None and self.base_url is not None:
            raise ValueError("give either encoder or base_url, not both")
        if self.base_url is not None:
            from bgem3_embeddings.remote import RemoteEncoder

            key = self.api_key.get_secret_value() if self.api_key is not None else None
            self.encoder = RemoteEncoder(self.base_url, api_key=key)
        elif self.encoder is not None:
            self.encoder = resolve_encoder(self.encoder)
            model_id = getattr(self.encoder, "model_id", None)
            # Keep model_name truthful in repr/serialisation when only an encoder was given.
            if "model_name" not in self.model_fields_set and model_id is not None:
                self.model_name = str(model_id)
        else:
            self.encoder = load_encoder(
                self.model_name, self.cache_folder, self.model_kwargs, self.show_progress
            )
        return self

    def _encode(self, texts: Sequence[str], *, query: bool, **outputs: bool) -> dict[str, Any]:
        """Encode a batch with the query or passage settings; the encoder batches internally. A query
        without text is refused (EmptyQueryError, a ValueError): the rule every query follows."""
        kwargs = {**(self.query_encode_kwargs if query else self.encode_kwargs), **outputs}
        if query:
            texts = [check_query(t) for t in texts]
            log_cut_queries(logger, self.encoder, texts, kwargs.get("max_length"))
        fn = self.encoder.encode_queries if query else self.encoder.encode_corpus
        with encoder_lock(self.encoder):
            return fn(list(texts), **kwargs)
