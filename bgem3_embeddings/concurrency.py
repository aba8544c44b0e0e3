"""One lock per encoder object, shared by every integration that calls into it.

Components of LangChain and LlamaIndex may share one encoder (the real model is 2.3 GB) and run it from
worker threads (their async methods). A forward pass already uses every core, so serialising calls per
encoder costs nothing and keeps one batch's activations in memory at a time. BGEM3Encoder's own tokenizer
is thread-safe; a user-supplied encoder's Hugging Face fast tokenizer raises "Already borrowed" when two
threads change its padding/truncation at once. Importing this module does not import TensorFlow.

    >>> with encoder_lock(encoder):  # doctest: +SKIP
    ...     encoder.encode_queries(["What is BGE M3?"])
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

# Weak keys: a lock lives as long as its encoder.
_LOCKS: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()
# Encoders that cannot be weakly referenced share this one.
_FALLBACK_LOCK = threading.Lock()


def encoder_lock(encoder: Any) -> threading.Lock:
    """The lock that serialises calls into `encoder` (the same object for every caller).

    An encoder that says `concurrent_calls = True` (`bgem3_embeddings.remote.RemoteEncoder`: the server
    batches concurrent requests itself) gets a new lock per call, so its callers are never serialised.
    """
    if getattr(encoder, "concurrent_calls", False) is True:
        return threading.Lock()
    with _LOCKS_GUARD:
        try:
            lock = _LOCKS.get(encoder)
            if lock is None:
                lock = _LOCKS[encoder] = threading.Lock()
            return lock
        except TypeError:  # not weak-referenceable
            return _FALLBACK_LOCK
