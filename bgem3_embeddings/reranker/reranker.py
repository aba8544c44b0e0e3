"""BGEM3Reranker: a drop-in for FlagEmbedding's FlagReranker, running bge-reranker-v2-m3 in Keras.

    >>> from bgem3_embeddings import BGEM3Reranker  # instead of: from FlagEmbedding import FlagReranker
    >>> reranker = BGEM3Reranker("BAAI/bge-reranker-v2-m3")  # doctest: +SKIP
    >>> pairs = [("what is a panda?", "hi"), ("what is a panda?", "The giant panda is a bear.")]
    >>> reranker.compute_score(pairs, normalize=True)  # a list of floats in (0, 1)  # doctest: +SKIP
    >>> reranker.rerank("what is a panda?", ["hi", "The giant panda is a bear."], top_n=1)  # doctest: +SKIP
    [(index of the best document, its score)]

A cross-encoder reads the query and a passage together and gives one relevance logit per pair; it orders a
retriever's top candidates (docs/rerank.md). The reranker holds its model and tokenizer and nothing global.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bgem3_embeddings.backends import make_runner
from bgem3_embeddings.batching import PADDING_SIDES, length_sorted_batches, pad_batch
from bgem3_embeddings.checkpoint.files import CheckpointFiles, resolve_checkpoint
from bgem3_embeddings.checkpoint.fingerprint import checkpoint_fingerprint
from bgem3_embeddings.devices import DeviceChoice, DeviceInventory, resolve_placement
from bgem3_embeddings.query_text import check_query
from bgem3_embeddings.reranker import DEFAULT_MAX_LENGTH, DEFAULT_RERANKER_ID
from bgem3_embeddings.reranker.loading import build_reranker_model, reranker_config
from bgem3_embeddings.reranker.model import SCORES, BGEM3RerankerModel
from bgem3_embeddings.reranker.pairs import (
    check_documents,
    check_max_length,
    check_pairs,
    pair_token_ids,
)
from bgem3_embeddings.tokenizer import BGEM3Tokenizer

logger = logging.getLogger(__name__)

# FlagReranker's default.
DEFAULT_BATCH_SIZE = 128
# Padded tokens per batch (batch size x longest pair), as the encoder's default: 32 pairs of 256 tokens.
DEFAULT_MAX_TOKENS_PER_BATCH = 8192
# A progress bar by default only for more pairs than this.
PROGRESS_MIN_PAIRS = 512


def _check_batch_size(batch_size: Any, name: str = "batch_size") -> int:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"{name} must be a positive int, got {batch_size!r}")
    return batch_size


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) in float64, as FlagEmbedding's `sigmoid` of each score (0.0 and 1.0 at the ends)."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-np.asarray(logits, dtype=np.float64)))


class _Int8Runner:
    """int8.Int8Runner (the TFLite flatbuffer, XNNPACK) behind the runners' interface."""

    def __init__(self, run: Any) -> None:
        self._run = run

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray, outputs: tuple[str, ...]) -> dict:
        return dict(self._run(input_ids, attention_mask, outputs))

    def trace_count(self) -> int:
        return 0

    def is_out_of_memory(self, error: BaseException) -> bool:
        return False


def _int8_runner(
    files: CheckpointFiles,
    device: DeviceChoice,
    weights_cache: bool | str | Path | None,
    config: Any,
    padding_side: str,
) -> Any:
    """precision="int8" as the encoder has it (bgem3_embeddings/backends/tensorflow/int8.py): the float32
    reranker converted once to a dynamic-range int8 TFLite flatbuffer, cached beside the converted weights,
    then mapped."""
    from bgem3_embeddings.backends.keras_backend import require_tensorflow
    from bgem3_embeddings.backends.portable.sub_batches import exact_length_splitter
    from bgem3_embeddings.backends.tensorflow.int8 import Int8Runner, ensure_int8_model
    from bgem3_embeddings.checkpoint.converted import resolve_cache_dir

    require_tensorflow("precision='int8' (TFLite with XNNPACK)")

    def build_float32() -> BGEM3RerankerModel:
        return build_reranker_model(files, precision="float32", device=device, weights_cache=weights_cache)

    flatbuffer = ensure_int8_model(files, build_float32, resolve_cache_dir(weights_cache))
    # pairs of mixed lengths split as the float runners split them on the CPU
    # (backends/portable/sub_batches.py)
    splitter = exact_length_splitter(config.hidden_size, BGEM3RerankerModel.OUTPUT_LAYOUT, padding_side)
    return _Int8Runner(Int8Runner(flatbuffer, splitter=splitter))


class BGEM3Reranker:
    """Relevance scores of (query, passage) pairs from a cross-encoder, FlagReranker-compatible.

    Args:
        model_name_or_path: hub id (default BAAI/bge-reranker-v2-m3) or a local checkpoint folder holding an
            XLMRobertaForSequenceClassification with one label.
        precision: "auto" (fp16 on CUDA, fp32 elsewhere), "float32", "bfloat16" or "float16": the
            weights' dtype, as BGEM3Encoder takes it; or "int8" (CPU, TensorFlow): int8 weights and
            dynamically quantized activations through TFLite/XNNPACK, converted once (int8.py).
        compute_dtype: the matmuls' dtype, as BGEM3Encoder takes it ("auto": float32 on a CPU without
            native bf16/fp16).
        device: "auto", "cpu", "gpu", "cuda", "metal" or "/GPU:N".
        batch_size: pairs per batch (FlagReranker's default 128).
        max_length: tokens per pair (FlagReranker's default 512); the query keeps at most 3/4 of it.
        max_tokens_per_batch: also cap batch size x padded length (None: no cap): bounded memory.
        cache_dir, revision, local_files_only: passed to huggingface_hub.
        padding_side: "right" (as the reference pads) or "left"; the scores are the same either way.
        weights_cache: the converted-weights cache, as BGEM3Encoder takes it.
        show_progress: None = a progress bar only for many pairs; True / False forces it.
    """

    def __init__(
        self,
        model_name_or_path: str | Path = DEFAULT_RERANKER_ID,
        *,
        precision: str = "auto",
        compute_dtype: str = "auto",
        device: str = "auto",
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_length: int = DEFAULT_MAX_LENGTH,
        max_tokens_per_batch: int | None = DEFAULT_MAX_TOKENS_PER_BATCH,
        cache_dir: str | Path | None = None,
        revision: str | None = None,
        local_files_only: bool = False,
        padding_side: str = "right",
        weights_cache: bool | str | Path | None = True,
        show_progress: bool | None = None,
        device_inventory: DeviceInventory | None = None,
    ) -> None:
        if padding_side not in PADDING_SIDES:
            raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        self.batch_size = _check_batch_size(batch_size)
        if max_tokens_per_batch is not None:
            _check_batch_size(max_tokens_per_batch, "max_tokens_per_batch")
        check_max_length(max_length)
        inventory = device_inventory or DeviceInventory.detect()
        self.device, self.precision, self.compute_dtype = resolve_placement(
            device, precision, compute_dtype, inventory
        )
        self.model_id = str(model_name_or_path)
        self.files = resolve_checkpoint(
            model_name_or_path,
            revision=revision,
            cache_dir=cache_dir,
            local_files_only=local_files_only,
            kind="reranker",  # `tiny`: the tiny random cross-encoder
        )
        self.config = reranker_config(self.files)  # a wrong or broken config.json is named before anything
        self.tokenizer = BGEM3Tokenizer.from_dir(self.files.root)
        self.max_length = self._resolve_max_length(max_length)
        # The Keras model; None with precision "int8", where its TFLite flatbuffer runs instead.
        self.model: BGEM3RerankerModel | None = None
        self.runner: Any
        if self.precision == "int8":
            self.runner = _int8_runner(self.files, self.device, weights_cache, self.config, padding_side)
        else:
            self.model = build_reranker_model(
                self.files,
                precision=self.precision,
                compute_dtype=self.compute_dtype,
                device=self.device,
                weights_cache=weights_cache,
            )
            self.runner = make_runner(self.model, self.device, padding_side=padding_side)
        self.max_tokens_per_batch = max_tokens_per_batch
        self.padding_side = padding_side
        self.show_progress = show_progress
        self._fingerprint: str | None = None

    def fingerprint(self) -> str:
        """The checkpoint's fingerprint (config, tokenizer, sampled weights): the same for every precision
        and for a copy of the same files (`bgem3_embeddings.checkpoint.fingerprint`)."""
        if self._fingerprint is None:
            self._fingerprint = checkpoint_fingerprint(self.files)
        return self._fingerprint

    def _resolve_max_length(self, max_length: int | None) -> int:
        length = check_max_length(self.max_length if max_length is None else max_length)
        limit = self.config.max_sequence_length
        if length > limit:
            logger.info("max_length %d exceeds the model's %d positions: using %d", length, limit, limit)
            length = limit
        return length

    # ---------------------------------------------------------------- scoring
    def tokenize_pairs(
        self, pairs: Sequence[tuple[str, str]], max_length: int | None = None
    ) -> list[list[int]]:
        """Token ids of each (query, passage) pair as FlagReranker builds them (reranker/pairs.py),
        unpadded: `<s> query </s></s> passage </s>`, at most max_length (default: the reranker's)."""
        checked, single = check_pairs(pairs)
        if single:
            raise TypeError("tokenize_pairs takes a list of (query, passage) pairs, got one pair")
        return pair_token_ids(self.tokenizer, checked, self._resolve_max_length(max_length))

    def score_token_ids(
        self, token_ids: Sequence[Sequence[int]], batch_size: int | None = None
    ) -> np.ndarray:
        """Logits (float32, input order) of pairs already tokenized by `tokenize_pairs`.

        Pairs are length-sorted and batched (at most batch_size pairs and max_tokens_per_batch padded
        tokens a batch); a batch that runs out of device memory is retried in halves.
        """
        size = _check_batch_size(batch_size if batch_size is not None else self.batch_size)
        ids = [list(t) for t in token_ids]
        limit = self.config.max_sequence_length
        for i, row in enumerate(ids):
            if not 0 < len(row) <= limit:
                raise ValueError(f"token_ids[{i}] has {len(row)} tokens: a pair needs 1 to {limit}")
        scores = np.zeros(len(ids), dtype=np.float32)
        queue = length_sorted_batches([len(t) for t in ids], size, self.max_tokens_per_batch)
        show = self.show_progress if self.show_progress is not None else len(ids) > PROGRESS_MIN_PAIRS
        from tqdm.auto import tqdm

        with tqdm(total=len(ids), unit="pair", desc="rerank", disable=not show) as bar:
            while queue:
                indices = queue.pop(0)
                input_ids, mask = pad_batch(
                    [ids[i] for i in indices], self.config.pad_token_id, self.padding_side
                )
                try:
                    out = self.runner.run(input_ids, mask, (SCORES,))
                except Exception as err:
                    if len(indices) == 1 or not self.runner.is_out_of_memory(err):
                        raise
                    half = len(indices) // 2
                    logger.warning("out of memory at batch %d x %d: retrying in halves", *input_ids.shape)
                    queue[:0] = [indices[:half], indices[half:]]
                    continue
                scores[indices] = out[SCORES]
                bar.update(len(indices))
        return scores

    def compute_score(
        self,
        sentence_pairs: Sequence[tuple[str, str]] | tuple[str, str],
        normalize: bool = False,
        batch_size: int | None = None,
        max_length: int | None = None,
    ) -> list[float] | float:
        """FlagReranker.compute_score: one score per (query, passage) pair, the logit or, with `normalize`,
        its sigmoid. A list of pairs gives a list; one pair (a 2-sequence of str) gives a float."""
        pairs, single = check_pairs(sentence_pairs)
        if not pairs:
            return []
        logits = self.score_token_ids(self.tokenize_pairs(pairs, max_length), batch_size)
        values = sigmoid(logits) if normalize else logits.astype(np.float64)
        scores = [float(v) for v in values]
        return scores[0] if single else scores

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        top_n: int | None = None,
        normalize: bool = False,
        batch_size: int | None = None,
        max_length: int | None = None,
    ) -> list[tuple[int, float]]:
        """(index in `documents`, score) of the documents, best first (equal scores keep input order);
        the first `top_n` only when given. The query must hold text (query_text.check_query)."""
        check_query(query)
        passages = check_documents(documents)
        if top_n is not None:
            _check_batch_size(top_n, "top_n")
        if not passages:
            return []
        scores = self.compute_score([(query, p) for p in passages], normalize, batch_size, max_length)
        assert isinstance(scores, list)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        return [(i, scores[i]) for i in order[:top_n]]
