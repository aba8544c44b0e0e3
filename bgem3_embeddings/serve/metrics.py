"""Prometheus metrics of one server (its own registry: two apps in one process never mix their counts).

    bgem3_requests_total{route, status}     requests answered
    bgem3_request_seconds{route}            latency histogram, request in to response out
    bgem3_batch_texts / bgem3_batch_tokens  texts and tokens per encoder call (requests of several clients)
    bgem3_batch_seconds                     time per encoder call
    bgem3_tokens_total, bgem3_texts_total   encoded so far (rate() gives tokens/s)
    bgem3_tokens_per_second                 throughput of the last encoder call
    bgem3_queue_texts, bgem3_queue_requests waiting for the encoder
    bgem3_rejected_total{reason}            queue_full, abandoned (client gone before its turn)
    bgem3_rerank_...                        the same for the reranker (`bgem3 serve --reranker`): texts are
                                            (query, text) pairs, calls are cross-encoder calls
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

POWERS_OF_TWO = tuple(float(2**i) for i in range(0, 13))  # 1 .. 4096 texts
TOKEN_BUCKETS = tuple(float(2**i) for i in range(4, 18))  # 16 .. 131072 tokens
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class BatchMetrics:
    """The counters of one batcher (one model's queue and calls), named `{prefix}_...`."""

    def __init__(self, registry: CollectorRegistry, prefix: str = "bgem3", items: str = "Texts") -> None:
        r = registry
        low = items.lower()
        self.batch_texts = Histogram(
            f"{prefix}_batch_texts", f"{items} per model call", buckets=POWERS_OF_TWO, registry=r
        )
        self.batch_tokens = Histogram(
            f"{prefix}_batch_tokens", "Tokens per model call", buckets=TOKEN_BUCKETS, registry=r
        )
        self.batch_seconds = Histogram(
            f"{prefix}_batch_seconds", "Seconds per model call", buckets=LATENCY_BUCKETS, registry=r
        )
        self.tokens = Counter(f"{prefix}_tokens", "Tokens computed", registry=r)
        self.texts = Counter(f"{prefix}_texts", f"{items} computed", registry=r)
        self.tokens_per_second = Gauge(
            f"{prefix}_tokens_per_second", "Tokens per second of the last model call", registry=r
        )
        self.queue_texts = Gauge(f"{prefix}_queue_texts", f"{items} waiting for the model", registry=r)
        self.queue_requests = Gauge(f"{prefix}_queue_requests", "Requests waiting for the model", registry=r)
        self.rejected = Counter(
            f"{prefix}_rejected", f"Requests not computed ({low})", ["reason"], registry=r
        )

    def observe_batch(self, texts: int, tokens: int, seconds: float) -> None:
        self.batch_texts.observe(texts)
        self.batch_tokens.observe(tokens)
        self.batch_seconds.observe(seconds)
        self.tokens.inc(tokens)
        self.texts.inc(texts)
        if seconds > 0:
            self.tokens_per_second.set(tokens / seconds)

    def set_queue(self, texts: int, requests: int) -> None:
        self.queue_texts.set(texts)
        self.queue_requests.set(requests)


class ServeMetrics(BatchMetrics):
    """The server's counters: requests, the embedding model's batcher (its own attributes, `bgem3_...`)
    and the reranker's (`rerank`, `bgem3_rerank_...`, texts = (query, text) pairs); `render()` is the
    /metrics body."""

    def __init__(self, known_routes: tuple[str, ...] = ()) -> None:
        self.registry = CollectorRegistry()
        self.known_routes = set(known_routes)
        r = self.registry
        self.requests = Counter("bgem3_requests", "Requests answered", ["route", "status"], registry=r)
        self.latency = Histogram(
            "bgem3_request_seconds", "Request latency", ["route"], buckets=LATENCY_BUCKETS, registry=r
        )
        super().__init__(r, "bgem3", "Texts")
        self.rerank = BatchMetrics(r, "bgem3_rerank", "Pairs")

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestMetrics:
    """ASGI wrapper counting every HTTP request by route and status, with its latency."""

    def __init__(self, app: ASGIApp, metrics: ServeMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Unknown paths share one label: a scanner must not create a time series per URL it tries.
        route = scope["path"] if scope["path"] in self.metrics.known_routes else "other"
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - start)
