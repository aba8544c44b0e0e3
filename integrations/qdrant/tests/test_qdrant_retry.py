"""Transient errors are retried with backoff; others are not. Uses a real embedded store."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from bgem3_qdrant import StoreUnavailableError, open_store, resolve_target
from bgem3_qdrant.encoder import EncodedTexts
from bgem3_qdrant.ingest.encoding import EncodedBatch
from bgem3_qdrant.ingest.writer import Writer
from bgem3_qdrant.retry import call_with_retries, is_transient
from bgem3_qdrant.schema import CollectionSchema
from bgem3_qdrant.stores import BGEM3Store, ensure_collection
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse


def test_is_transient() -> None:
    assert is_transient(ResponseHandlingException(ConnectionError("refused")))
    assert is_transient(UnexpectedResponse(503, "Unavailable", b"", None))  # type: ignore[arg-type]
    assert not is_transient(UnexpectedResponse(400, "Bad Request", b"", None))  # type: ignore[arg-type]
    assert not is_transient(ValueError("Wrong input"))


def test_backoff_sleeps_and_gives_up() -> None:
    sleeps: list[float] = []
    calls = 0

    def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError("reset")
        return "ok"

    assert call_with_retries(flaky, attempts=5, base_delay=0.1, sleep=sleeps.append) == "ok"
    assert len(sleeps) == 2 and sleeps[1] > sleeps[0] * 0.9
    with pytest.raises(ConnectionError):
        call_with_retries(
            lambda: (_ for _ in ()).throw(ConnectionError("down")), attempts=2, sleep=sleeps.append
        )


class FlakyClient:
    """The real store, whose first `failures` upserts fail like a dropped connection."""

    def __init__(self, client: BGEM3Store, failures: int) -> None:
        self._client, self.failures = client, failures

    def upsert(self, *a: Any, **kw: Any) -> Any:
        if self.failures:
            self.failures -= 1
            raise ResponseHandlingException(ConnectionError("connection reset by peer"))
        return self._client.upsert(*a, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_store_retries_transient_upsert_errors(client: BGEM3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bgem3_qdrant.retry.time.sleep", lambda s: None)
    schema = CollectionSchema(size=4)
    ensure_collection(client, "c", schema)
    flaky = FlakyClient(client, failures=2)
    store = Writer(client, "c", schema, retries=4)
    store.store = flaky  # type: ignore[assignment]
    batch = EncodedBatch(
        ids=["00000000-0000-0000-0000-000000000002"],
        payloads=[{}],
        vectors=EncodedTexts(
            dense=np.ones((1, 4), np.float32),
            sparse=[(np.array([1]), np.array([1.0], np.float32))],
            colbert=[np.ones((2, 4), np.float32)],
        ),
        tokens=3,
    )
    store.upsert_async(batch)
    store.close()
    assert flaky.failures == 0 and client.count("c") == 1


def test_unreachable_server_is_a_clear_error() -> None:
    with pytest.raises(StoreUnavailableError, match="cannot reach Qdrant at http://127.0.0.1:9"):
        open_store(resolve_target(url="http://127.0.0.1:9", timeout=2))


def test_locked_embedded_store_is_a_clear_error(tmp_path: Any) -> None:
    first = open_store(resolve_target(path=str(tmp_path)))
    try:
        with pytest.raises(StoreUnavailableError, match="open in another process"):
            open_store(resolve_target(path=str(tmp_path)))
    finally:
        first.close()
