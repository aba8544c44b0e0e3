"""Helpers shared by the embedding and reranking classes: encoder settings, construction and locking."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from llama_index.core.bridge.pydantic import BaseModel, Field

from bgem3_embeddings.concurrency import encoder_lock
from bgem3_embeddings.install_hint import pip_install

DEFAULT_MODEL = "BAAI/bge-m3"
# LlamaIndex's own default is 10; BGE-M3 sorts each batch by length, so larger batches pad less.
DEFAULT_EMBED_BATCH_SIZE = 32

T = TypeVar("T")


def require(module: str, requirement: str, what: str) -> Any:
    """Import an optional dependency, or raise an ImportError naming the pip install to run
    (`requirement`, e.g. "llama-index-embeddings-bgem3[qdrant]", in the form that works here)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{what} needs `{module}`: run `{pip_install(requirement)}`") from exc


def build_encoder(
    model_name: str,
    *,
    precision: str,
    device: str,
    batch_size: int,
    query_max_length: int | None,
    passage_max_length: int | None,
    cache_folder: str | None,
    model_kwargs: dict[str, Any],
) -> Any:
    """Construct a BGEM3Encoder from the integration's fields (None lengths keep the encoder defaults)."""
    core = require("bgem3_embeddings", "bgem3-embeddings", "BGE-M3 embeddings")
    kwargs: dict[str, Any] = {
        "precision": precision,
        "device": device,
        "batch_size": batch_size,
        "cache_dir": cache_folder,
        # LlamaIndex draws its own progress bar (show_progress=True on the batch calls / the index):
        # a second bar from the encoder, per batch, would only add noise.
        "show_progress": False,
    }
    if query_max_length is not None:
        kwargs["query_max_length"] = query_max_length
    if passage_max_length is not None:
        kwargs["passage_max_length"] = passage_max_length
    kwargs.update(model_kwargs)
    return core.BGEM3Encoder(model_name, **kwargs)


def resolve_encoder(source: Any) -> Any:
    """Return the BGEM3Encoder behind `source`: an encoder, or an object with an `encoder` attribute."""

    def is_encoder(obj: Any) -> bool:
        return hasattr(obj, "encode_queries") and hasattr(obj, "encode_corpus")

    if is_encoder(source):
        return source
    inner = getattr(source, "encoder", None)
    if is_encoder(inner):
        return inner
    raise TypeError(
        f"expected a BGEM3Encoder, BGEM3Embedding or BGEM3SparseEmbedding, got {type(source).__name__}"
    )


class EncoderOwnerMixin(BaseModel):
    """Shared `__init__` of the LlamaIndex classes that wrap a BGEM3Encoder (declares no fields).

    Put it first among the bases (`class C(EncoderOwnerMixin, BaseEmbedding)`). The class declares the
    `model_name` and `encoder` fields and implements `_build_encoder`, called when no encoder is given.
    """

    if TYPE_CHECKING:  # declared as pydantic fields by the concrete classes
        model_name: str
        encoder: Any

    def __init__(self, model_name: str | None = None, encoder: Any = None, **kwargs: Any) -> None:
        if encoder is not None:
            encoder = resolve_encoder(encoder)
        if model_name is None:
            model_name = str(getattr(encoder, "model_id", None) or DEFAULT_MODEL)
        # through the kwargs dict: type checkers see only the base class's fields in its __init__
        kwargs.update(model_name=model_name, encoder=encoder)
        super().__init__(**kwargs)
        if self.encoder is None:
            self.encoder = self._build_encoder()

    def _build_encoder(self) -> Any:
        """A new BGEM3Encoder from the validated fields."""
        raise NotImplementedError


class EncoderSettingsMixin(EncoderOwnerMixin):
    """The encoder settings fields of BGEM3Embedding and BGEM3SparseEmbedding, and their encoder build.

    Put it first among the bases, so that its `model_name` and `embed_batch_size` replace the base
    class's while keeping their place in the field order.
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
    base_url: str | None = Field(
        default=None,
        description="URL of a running `bgem3 serve`: encode through it (no model, no TensorFlow here).",
    )
    api_key: str | None = Field(
        default=None, exclude=True, repr=False, description="The server's --api-key, if it has one."
    )
    # excluded from serialisation: a loaded model is not configuration.
    encoder: Any = Field(default=None, exclude=True, description="An existing BGEM3Encoder to reuse.")

    def _build_encoder(self) -> Any:
        if self.base_url is not None:
            from bgem3_embeddings.remote import RemoteEncoder

            return RemoteEncoder(self.base_url, api_key=self.api_key)
        return build_encoder(
            self.model_name,
            precision=self.precision,
            device=self.device,
            batch_size=self.embed_batch_size,
            query_max_length=self.query_max_length,
            passage_max_length=self.passage_max_length,
            cache_folder=self.cache_folder,
            model_kwargs=self.model_kwargs,
        )


def locked_call(encoder: Any, fn: Callable[[], T]) -> T:
    """Run `fn` while holding the encoder's lock."""
    with encoder_lock(encoder):
        return fn()
