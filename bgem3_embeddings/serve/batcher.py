"""One worker thread runs the encoder for every client: the texts of waiting requests are encoded together.

Requests arrive tokenized (`Batcher.submit`, from the event loop) and wait in a bounded queue. The worker
takes the oldest requests until their texts hold `cycle_tokens` tokens (at least one request) and encodes
them in one `encode_token_ids` call per output set, where the encoder sorts them by length and batches
them under its token budget, exactly as a single `encode` call of the same texts would. While a call runs,
new requests queue up, so under load each call carries many clients' texts and at low load a lone query
waits for nothing (continuous batching; `batch_wait_ms` can add a gathering pause).

Clients that got their answers from one call come back at slightly different times: the first one back
would start the next call alone and the others would queue behind it, so calls alternate between a few
texts and many (seen at full size with 16 clients of short queries). So after a call that answered several
requests, the worker waits a little (`regather_share` of that call's time, at most REGATHER_MAX_S) until as
many requests are queued again. A lone client never waits (its last call answered one request), nor does a
request after an idle spell (the wait only runs within that window after the call).

A full queue refuses at once (`QueueFullError`, answered 503 with Retry-After) rather than growing memory. A
request whose client went away before its turn is dropped from the queue; one already in a call only has
its result thrown away, so it never disturbs the other requests' results.

The same batcher runs the reranker of `bgem3 serve --reranker` (its own instance and worker thread): `call`
replaces the encoder call with the cross-encoder's, a request's token ids being its (query, text) pairs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bgem3_embeddings.concurrency import encoder_lock
from bgem3_embeddings.serve.memory import HeapTrimmer
from bgem3_embeddings.serve.metrics import BatchMetrics
from bgem3_embeddings.serve.settings import ServeSettings

logger = logging.getLogger(__name__)

# (dense, sparse, colbert): which outputs a request asked for
Outputs = tuple[bool, bool, bool]
# What the worker runs for the token ids of several requests that asked for the same outputs: a dict of
# arrays (or lists) with one row per input, in order.
ModelCall = Callable[[list[list[int]], Outputs], dict[str, Any]]
# The worker hands freed heap pages back to the system at most this often under traffic (memory.py; a few
# ms each), and once when no request has come for IDLE_TRIM_S after work (so an idle server keeps no burst's
# freed pages).
TRIM_EVERY_S = 10.0
IDLE_TRIM_S = 1.0
# The longest regathering wait after a call, however long the call took (a 10 s call of passages must not
# hold the next requests for a second).
REGATHER_MAX_S = 0.1


class QueueFullError(Exception):
    """The queue holds max_queued_texts texts; `retry_after` estimates when there will be room (s)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BatcherStoppedError(Exception):
    """The server is shutting down and takes no new work."""


@dataclass
class Job:
    """One request's tokenized texts, waiting for the encoder."""

    token_ids: list[list[int]]
    outputs: Outputs
    future: asyncio.Future[dict[str, Any]]
    loop: asyncio.AbstractEventLoop
    tokens: int = 0
    abandoned: bool = False  # set from the event loop when the request is cancelled
    enqueued: float = field(default_factory=time.perf_counter)


def slice_result(result: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    """Rows start:stop of an `encode_token_ids` result (None stays None)."""
    return {key: (None if value is None else value[start:stop]) for key, value in result.items()}


class Batcher:
    """The bounded queue and the worker thread in front of one encoder."""

    def __init__(
        self,
        encoder: Any,
        settings: ServeSettings,
        metrics: BatchMetrics | None = None,
        trimmer: HeapTrimmer | None = None,
        *,
        call: ModelCall | None = None,
    ) -> None:
        """`call`: what runs the model (default: the encoder's `encode_token_ids` with the outputs asked
        for); calls are serialised by `encoder_lock(encoder)` either way."""
        self.encoder = encoder
        self._call = call or self._encode_token_ids
        self.settings = settings
        self.metrics = metrics
        self._queue: deque[Job] = deque()
        self._queued_texts = 0
        self._queued_tokens = 0
        self._in_flight_texts = 0  # taken from the queue, being encoded
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        # Recent throughput, for Retry-After (a guess until the first call has run).
        self._tokens_per_second = 0.0
        # The last call: how many requests it answered, how many the regathering waits for (those plus the
        # ones already queued when it ended) and when the regathering window after it closes.
        self._last_call_jobs = 0
        self._regather_target = 0
        self._regather_until = 0.0
        self.regather_waited_s = 0.0  # total time spent regathering (tests, /metrics-free diagnostics)
        self._trimmer = trimmer if trimmer is not None else HeapTrimmer(TRIM_EVERY_S)

    # ------------------------------------------------------------------ life cycle
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="bgem3-batcher", daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Finish what is queued, then end the worker (new submissions are refused from now on)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    @property
    def queued_texts(self) -> int:
        return self._queued_texts

    @property
    def in_flight_texts(self) -> int:
        return self._in_flight_texts

    # ------------------------------------------------------------------ submit (event loop side)
    def submit(self, token_ids: list[list[int]], outputs: Outputs) -> asyncio.Future[dict[str, Any]]:
        """Queue a request; its future gets the `encode_token_ids` result of exactly its texts."""
        loop = asyncio.get_running_loop()
        job = Job(token_ids, outputs, loop.create_future(), loop, tokens=sum(len(t) for t in token_ids))
        with self._cond:
            if self._stopping:
                raise BatcherStoppedError("the server is shutting down")
            capacity = self.settings.max_queued_texts
            if self._queue and self._queued_texts + len(token_ids) > capacity:
                if self.metrics is not None:
                    self.metrics.rejected.labels("queue_full").inc()
                raise QueueFullError(
                    f"the queue is full: {self._queued_texts} texts wait for the encoder "
                    f"(max_queued_texts {capacity}); retry later",
                    self._retry_after(),
                )
            self._queue.append(job)
            self._queued_texts += len(token_ids)
            self._queued_tokens += job.tokens
            self._publish_queue()
            self._cond.notify()
        job.future.add_done_callback(lambda f: self._on_done(job, f))
        return job.future

    @staticmethod
    def _on_done(job: Job, future: asyncio.Future[dict[str, Any]]) -> None:
        if future.cancelled():
            job.abandoned = True

    def _retry_after(self) -> int:
        """Seconds until the queue has drained, from recent throughput (1 s at least, 60 at most)."""
        rate = self._tokens_per_second
        if rate <= 0:
            return 1
        return max(1, min(60, math.ceil(self._queued_tokens / rate)))

    def _publish_queue(self) -> None:
        if self.metrics is not None:
            self.metrics.set_queue(self._queued_texts, len(self._queue))

    # ------------------------------------------------------------------ worker thread
    def _take(self) -> list[Job]:
        """The oldest requests up to cycle_tokens tokens (at least one); called holding the lock."""
        taken: list[Job] = []
        tokens = 0
        while self._queue:
            job = self._queue[0]
            if taken and tokens + job.tokens > self.settings.cycle_tokens:
                break
            self._queue.popleft()
            self._queued_texts -= len(job.token_ids)
            self._queued_tokens -= job.tokens
            if job.abandoned:  # its client went away before its turn: nothing to compute
                if self.metrics is not None:
                    self.metrics.rejected.labels("abandoned").inc()
                continue
            taken.append(job)
            tokens += job.tokens
        self._publish_queue()
        return taken

    def _wait_for_work(self) -> None:
        """Block until a request is queued or the batcher stops; called holding the lock. After work, the
        first IDLE_TRIM_S without a request hands the freed heap pages back (outside the lock, so a request
        arriving meanwhile is queued at once)."""
        while not self._queue and not self._stopping:
            if not self._trimmer.pending:
                self._cond.wait()
                continue
            if self._cond.wait(IDLE_TRIM_S) or self._queue or self._stopping:
                continue  # woken: work (or a stop) came first
            self._cond.release()
            try:
                self._trimmer.trim_idle(time.monotonic())
            finally:
                self._cond.acquire()

    def _regather(self) -> None:
        """After a call that answered several requests, wait (within its regathering window) until they
        are queued again beside the requests that were already waiting when it ended, so the clients it
        answered share the next call with those; called holding the lock."""
        if self._last_call_jobs < 2:
            return
        start = time.monotonic()
        now = start
        while (
            len(self._queue) < self._regather_target
            and self._queued_tokens < self.settings.cycle_tokens
            and not self._stopping
            and now < self._regather_until
        ):
            self._cond.wait(self._regather_until - now)
            now = time.monotonic()
        self.regather_waited_s += now - start

    def _run(self) -> None:
        wait = self.settings.batch_wait_ms / 1000.0
        while True:
            with self._cond:
                self._wait_for_work()
                if not self._queue:
                    return  # stopping, and nothing left
                if wait > 0 and not self._stopping and self._queued_tokens < self.settings.cycle_tokens:
                    self._cond.wait(wait)  # let more requests join this call
                self._regather()
                jobs = self._take()
                self._in_flight_texts = sum(len(job.token_ids) for job in jobs)
            if jobs:
                started = time.monotonic()
                self._encode(jobs)
                ended = time.monotonic()
                share = self.settings.regather_share
                with self._cond:
                    # Counting only the answered ones would start the next call as soon as a few of them
                    # joined the requests that queued during this call, and leave the rest for a small call.
                    self._last_call_jobs = len(jobs)
                    self._regather_target = len(jobs) + len(self._queue)
                    self._regather_until = ended + min(share * (ended - started), REGATHER_MAX_S)
                self._trimmer.note_work()
            self._in_flight_texts = 0
            self._trimmer.maybe_trim(time.monotonic())

    def _encode(self, jobs: list[Job]) -> None:
        groups: dict[Outputs, list[Job]] = {}
        for job in jobs:
            groups.setdefault(job.outputs, []).append(job)
        for outputs, group in groups.items():
            token_ids = [ids for job in group for ids in job.token_ids]
            tokens = sum(job.tokens for job in group)
            start = time.perf_counter()
            try:
                with encoder_lock(self.encoder):
                    result = self._call(token_ids, outputs)
            except Exception as err:  # a failed call fails its requests, never the worker
                logger.exception("model call failed (%d inputs, %d tokens)", len(token_ids), tokens)
                for job in group:
                    _settle(job, error=err)
                continue
            seconds = time.perf_counter() - start
            if seconds > 0:
                self._tokens_per_second = tokens / seconds
            if self.metrics is not None:
                self.metrics.observe_batch(len(token_ids), tokens, seconds)
            offset = 0
            for job in group:
                n = len(job.token_ids)
                _settle(job, result=slice_result(result, offset, offset + n))
                offset += n


    def _encode_token_ids(self, token_ids: list[list[int]], outputs: Outputs) -> dict[str, Any]:
        result: dict[str, Any] = self.encoder.encode_token_ids(
            token_ids,
            self.settings.batch_size,
            return_dense=outputs[0],
            return_sparse=outputs[1],
            return_colbert_vecs=outputs[2],
        )
        return result


def _settle(job: Job, result: dict[str, Any] | None = None, error: BaseException | None = None) -> None:
    """Hand a result (or an error) to the request's future on its event loop, unless it was cancelled."""

    def apply() -> None:
        if job.future.done():
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result or {})

    # RuntimeError: the loop has closed, nobody is waiting any more.
    with contextlib.suppress(RuntimeError):
        job.loop.call_soon_threadsafe(apply)
