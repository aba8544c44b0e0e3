"""Retries with exponential backoff for transient Qdrant errors (network, 429, 5xx)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")

TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying: connection problems, timeouts, overload and gateway errors."""
    from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

    if isinstance(exc, UnexpectedResponse):
        return exc.status_code in TRANSIENT_STATUS
    if isinstance(exc, ResponseHandlingException | ConnectionError | TimeoutError):
        return True
    try:
        import httpx

        if isinstance(exc, httpx.TransportError):
            return True
    except ImportError:  # pragma: no cover - httpx comes with qdrant-client
        pass
    try:
        import grpc

        if isinstance(exc, grpc.RpcError):
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            return code in (
                grpc.StatusCode.UNAVAILABLE,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
            )
    except ImportError:  # pragma: no cover
        pass
    return False


def call_with_retries(
    fn: Callable[[], T],
    *,
    attempts: int = 5,
    base_delay: float = 0.5,
    max_delay: float = 10.0,
    what: str = "request",
    sleep: Callable[[float], None] | None = None,
) -> T:
    """fn(), retried on transient errors with jittered exponential backoff; other errors at once."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as e:
            if attempt == attempts or not is_transient(e):
                raise
            delay = min(max_delay, base_delay * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
            logger.warning(
                "%s failed (%s: %s); retry %d/%d in %.1fs",
                what,
                type(e).__name__,
                e,
                attempt,
                attempts - 1,
                delay,
            )
            (sleep or time.sleep)(delay)
    raise AssertionError("unreachable")  # pragma: no cover
