"""BGEM3Encoder: a drop-in for FlagEmbedding's BGEM3FlagModel, running the Keras model.

    >>> from bgem3_embeddings import BGEM3Encoder  # instead of: from FlagEmbedding import BGEM3FlagModel
    >>> model = BGEM3Encoder("BAAI/bge-m3")  # doctest: +SKIP
    >>> out = model.encode(["What is BGE M3?"], return_sparse=True, return_colbert_vecs=True)
    >>> out["dense_vecs"].shape, out["lexical_weights"][0], out["colbert_vecs"][0].shape   # doctest: +SKIP

The encoder holds its model and tokenizer and nothing global: build one per Ray actor or Spark task.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bgem3_embeddings.backends import make_runner
from bgem3_embeddings.backends.keras_backend import require_tensorflow
from bgem3_embeddings.backends.portable.sub_batches import exact_length_splitter
from bgem3_embeddings.backends.tensorflow.int8 import Int8Runner, ensure_int8_model
from bgem3_embeddings.batching import PADDING_SIDES, length_sorted_batches, pad_batch
from bgem3_embeddings.checkpoint.converted import resolve_cache_dir
from bgem3_embeddings.checkpoint.files import DEFAULT_MODEL_ID, resolve_checkpoint
from bgem3_embeddings.checkpoint.fingerprint import checkpoint_fingerprint
from bgem3_embeddings.config import BGEM3Config
from bgem3_embeddings.devices import DeviceInventory, resolve_placement
from bgem3_embeddings.explain.decompose import explain_outputs, prepare
from bgem3_embeddings.explain.result import Explanation, check_weights
from bgem3_embeddings.loading import build_model, check_heads, model_config
from bgem3_embeddings.m3_api import M3EncodeAPI
from bgem3_embeddings.model import BGEM3Model
from bgem3_embeddings.outputs import colbert_vecs_from_batch, lexical_weights_from_batch
from bgem3_embeddings.scoring import (
    DEFAULT_MODE_WEIGHTS,
    FLAGEMBEDDING_WEIGHTS,
    colbert_score,
    combine_scores,
    lexical_matching_score,
)
from bgem3_embeddings.tokenizer import BGEM3Tokenizer

logger = logging.getLogger(__name__)

# A new encoder runs its first few short batches (at most this many padded tokens) eagerly, op by op:
# no graph to trace and optimise, so a process that encodes one query (`bgem3-qdrant search`) gets its
# vector in 0.5 s instead of 1.2-1.3 s (full size, 2-vCPU EPYC, docs/performance.md). An eager short batch
# costs ~0.3 s against ~0.1 s traced (per-op dispatch), so after EAGER_BATCHES of them a long-lived
# encoder pays the trace once and runs traced from then on.
DEFAULT_EAGER_MAX_TOKENS = 64
DEFAULT_EAGER_BATCHES = 3
# Default token budget of a batch (batch size x padded length); the bench measured its throughput.
DEFAULT_MAX_TOKENS_PER_BATCH = 8192
# Progress bars appear by default only when there are more texts than this.
PROGRESS_MIN_TEXTS = 512
OUTPUT_KEYS = {
    "dense_vecs": "dense_vecs",
    "sparse_weights": "lexical_weights",
    "colbert_vecs": "colbert_vecs",
}


def _validate_sentences(sentences: Any) -> tuple[list[str], bool]:
    """Returns (texts, was_single_str); raises TypeError naming what is wrong."""
    if isinstance(sentences, str):
        return [sentences], True
    if sentences is None:
        raise TypeError("sentences must be a str or a list of str, got None")
    if not isinstance(sentences, Sequence):
        raise TypeError(f"sentences must be a str or a list of str, got {type(sentences).__name__}")
    texts = list(sentences)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"sentences[{i}] must be a str, got {type(text).__name__}: {text!r:.60}")
    return texts, False


class BGEM3Encoder(M3EncodeAPI):
    """BGE-M3 dense, sparse (lexical weights) and ColBERT outputs, FlagEmbedding-compatible.

    Args:
        model_name_or_path: hub id (default BAAI/bge-m3) or a local checkpoint folder.
        precision: "auto" (fp16 on CUDA, fp32 elsewhere), "float32", "bfloat16" or "float16": the dtype
            the weights are held in; or "int8" (CPU only): int8 weights per output channel with
            dynamically quantized activations, run by TFLite/XNNPACK
            (bgem3_embeddings/backends/tensorflow/int8.py).
        compute_dtype: the dtype of the matmuls. "auto": the weights' dtype on a GPU or a CPU with native
            bf16/fp16 (AMX, avx512_bf16, avx512_fp16); float32 on other CPUs, where half-precision
            GEMMs are emulated and ~4x slower (half the memory at fp32 speed). Or "float32" / the
            precision itself, to force one.
        device: "auto", "cpu", "gpu", "cuda", "metal" or "/GPU:N".
        batch_size: texts per batch (the reference default is 256).
        max_tokens_per_batch: also cap batch size x padded length (None: no cap). The default 8192 keeps
            the attention activations of a batch near 1 GB at full size; short texts still fill batch_size.
        query_max_length / passage_max_length: truncation lengths of encode_queries / encode_corpus.
        cache_dir, revision, local_files_only: passed to huggingface_hub.
        show_progress: None = a progress bar only for long inputs; True / False forces it.
        padding_side: "right" (as the reference pads) or "left"; the outputs are the same either way.
        allow_missing_heads: disable sparse/colbert outputs whose head file is missing instead of failing.
        weights_cache: keep the ported weights in a memory-mappable file so the next load takes a fraction
            of a second (checkpoint/converted.py). True: $BGEM3_WEIGHTS_CACHE or
            ~/.cache/bgem3_embeddings/converted; a folder; False: off.
        eager_max_tokens / eager_batches: the first `eager_batches` batches of at most `eager_max_tokens`
            padded tokens (batch size x length) run eagerly, without tracing: a short query in a new
            process gets its vector without paying for graph building; later batches run traced.
            eager_batches=0: every batch runs through the traced function.
    """

    def __init__(
        self,
        model_name_or_path: str | Path = DEFAULT_MODEL_ID,
        *,
        precision: str = "auto",
        compute_dtype: str = "auto",
        device: str = "auto",
        batch_size: int = 256,
        max_tokens_per_batch: int | None = DEFAULT_MAX_TOKENS_PER_BATCH,
        query_max_length: int = 512,
        passage_max_length: int = 8192,
        cache_dir: str | Path | None = None,
        revision: str | None = None,
        local_files_only: bool = False,
        show_progress: bool | None = None,
        allow_missing_heads: bool = False,
        padding_side: str = "right",
        weights_cache: bool | str | Path | None = True,
        eager_max_tokens: int = DEFAULT_EAGER_MAX_TOKENS,
        eager_batches: int = DEFAULT_EAGER_BATCHES,
        device_inventory: DeviceInventory | None = None,
    ) -> None:
        for name, value in (("eager_max_tokens", eager_max_tokens), ("eager_batches", eager_batches)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if padding_side not in PADDING_SIDES:
            raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if max_tokens_per_batch is not None and (
            not isinstance(max_tokens_per_batch, int) or max_tokens_per_batch < 1
        ):
            raise ValueError(
                f"max_tokens_per_batch must be a positive int or None, got {max_tokens_per_batch!r}"
            )
        for name, value in (
            ("query_max_length", query_max_length),
            ("passage_max_length", passage_max_length),
        ):
            if not isinstance(value, int) or value < 2:
                raise ValueError(f"{name} must be an int >= 2 (room for <s> and </s>), got {value!r}")
        inventory = device_inventory or DeviceInventory.detect()
        self.device, self.precision, self.compute_dtype = resolve_placement(
            device, precision, compute_dtype, inventory
        )
        self.model_id = str(model_name_or_path)
        self.files = resolve_checkpoint(
            model_name_or_path, revision=revision, cache_dir=cache_dir, local_files_only=local_files_only
        )
        BGEM3Config.from_json_file(self.files.config)  # a broken config.json is named before anything else
        # tokenizer.json through the tokenizers library: no transformers (and so no torch) import at run time.
        self.tokenizer = BGEM3Tokenizer.from_dir(self.files.root)
        self._int8: Int8Runner | None = None
        self._fingerprint: str | None = None
        # The Keras BGEM3Model; None with precision "int8", where the TFLite flatbuffer runs instead.
        self.model: Any = None
        # How a padded batch runs on the Keras backend in use (backends/); None with precision "int8".
        self.runner: Any = None
        if self.precision == "int8":
            require_tensorflow("precision='int8' (TFLite with XNNPACK)")
            self.available_outputs = check_heads(self.files, allow_missing_heads)
            self.config = model_config(self.files)
            self._int8 = Int8Runner(
                ensure_int8_model(
                    self.files,
                    lambda: self._build("float32", None, allow_missing_heads, weights_cache)[0],
                    resolve_cache_dir(weights_cache),
                ),
                # mixed lengths split as the float runners split them on the CPU
                # (backends/portable/sub_batches.py)
                splitter=exact_length_splitter(
                    self.config.hidden_size, BGEM3Model.OUTPUT_LAYOUT, padding_side
                ),
            )
        else:
            self.model, self.available_outputs = self._build(
                self.precision, self.compute_dtype, allow_missing_heads, weights_cache
            )
            self.config = self.model.config
            self.runner = make_runner(
                self.model,
                self.device,
                padding_side=padding_side,
                eager_max_tokens=eager_max_tokens,
                eager_batches=eager_batches,
            )
        self.hidden_size = self.config.hidden_size
        self.batch_size = batch_size
        self.max_tokens_per_batch = max_tokens_per_batch
        self.query_max_length = query_max_length
        self.passage_max_length = passage_max_length
        self.show_progress = show_progress
        self.padding_side = padding_side

    def _build(
        self,
        precision: str,
        compute_dtype: str | None,
        allow_missing_heads: bool,
        weights_cache: bool | str | Path | None,
    ) -> tuple[Any, tuple[str, ...]]:
        return build_model(
            self.files,
            precision=precision,
            compute_dtype=compute_dtype,
            device=self.device,
            special_token_ids=_special_ids(self.tokenizer),
            allow_missing_heads=allow_missing_heads,
            weights_cache=weights_cache,
        )

    # ---------------------------------------------------------------- model calls
    def inference_function(self, outputs: tuple[str, ...], long_input: bool = False) -> Callable[..., dict]:
        """TensorFlow only: the tf.function for these outputs (backends/tensorflow/runner.py).

        On the Apple GPU call it inside `self.runner.graph_options()`, as `run_batch` does: it keeps
        grappler's remapper off there (tensorflow-metal's fused MatMul kernels, precision-and-devices.md).
        """
        require_tensorflow("inference_function (a tf.function)")
        return self.runner.inference_function(outputs, long_input)

    @property
    def eager_batches_left(self) -> int:
        """Short batches still to run eagerly before tracing (TensorFlow; 0 elsewhere)."""
        return int(getattr(self.runner, "eager_batches_left", 0))

    @eager_batches_left.setter
    def eager_batches_left(self, value: int) -> None:
        if hasattr(self.runner, "eager_batches_left"):
            self.runner.eager_batches_left = value

    def fingerprint(self) -> str:
        """The checkpoint's fingerprint (config, tokenizer, sampled weights, heads): the same for every
        precision and for a copy of the same files (`bgem3_embeddings.checkpoint.fingerprint`)."""
        if self._fingerprint is None:
            self._fingerprint = checkpoint_fingerprint(self.files)
        return self._fingerprint

    def trace_count(self) -> int:
        """How many times the inference functions were traced or compiled (stays flat after warm-up)."""
        return self.runner.trace_count() if self.runner is not None else 0

    def run_batch(self, input_ids: np.ndarray, attention_mask: np.ndarray, outputs: tuple[str, ...]) -> dict:
        """Model outputs as numpy arrays for one padded batch."""
        if self._int8 is not None:
            return self._int8(input_ids, attention_mask, outputs)
        return dict(self.runner.run(input_ids, attention_mask, outputs))

    # ---------------------------------------------------------------- encode
    def tokenize(self, texts: list[str], max_length: int) -> list[list[int]]:
        """Token ids with <s> ... </s>, truncated to max_length, unpadded."""
        if not texts:
            return []
        return self.tokenizer.encode_batch(texts, max_length)

    def _resolve_max_length(self, max_length: int | None, default: int) -> int:
        length = default if max_length is None else max_length
        if not isinstance(length, int) or length < 2:
            raise ValueError(f"max_length must be an int >= 2 (room for <s> and </s>), got {length!r}")
        limit = self.config.max_sequence_length
        if length > limit:
            logger.info("max_length %d exceeds the model's %d positions: using %d", length, limit, limit)
            length = limit
        return length

    def _requested_outputs(self, dense: bool, sparse: bool, colbert: bool) -> tuple[str, ...]:
        wanted = [
            name
            for name, flag in (("dense_vecs", dense), ("sparse_weights", sparse), ("colbert_vecs", colbert))
            if flag
        ]
        missing = [w for w in wanted if w not in self.available_outputs]
        if missing:
            raise ValueError(
                f"{', '.join(missing)} requested, but this checkpoint's head file is missing "
                f"(loaded with allow_missing_heads=True)"
            )
        return tuple(wanted)

    def encode(
        self,
        sentences: str | Sequence[str],
        batch_size: int | None = None,
        max_length: int | None = None,
        return_dense: bool = True,
        return_sparse: bool = False,
        return_colbert_vecs: bool = False,
    ) -> dict[str, Any]:
        """Encode texts; outputs not asked for are None. A single str gives unbatched results."""
        texts, single = _validate_sentences(sentences)
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        max_length = self._resolve_max_length(max_length, self.passage_max_length)
        self._requested_outputs(return_dense, return_sparse, return_colbert_vecs)  # before tokenizing
        result = self.encode_token_ids(
            self.tokenize(texts, max_length), batch_size, return_dense, return_sparse, return_colbert_vecs
        )
        if single:
            result = {k: (v[0] if v is not None else None) for k, v in result.items()}
        return result

    def encode_token_ids(
        self,
        token_ids: Sequence[Sequence[int]],
        batch_size: int | None = None,
        return_dense: bool = True,
        return_sparse: bool = False,
        return_colbert_vecs: bool = False,
    ) -> dict[str, Any]:
        """encode() of texts already tokenized (`tokenize`: <s> ... </s>, truncated), same outputs.

        The server (`bgem3_embeddings.serve`) tokenizes each request as it arrives and encodes the texts
        of several clients' requests in one call, length-sorted and batched together.
        """
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        outputs = self._requested_outputs(return_dense, return_sparse, return_colbert_vecs)
        ids = [list(t) for t in token_ids]
        collected = self._encode_token_ids(ids, outputs, batch_size or self.batch_size)
        result: dict[str, Any] = {"dense_vecs": None, "lexical_weights": None, "colbert_vecs": None}
        for name in outputs:
            result[OUTPUT_KEYS[name]] = collected[name]
        return result

    def _encode_token_ids(
        self, token_ids: list[list[int]], outputs: tuple[str, ...], batch_size: int
    ) -> dict[str, Any]:
        n = len(token_ids)
        dense = np.zeros((n, self.hidden_size), dtype=np.float32)
        per_text: dict[str, list[Any]] = {name: [None] * n for name in outputs if name != "dense_vecs"}
        batches = length_sorted_batches([len(t) for t in token_ids], batch_size, self.max_tokens_per_batch)
        show = self.show_progress if self.show_progress is not None else n > PROGRESS_MIN_TEXTS
        pad_id = self.config.pad_token_id
        from tqdm.auto import tqdm

        with tqdm(total=n, unit="text", desc="BGE-M3 encode", disable=not show or not outputs) as bar:
            queue = list(batches)
            while queue and outputs:
                indices = queue.pop(0)
                input_ids, mask = pad_batch([token_ids[i] for i in indices], pad_id, self.padding_side)
                try:
                    out = self.run_batch(input_ids, mask, outputs)
                except Exception as err:
                    if len(indices) == 1 or self.runner is None or not self.runner.is_out_of_memory(err):
                        raise
                    # Out of memory: split the batch in two and retry both halves.
                    half = len(indices) // 2
                    logger.warning("out of memory at batch %d x %d: retrying in halves", *input_ids.shape)
                    queue[:0] = [indices[:half], indices[half:]]
                    continue
                if "dense_vecs" in out:
                    dense[indices] = out["dense_vecs"]
                if "sparse_weights" in out:
                    for i, lw in zip(
                        indices, lexical_weights_from_batch(out["sparse_weights"], input_ids), strict=True
                    ):
                        per_text["sparse_weights"][i] = lw
                if "colbert_vecs" in out:
                    for i, vecs in zip(
                        indices, colbert_vecs_from_batch(out["colbert_vecs"], mask), strict=True
                    ):
                        per_text["colbert_vecs"][i] = vecs
                bar.update(len(indices))
        return {"dense_vecs": dense, **per_text}

    def compute_score(
        self,
        sentence_pairs: Sequence[tuple[str, str]] | tuple[str, str],
        batch_size: int | None = None,
        max_query_length: int | None = None,
        max_passage_length: int | None = None,
        weights_for_different_modes: Sequence[float] | None = None,
    ) -> dict[str, Any]:
        """dense, sparse, colbert, sparse+dense and colbert+sparse+dense scores per (query, passage) pair.

        weights_for_different_modes = [w_dense, w_sparse, w_colbert]; the reference default is [1, 1, 1].
        A single pair gives floats instead of lists.
        """
        if sentence_pairs is None:
            raise TypeError("sentence_pairs must be a (query, passage) pair or a list of them, got None")
        single = len(sentence_pairs) == 2 and all(isinstance(x, str) for x in sentence_pairs)
        pairs = [tuple(sentence_pairs)] if single else [tuple(p) for p in sentence_pairs]
        for i, pair in enumerate(pairs):
            if len(pair) != 2 or not all(isinstance(x, str) for x in pair):
                raise TypeError(
                    f"sentence_pairs[{i}] must be a (query: str, passage: str) pair, got {pair!r:.80}"
                )
        given = weights_for_different_modes
        weights = list(given if given is not None else FLAGEMBEDDING_WEIGHTS)
        if not pairs:
            return combine_scores([], [], [], weights)

        def encode_all(texts: list[str], max_length: int) -> dict[str, Any]:
            return self.encode(
                texts,
                batch_size=batch_size,
                max_length=max_length,
                return_dense=True,
                return_sparse=True,
                return_colbert_vecs=True,
            )

        q = encode_all([str(p[0]) for p in pairs], max_query_length or self.query_max_length)
        p = encode_all([str(p[1]) for p in pairs], max_passage_length or self.passage_max_length)
        dense = np.einsum("ij,ij->i", q["dense_vecs"], p["dense_vecs"]).tolist()
        sparse = [
            lexical_matching_score(a, b)
            for a, b in zip(q["lexical_weights"], p["lexical_weights"], strict=True)
        ]
        colbert = [colbert_score(a, b) for a, b in zip(q["colbert_vecs"], p["colbert_vecs"], strict=True)]
        scores = combine_scores(dense, sparse, colbert, weights)
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
        """explain() of one query against several passages: the query and all passages in one encode."""
        checked = check_weights(weights)
        q, ps = prepare(
            self.tokenizer,
            query,
            passages,
            self._resolve_max_length(max_query_length, self.query_max_length),
            self._resolve_max_length(max_passage_length, self.passage_max_length),
        )
        outputs = self.encode_token_ids(
            [q.ids] + [p.ids for p in ps], return_dense=True, return_sparse=True, return_colbert_vecs=True
        )
        return explain_outputs(q, ps, outputs, checked, colbert_matrix)

    def convert_id_to_token(self, lexical_weights: dict | Sequence[dict]) -> dict | list[dict]:
        """{token_id: weight} -> {token text: weight}; one dict in, one dict out."""
        items: list[dict] = [lexical_weights] if isinstance(lexical_weights, dict) else list(lexical_weights)
        single = isinstance(lexical_weights, dict)
        converted = [{self.tokenizer.decode([int(i)]): w for i, w in item.items()} for item in items]
        return converted[0] if single else converted


def _special_ids(tokenizer: Any) -> tuple[int, ...]:
    """cls, eos, pad and unk ids: the tokens the reference drops from lexical weights."""
    ids = (tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id)
    return tuple(int(i) for i in ids if i is not None)
