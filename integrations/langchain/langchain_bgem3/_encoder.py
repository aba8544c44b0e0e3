"""Loading and sharing one BGEM3Encoder between LangChain components."""

from __future__ import annotations

import threading
import weakref
from contextlib import suppress
from typing import Any

# One lock per encoder, shared with every other integration: see bgem3_embeddings.concurrency.
from bgem3_embeddings.concurrency import encoder_lock as encoder_lock
from bgem3_embeddings.install_hint import pip_install

# Live encoders by configuration. Values are weak: an encoder is reused while some component still
# holds it (the real model is 2.3 GB: two components built with the same settings must not load it
# twice), and freed as soon as the last component goes away.
_LIVE_ENCODERS: weakref.WeakValueDictionary[tuple[Any, ...], Any] = weakref.WeakValueDictionary()
_LIVE_LOCK = threading.Lock()

_ENCODER_METHODS = ("encode_queries", "encode_corpus")


def install_hint(package: str, extra: str | None = None) -> str:
    """The pip command that installs a missing optional package (in the form that works for how this
    project was installed: see bgem3_embeddings.install_hint)."""
    if extra:
        return f"{pip_install(f'langchain-bgem3[{extra}]')}  (or: {pip_install(package)})"
    return pip_install(package)


def import_optional(module: str, package: str, extra: str | None = None) -> Any:
    """Import an optional module, or raise an ImportError that names the pip install to run."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{module!r} is required for this feature but is not installed. "
            f"Install it with: {install_hint(package, extra)}"
        ) from exc


def _freeze(value: Any) -> Any:
    """A hashable form of model_kwargs for the cache key."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple | set):
        return tuple(_freeze(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value


def resolve_encoder(encoder: Any) -> Any:
    """Accept a BGEM3Encoder, or any langchain_bgem3 component holding one, and return the encoder."""
    inner = getattr(encoder, "encoder", None)
    if inner is not None and not all(hasattr(encoder, m) for m in _ENCODER_METHODS):
        encoder = inner
    missing = [m for m in _ENCODER_METHODS if not hasattr(encoder, m)]
    if missing:
        raise TypeError(
            f"encoder must be a bgem3_embeddings.BGEM3Encoder (or a langchain_bgem3 component holding one); "
            f"got {type(encoder).__name__} without {', '.join(missing)}"
        )
    return encoder


def load_encoder(
    model_name: str,
    cache_folder: str | None = None,
    model_kwargs: dict[str, Any] | None = None,
    show_progress: bool | None = None,
) -> Any:
    """Build a BGEM3Encoder, or return the live one already loaded with the same settings."""
    kwargs = dict(model_kwargs or {})
    if cache_folder is not None:
        kwargs.setdefault("cache_dir", cache_folder)
    if show_progress is not None:
        kwargs.setdefault("show_progress", show_progress)
    key = (str(model_name), _freeze(kwargs))
    with _LIVE_LOCK:
        encoder = _LIVE_ENCODERS.get(key)
        if encoder is not None:
            return encoder
        core = import_optional("bgem3_embeddings", "bgem3-embeddings")
        encoder = core.BGEM3Encoder(str(model_name), **kwargs)
        # Not weak-referenceable: just don't share it implicitly.
        with suppress(TypeError):
            _LIVE_ENCODERS[key] = encoder
        return encoder
