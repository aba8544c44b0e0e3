"""What the rerank routes do with a query and its texts: check the limits, build and tokenize the pairs as
FlagReranker does, queue them for the cross-encoder, wait for the scores.

The wire formats (TEI's `/rerank`, the Cohere-style `/v1/rerank` and `/v2/rerank`) are in routes_rerank.py;
the work and the limits are here, once. The pairs go through the same `Batcher` as the encoder's texts (its
own instance, with the cross-encoder as its model call), so concurrent rerank requests share model calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bgem3_embeddings._version import __version__
from bgem3_embeddings.concurrency import encoder_lock
from bgem3_embeddings.query_text import check_query
from bgem3_embeddings.serve.batcher import Batcher, ModelCall, Outputs
from bgem3_embeddings.serve.errors import ApiError, empty_input
from bgem3_embeddings.serve.service import (
    WARM_UP_TEXT,
    Receive,
    check_texts,
    off_loop,
    queue_and_wait,
)
from bgem3_embeddings.serve.settings import ServeSettings

# The batcher groups a call's requests by the outputs they asked for; a cross-encoder has one output.
RERANK_OUTPUTS: Outputs = (False, False, False)


def reranker_call(reranker: Any) -> ModelCall:
    """The batcher's model call for a reranker: the logits of the pairs' token ids, in order."""

    def call(token_ids: list[list[int]], outputs: Outputs) -> dict[str, Any]:
        return {"scores": np.asarray(reranker.score_token_ids(token_ids), dtype=np.float32)}

    return call


@dataclass
class Scored:
    """The cross-encoder's logits for a request's texts, in order, and each pair's token count."""

    logits: np.ndarray
    tokens: list[int]

    def ranked(self, normalize: bool, top_n: int | None = None) -> list[tuple[int, float]]:
        """(index, score) best first (a stable sort: equal scores keep the texts' order), the first top_n."""
        # The library's own sigmoid (FlagReranker's normalize=True), imported here: its module loads Keras,
        # which a served reranker has loaded already.
        from bgem3_embeddings.reranker.reranker import sigmoid

        scores = sigmoid(self.logits) if normalize else np.asarray(self.logits, dtype=np.float64)
        order = np.argsort(-scores, kind="stable")
        if top_n is not None:
            order = order[:top_n]
        return [(int(i), float(scores[i])) for i in order]


class RerankService:
    """The cross-encoder behind the rerank routes: limits, tokenization, the batcher, its description."""

    def __init__(
        self, reranker: Any, settings: ServeSettings, batcher: Batcher, name: str | None = None
    ) -> None:
        self.reranker = reranker
        self.settings = settings
        self.batcher = batcher
        self.model_name = name or str(getattr(reranker, "model_id", "bge-reranker-v2-m3"))
        self.ready = False

    @property
    def max_length(self) -> int:
        """The longest pair scored, in tokens (FlagReranker's max_length: longer pairs are cut)."""
        return int(self.reranker.max_length)

    def warm_up(self) -> None:
        """Trace the cross-encoder and read its fingerprint before serving (as EmbeddingService.warm_up)."""
        ids = self.reranker.tokenize_pairs([(WARM_UP_TEXT, WARM_UP_TEXT)])
        with encoder_lock(self.reranker):
            self.reranker.score_token_ids(ids)
        self.reranker.fingerprint()

    def info(self) -> dict[str, Any]:
        """The reranker as `/v1/bgem3/info` and `/info` describe it."""
        r = self.reranker
        return {
            "model": self.model_name,
            "model_id": str(getattr(r, "model_id", self.model_name)),
            "fingerprint": r.fingerprint(),
            "precision": getattr(r, "precision", None),
            "device": str(getattr(r, "device", None)),
            "max_input_length": self.max_length,
            "query_max_length": self.max_length * 3 // 4,
            "limits": self.settings.limits(),
            "version": __version__,
        }

    async def score(
        self, query: str, texts: list[str], *, truncate: bool, field: str, receive: Receive | None = None
    ) -> Scored:
        """The logits of (query, text) for each text, as `BGEM3Reranker.compute_score` gives them.

        truncate=False refuses (413) a pair longer than max_length tokens instead of cutting it (TEI's
        default); the pairs scored are then exactly the library's (a query past 3/4 of max_length is still
        cut there, as FlagReranker cuts it, when its pair fits)."""
        if not texts:
            raise empty_input(field)
        try:
            check_query(query)  # the rule every query follows, as BGEM3Reranker.rerank applies it
        except ValueError as err:  # empty: 400, as every empty text a user sends (service.check_texts)
            raise ApiError(400, str(err), param="query", tei_type="Empty") from err
        check_texts(self.settings, [query], "query")
        check_texts(self.settings, texts, field)
        pairs = [(query, text) for text in texts]
        chars = len(query) * len(texts) + sum(len(t) for t in texts)
        if not truncate:
            # Cut only at the model's positions: a pair that long is past max_length and refused anyway.
            whole = await self._tokenize(chars, pairs, int(self.reranker.config.max_sequence_length))
            for i, ids in enumerate(whole):
                if len(ids) > self.max_length:
                    raise ApiError(
                        413,
                        f"the pair of `query` and `{field}[{i}]` has {len(ids)} tokens, more than the "
                        f"reranker's max_input_length ({self.max_length}): shorten it or send truncate=true",
                        param="max_input_length",
                    )
        token_ids = await self._tokenize(chars, pairs, None)
        result = await queue_and_wait(self.batcher, token_ids, RERANK_OUTPUTS, receive)
        return Scored(np.asarray(result["scores"]), [len(ids) for ids in token_ids])

    async def _tokenize(
        self, chars: int, pairs: list[tuple[str, str]], max_length: int | None
    ) -> list[list[int]]:
        """The pairs' token ids (off the event loop for long requests); 422 for a pair the library refuses
        (a query that leaves no room for its passage)."""
        try:
            ids: list[list[int]] = await off_loop(chars, self.reranker.tokenize_pairs, pairs, max_length)
        except ValueError as err:
            raise ApiError(422, str(err), param="query") from err
        return ids
