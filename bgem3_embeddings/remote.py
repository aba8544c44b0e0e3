"""`RemoteEncoder`: the BGEM3Encoder API, encoding through a running `bgem3 serve` (no TensorFlow here).

    from bgem3_embeddings.remote import RemoteEncoder

    enc = RemoteEncoder("http://127.0.0.1:8000", api_key=None)
    out = enc.encode_queries(["What is BGE M3?"], return_sparse=True, return_colbert_vecs=True)
    out["dense_vecs"], out["lexical_weights"], out["colbert_vecs"]   # as BGEM3Encoder returns them

It answers what the integrations ask of an encoder: `encode`, `encode_queries`, `encode_corpus`,
`compute_score`, `tokenizer` (the server's own, rebuilt here from `/v1/bgem3/tokenizer` for chunking),
`hidden_size`, `fingerprint()` (the server model's, so a collection's "one model" check holds),
`model_id`, `precision`. Numbers travel as base64 float32: the same values the server computed.
Importing this module imports httpx, numpy and tokenizers only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np

from bgem3_embeddings.cli_support import CommandError
from bgem3_embeddings.explain.decompose import check_texts
from bgem3_embeddings.explain.result import Explanation, check_weights
from bgem3_embeddings.m3_api import M3EncodeAPI
from bgem3_embeddings.scoring import DEFAULT_MODE_WEIGHTS
from bgem3_embeddings.serve.wire import read_colbert, read_dense

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 600.0  # a large batch of long passages on a CPU takes minutes
# Texts per request; fewer than the server's max_inputs_per_request when that is smaller.
REQUEST_TEXTS = 256
RETRIES_ON_BUSY = 8  # 503 answers (queue full, starting) retried after their Retry-After


class RemoteEncoderError(CommandError):
    """The server could not be reached, refused the request, or answered something unexpected.

    A CommandError: commands print its message as one line.
    """


def _texts(sentences: Any) -> tuple[list[str], bool]:
    """(texts, was_single_str), with BGEM3Encoder's TypeErrors for anything else."""
    if isinstance(sentences, str):
        return [sentences], True
    if sentences is None or not isinstance(sentences, Sequence):
        raise TypeError(f"sentences must be a str or a list of str, got {type(sentences).__name__}")
    texts = list(sentences)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"sentences[{i}] must be a str, got {type(text).__name__}: {text!r:.60}")
    return texts, False


class RemoteEncoder(M3EncodeAPI):
    """An encoder whose model runs in a `bgem3 serve` process (see the module docstring).

    Args:
        base_url: the server, e.g. "http://127.0.0.1:8000".
        api_key: the server's --api-key, sent as a Bearer token.
        timeout: seconds per request.
    """

    # Calls from several threads need no lock: the server batches concurrent requests itself
    # (`bgem3_embeddings.concurrency.encoder_lock` reads this).
    concurrent_calls = True

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http:// or https:// URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)
        self._info: dict[str, Any] | None = None
        self._tokenizer: Any = None

    # ------------------------------------------------------------------ HTTP
    def _request(self, method: str, path: str, body: Any = None) -> Any:
        for attempt in range(RETRIES_ON_BUSY + 1):
            try:
                response = self._client.request(method, path, json=body)
            except httpx.HTTPError as err:
                raise RemoteEncoderError(
                    f"cannot reach the encoder server at {self.base_url} ({type(err).__name__}: {err}): "
                    "start it with `bgem3 serve --model MODEL` or check the URL"
                ) from err
            if response.status_code == 503 and attempt < RETRIES_ON_BUSY:
                wait = float(response.headers.get("Retry-After", "1") or 1)
                logger.info("encoder server busy (503): retrying in %.0f s", wait)
                time.sleep(min(wait, 30.0))
                continue
            if response.status_code != 200:
                raise RemoteEncoderError(self._error_text(path, response))
            return response.json()
        raise AssertionError("unreachable")  # pragma: no cover

    def _error_text(self, path: str, response: httpx.Response) -> str:
        try:
            error = response.json().get("error")
            message = error.get("message") if isinstance(error, dict) else error
        except ValueError:
            message = response.text[:200]
        if response.status_code == 401:
            return f"the encoder server at {self.base_url} refused the API key ({message}): pass its key"
        return f"the encoder server at {self.base_url} answered {response.status_code} on {path}: {message}"

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RemoteEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the model
    @property
    def info(self) -> dict[str, Any]:
        """The server's `/v1/bgem3/info` (read once)."""
        if self._info is None:
            self._info = self._request("GET", "/v1/bgem3/info")
        return self._info

    @property
    def model_id(self) -> str:
        return str(self.info["model"])

    @property
    def hidden_size(self) -> int:
        return int(self.info["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.info["vocab_size"])

    @property
    def precision(self) -> str | None:
        return self.info.get("precision")

    @property
    def query_max_length(self) -> int:
        return int(self.info["query_max_length"])

    @property
    def passage_max_length(self) -> int:
        return int(self.info["passage_max_length"])

    @property
    def config(self) -> SimpleNamespace:
        """The sizes integrations read from `encoder.config`."""
        return SimpleNamespace(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            max_sequence_length=int(self.info["max_input_length"]),
        )

    def fingerprint(self) -> str:
        """The server checkpoint's fingerprint (`BGEM3Encoder.fingerprint` of the same files)."""
        return str(self.info["fingerprint"])

    @property
    def tokenizer(self) -> Any:
        """The server's tokenizer (`BGEM3Tokenizer`), fetched on first use: chunking needs it, search not."""
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            from bgem3_embeddings.tokenizer import BGEM3Tokenizer

            spec = self._request("GET", "/v1/bgem3/tokenizer")
            self._tokenizer = BGEM3Tokenizer(
                Tokenizer.from_str(spec["tokenizer"]),
                spec["special_tokens"],
                model_max_length=int(spec["model_max_length"]),
                clean_up_tokenization_spaces=bool(spec["clean_up_tokenization_spaces"]),
            )
        return self._tokenizer

    def tokenize(self, texts: list[str], max_length: int) -> list[list[int]]:
        return self.tokenizer.encode_batch(texts, max_length) if texts else []

    # ------------------------------------------------------------------ encode
    def _chunks(self, texts: list[str]) -> list[list[str]]:
        """Requests within the server's limits on inputs and body size."""
        limits = self.info.get("limits", {})
        per_request = min(REQUEST_TEXTS, int(limits.get("max_inputs_per_request", REQUEST_TEXTS)))
        # JSON may write one character as 4 bytes or more (UTF-8, escapes): a quarter of the body limit.
        budget = int(limits.get("max_body_bytes", 16 * 1024 * 1024)) // 4
        chunks: list[list[str]] = []
        current: list[str] = []
        size = 0
        for text in texts:
            if current and (len(current) >= per_request or size + len(text) > budget):
                chunks.append(current)
                current, size = [], 0
            current.append(text)
            size += len(text)
        if current:
            chunks.append(current)
        return chunks

    def encode(
        self,
        sentences: str | Sequence[str],
        batch_size: int | None = None,
        max_length: int | None = None,
        return_dense: bool = True,
        return_sparse: bool = False,
        return_colbert_vecs: bool = False,
    ) -> dict[str, Any]:
        """BGEM3Encoder.encode through the server (batch_size is the server's business and is ignored)."""
        texts, single = _texts(sentences)
        if max_length is not None and (not isinstance(max_length, int) or max_length < 2):
            raise ValueError(f"max_length must be an int >= 2 (room for <s> and </s>), got {max_length!r}")
        length = max_length if max_length is not None else self.passage_max_length
        dense: list[np.ndarray] = []
        lexical: list[dict[str, float]] = []
        colbert: list[np.ndarray] = []
        for chunk in self._chunks(texts):
            answer = self._request(
                "POST",
                "/v1/bgem3/encode",
                {
                    "input": chunk,
                    "return_dense": return_dense,
                    "return_sparse": return_sparse,
                    "return_colbert_vecs": return_colbert_vecs,
                    "max_length": length,
                    "encoding_format": "base64",
                },
            )
            for item in sorted(answer["data"], key=lambda d: d["index"]):
                if return_dense:
                    dense.append(read_dense(item["dense_vecs"]))
                if return_sparse:
                    lexical.append({str(k): float(v) for k, v in item["lexical_weights"].items()})
                if return_colbert_vecs:
                    colbert.append(read_colbert(item))
        empty = np.zeros((0, self.hidden_size), np.float32)
        result: dict[str, Any] = {
            "dense_vecs": (np.stack(dense) if dense else empty) if return_dense else None,
            "lexical_weights": lexical if return_sparse else None,
            "colbert_vecs": colbert if return_colbert_vecs else None,
        }
        if single:
            result = {k: (v[0] if v is not None else None) for k, v in result.items()}
        return result

    def compute_score(
        self,
        sentence_pairs: Sequence[tuple[str, str]] | tuple[str, str],
        batch_size: int | None = None,
        max_query_length: int | None = None,
        max_passage_length: int | None = None,
        weights_for_different_modes: Sequence[float] | None = None,
    ) -> dict[str, Any]:
        """BGEM3Encoder.compute_score, computed by the server (`/v1/bgem3/score`)."""
        single = len(sentence_pairs) == 2 and all(isinstance(x, str) for x in sentence_pairs)
        pairs = [list(sentence_pairs)] if single else [list(p) for p in sentence_pairs]
        body: dict[str, Any] = {"sentence_pairs": pairs}
        if weights_for_different_modes is not None:
            body["weights_for_different_modes"] = [float(w) for w in weights_for_different_modes]
        if max_query_length is not None:
            body["max_query_length"] = max_query_length
        if max_passage_length is not None:
            body["max_passage_length"] = max_passage_length
        scores: dict[str, list[float]] = self._request("POST", "/v1/bgem3/score", body)["scores"]
        return {k: v[0] for k, v in scores.items()} if single else scores

    def explain_many(
        self,
        query: str,
        passages: Sequence[str],
        *,
        weights: Sequence[float] = DEFAULT_MODE_WEIGHTS,
        colbert_matrix: bool = False,
        max_query_length: int | None = None,
        max_passage_length: int | None = None,
    ) -> list[Explanation]:
        """BGEM3Encoder.explain_many, computed by the server (`/v1/bgem3/explain`): the same Explanations."""
        check_texts(query, passages)  # the local encoder's ValueError / TypeError, before any request
        body: dict[str, Any] = {
            "query": query,
            "passages": list(passages),
            "weights_for_different_modes": list(check_weights(weights)),
            "colbert_matrix": colbert_matrix,
        }
        if max_query_length is not None:
            body["max_query_length"] = max_query_length
        if max_passage_length is not None:
            body["max_passage_length"] = max_passage_length
        answer = self._request("POST", "/v1/bgem3/explain", body)
        return [Explanation.from_dict(item) for item in sorted(answer["data"], key=lambda d: d["index"])]

    def convert_id_to_token(self, lexical_weights: dict | Sequence[dict]) -> dict | list[dict]:
        """{token_id: weight} -> {token text: weight}; one dict in, one dict out."""
        single = isinstance(lexical_weights, dict)
        items: list[dict] = [lexical_weights] if isinstance(lexical_weights, dict) else list(lexical_weights)
        converted = [{self.tokenizer.decode([int(i)]): w for i, w in item.items()} for item in items]
        return converted[0] if single else converted
