"""What every route does with texts: check the limits, tokenize, queue for the encoder, wait for the result.

The routes differ only in their wire format; the work and the limits are here, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from bgem3_embeddings._version import __version__
from bgem3_embeddings.concurrency import encoder_lock
from bgem3_embeddings.query_text import cut_note, empty_text, is_blank, texts_cut_note, token_counts_if_cut
from bgem3_embeddings.serve.batcher import Batcher, BatcherStoppedError, Outputs, QueueFullError
from bgem3_embeddings.serve.errors import ApiError, empty_input
from bgem3_embeddings.serve.settings import ServeSettings

Receive = Any  # an ASGI receive callable

ALL_OUTPUTS: Outputs = (True, True, True)
WARM_UP_TEXT = "BGE-M3 warm-up"
# Requests this short (in characters) are tokenized on the event loop itself.
INLINE_TOKENIZE_CHARS = 2048
# /tokenize cuts nothing (as TEI's): a length no text within max_chars_per_input reaches.
UNTRUNCATED = 1 << 31
OUTPUT_NAMES = {"dense_vecs": "dense", "sparse_weights": "sparse", "colbert_vecs": "colbert"}
T = TypeVar("T")


async def off_loop(chars: int, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`: here for a short request (`chars` <= INLINE_TOKENIZE_CHARS: a thread hop costs more),
    else in a worker thread, so that the event loop keeps answering the other clients (/health) meanwhile."""
    if chars <= INLINE_TOKENIZE_CHARS:
        return fn(*args)
    return await anyio.to_thread.run_sync(fn, *args)


@dataclass
class Encoded:
    """An `encode_token_ids` result for the request's texts, in order, and each text's token count."""

    result: dict[str, Any]
    tokens: list[int]
    cut: dict[int, int] = dataclasses.field(default_factory=dict)
    """{index: its whole token count} for each text cut at the max length (`token_counts_if_cut`)."""

    def usage(self) -> dict[str, int]:
        total = sum(self.tokens)
        return {"prompt_tokens": total, "total_tokens": total}

    def cut_note(self, kept: int, what: str = "text") -> str | None:
        """One line saying which texts were cut and at how many tokens, or None when none was."""
        if not self.cut:
            return None
        if len(self.tokens) == 1:
            return cut_note(what, self.cut[0], kept)
        return texts_cut_note(self.cut, len(self.tokens), kept)


class EmbeddingService:
    """The encoder behind the routes: limits, tokenization, the batcher, the model's description."""

    def __init__(self, encoder: Any, settings: ServeSettings, batcher: Batcher) -> None:
        self.encoder = encoder
        self.settings = settings
        self.batcher = batcher
        self.model_name = settings.model_name or str(getattr(encoder, "model_id", "bge-m3"))
        self.ready = False
        self._tokenizer_spec: dict[str, Any] | None = None

    # ------------------------------------------------------------------ the model
    @property
    def max_positions(self) -> int:
        """The longest input the model takes (8192 tokens for BGE-M3)."""
        return int(self.encoder.config.max_sequence_length)

    def warm_up(self) -> None:
        """Trace the output combinations the routes use and read the fingerprint, before serving.

        A server lives long: its first requests should not pay for graph tracing, and the encoder's
        eager first batches (a start-up saving for one-shot commands) would only be slower here.
        """
        if hasattr(self.encoder, "eager_batches_left"):
            self.encoder.eager_batches_left = 0
        ids = self.encoder.tokenize([WARM_UP_TEXT], 32)
        available = getattr(self.encoder, "available_outputs", tuple(OUTPUT_NAMES))
        combinations = [
            tuple(name in available and wanted for name, wanted in zip(OUTPUT_NAMES, outputs, strict=True))
            for outputs in ((True, False, False), (False, True, False), ALL_OUTPUTS)
        ]
        with encoder_lock(self.encoder):
            for dense, sparse, colbert in dict.fromkeys(c for c in combinations if any(c)):
                self.encoder.encode_token_ids(
                    ids, return_dense=dense, return_sparse=sparse, return_colbert_vecs=colbert
                )
        self.encoder.fingerprint()

    def info(self) -> dict[str, Any]:
        """What a client needs to know about the model and the limits (`/v1/bgem3/info`)."""
        enc = self.encoder
        return {
            "model": self.model_name,
            "model_id": str(getattr(enc, "model_id", self.model_name)),
            "fingerprint": enc.fingerprint(),
            "hidden_size": int(enc.hidden_size),
            "vocab_size": int(enc.config.vocab_size),
            "precision": getattr(enc, "precision", None),
            "compute_dtype": getattr(enc, "compute_dtype", None),
            "max_input_length": self.max_positions,
            "query_max_length": int(enc.query_max_length),
            "passage_max_length": int(enc.passage_max_length),
            "outputs": [OUTPUT_NAMES[name] for name in getattr(enc, "available_outputs", OUTPUT_NAMES)],
            "limits": self.settings.limits(),
            "version": __version__,
        }

    def tokenizer_spec(self) -> dict[str, Any]:
        """The tokenizer as built from the checkpoint (`/v1/bgem3/tokenizer`): a client chunks with it."""
        if self._tokenizer_spec is None:
            tok = self.encoder.tokenizer
            self._tokenizer_spec = {
                "tokenizer": tok.backend_tokenizer.to_str(),
                "special_tokens": dict(tok.special_tokens),
                "model_max_length": int(tok.model_max_length),
                "clean_up_tokenization_spaces": bool(tok.clean_up_tokenization_spaces),
            }
        return self._tokenizer_spec

    # ------------------------------------------------------------------ limits
    def check_texts(self, texts: list[str], field: str) -> None:
        """413 naming the limit when there are too many texts or one is too long."""
        check_texts(self.settings, texts, field)

    def check_outputs(self, outputs: Outputs) -> None:
        """422 naming an output whose head this server's checkpoint lacks."""
        available = getattr(self.encoder, "available_outputs", tuple(OUTPUT_NAMES))
        for name, wanted in zip(OUTPUT_NAMES, outputs, strict=True):
            if wanted and name not in available:
                raise ApiError(
                    422,
                    f"this server's checkpoint has no {OUTPUT_NAMES[name]} head: ask for the outputs "
                    f"/v1/bgem3/info lists",
                    param=f"return_{OUTPUT_NAMES[name]}",
                )

    def max_length(self, requested: int | None, default: int) -> int:
        """The truncation length: the request's, else `default`, capped at the model's positions."""
        return min(requested if requested is not None else default, self.max_positions)

    async def token_spans(self, texts: list[str], field: str = "inputs") -> list[list[Any]]:
        """Each text's tokens with <s> ... </s> and their character spans (`BGEM3Tokenizer.token_spans`),
        untruncated, within the request limits; long requests are tokenized off the event loop."""
        if not texts:
            raise empty_input(field)
        self.check_texts(texts, field)
        chars = sum(len(t) for t in texts)
        return list(await off_loop(chars, self.encoder.tokenizer.token_spans, texts, UNTRUNCATED))

    # ------------------------------------------------------------------ encoding
    async def encode(
        self,
        texts: list[str],
        outputs: Outputs,
        max_length: int,
        *,
        receive: Receive | None = None,
        truncate: bool = True,
        field: str = "input",
    ) -> Encoded:
        """Tokenize, queue and wait; `receive` (the request's) lets a client that leaves cancel its work.

        truncate=False refuses (413) a text longer than the model takes instead of cutting it (TEI); an empty
        list is refused (400), as OpenAI's API and TEI refuse it.
        """
        if not texts:
            raise empty_input(field)
        self.check_texts(texts, field)
        self.check_outputs(outputs)
        limit = max_length if truncate else self.max_positions + 1
        if sum(len(t) for t in texts) <= INLINE_TOKENIZE_CHARS:
            token_ids = self.encoder.tokenize(texts, limit)  # microseconds: cheaper than a thread hop
        else:
            # Off the event loop: a long request's tokenization must not hold up the others' answers.
            token_ids = await anyio.to_thread.run_sync(self.encoder.tokenize, texts, limit)
        if not truncate:
            for i, ids in enumerate(token_ids):
                if len(ids) > self.max_positions:
                    raise ApiError(
                        413,
                        f"`{field}[{i}]` is longer than the model's max_input_length ({self.max_positions} "
                        "tokens): shorten it or send truncate=true",
                        param="max_input_length",
                    )
        encoded = await self.encode_token_ids(token_ids, outputs, receive=receive)
        encoded.cut = await self._cut_counts(texts, token_ids, limit)
        return encoded

    async def _cut_counts(self, texts: list[str], token_ids: list[list[int]], limit: int) -> dict[int, int]:
        """{index: whole token count} of the texts cut at `limit`: only a text that reached the limit can
        have been cut, so only those (rare) are tokenized again, whole, off the event loop."""
        full = [i for i, ids in enumerate(token_ids) if len(ids) >= limit]
        if not full:
            return {}
        counts = await anyio.to_thread.run_sync(
            token_counts_if_cut, self.encoder.tokenizer, [texts[i] for i in full], limit
        )
        return {full[j]: n for j, n in counts.items()}

    async def encode_token_ids(
        self, token_ids: list[list[int]], outputs: Outputs, *, receive: Receive | None = None
    ) -> Encoded:
        """Queue texts tokenized already (within the limits) for the encoder and wait for the result."""
        result = await queue_and_wait(self.batcher, token_ids, outputs, receive)
        return Encoded(result, [len(ids) for ids in token_ids])


def check_texts(settings: ServeSettings, texts: list[str], field: str) -> None:
    """413 naming the limit when there are too many texts or one is too long; 400 naming an empty one (the
    rule every text a user sends follows, query_text.is_blank; as OpenAI's API and TEI refuse it)."""
    limit = settings.max_inputs_per_request
    if len(texts) > limit:
        raise ApiError(
            413,
            f"{len(texts)} inputs in `{field}`, more than max_inputs_per_request ({limit}): "
            "split them over several requests",
            param="max_inputs_per_request",
        )
    chars = settings.max_chars_per_input
    for i, text in enumerate(texts):
        if is_blank(text):
            raise ApiError(400, empty_text(f"`{field}[{i}]`"), param=field, tei_type="Empty")
        if len(text) > chars:
            raise ApiError(
                413,
                f"`{field}[{i}]` has {len(text)} characters, more than max_chars_per_input ({chars}): "
                "split the text",
                param="max_chars_per_input",
            )


async def queue_and_wait(
    batcher: Batcher, token_ids: list[list[int]], outputs: Outputs, receive: Receive | None
) -> dict[str, Any]:
    """Queue tokenized inputs on `batcher` and wait for their rows of the model's result (503 with
    Retry-After when the queue is full or the server stops; 499 when the client leaves first)."""
    try:
        future = batcher.submit(token_ids, outputs)
    except QueueFullError as err:
        raise ApiError(
            503, str(err), param="max_queued_texts", headers={"Retry-After": str(err.retry_after)}
        ) from err
    except BatcherStoppedError as err:
        raise ApiError(503, str(err), headers={"Retry-After": "1"}) from err
    return await _wait(future, receive)


async def _wait(future: asyncio.Future[dict[str, Any]], receive: Receive | None) -> dict[str, Any]:
    """The future's result; if the client disconnects first, cancel it (its texts leave the queue)."""
    if receive is None:
        return await future
    gone: asyncio.Future[Any] = asyncio.ensure_future(_disconnected(receive))
    waiting: set[asyncio.Future[Any]] = {future, gone}
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not gone.done():
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone
    if not future.done():
        future.cancel()
        raise ApiError(499, "the client closed the request")
    return future.result()


def embedding_service(request: Any) -> EmbeddingService:
    """The embedding model's service of the request's app; 404 naming the option when the server was
    started with a reranker only."""
    service: EmbeddingService | None = request.app.state.service
    if service is None:
        raise ApiError(
            404,
            f"this server has no embedding model, only a reranker ({request.url.path} needs one): start "
            "`bgem3 serve` with --model BAAI/bge-m3 beside --reranker, or use /rerank",
            param="model",
        )
    return service


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone (the request body was read already)."""
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return
