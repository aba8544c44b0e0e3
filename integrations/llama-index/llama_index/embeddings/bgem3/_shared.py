"""Helpers shared by the dense and sparse embedding classes: encoder construction and locking."""

from __future__ import annotations

import importlib
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

DEFAULT_MODEL = "BAAI/bge-m3"
# LlamaIndex's own default is 10; BGE-M3 sorts each batch by length, so larger batches pad less.
DEFAULT_EMBED_BATCH_SIZE = 32

T = TypeVar("T")


def require(module: str, pip_spec: str, what: str) -> Any:
    """Import an optional dependency, or raise an ImportError naming the pip install to run."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{what} needs `{module}`: run `pip install {pip_spec}`") from exc


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


# One lock per encoder instance: the dense and the sparse embedding may share one encoder, and a fast
# tokenizer used from two threads at once fails ("Already borrowed"). Async calls run the encoder in a
# worker thread, so concurrent batches must be serialised on the encoder, not on the wrapper.
_LOCKS: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()
_FALLBACK_LOCK = threading.Lock()


def encoder_lock(encoder: Any) -> threading.Lock:
    """The lock that serialises calls into `encoder`."""
    with _LOCKS_GUARD:
        try:
            lock = _LOCKS.get(encoder)
            if lock is None:
                lock = _LOCKS[encoder] = threading.Lock()
            return lock
        except TypeError:  # not weak-referenceable: share one process-wide lock
            return _FALLBACK_LOCK


def locked_call(encoder: Any, fn: Callable[[], T]) -> T:
    """Run `fn` while holding the encoder's lock."""
    with encoder_lock(encoder):
        return fn()
