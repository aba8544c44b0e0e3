"""One Keras backend's outputs for the backend parity tests, in a process of its own.

    python -m tests.backend_worker BACKEND OUT.npz CHECKPOINT CHECKPOINT_PT RERANKER_CHECKPOINT

KERAS_BACKEND is set from BACKEND before anything imports Keras; on jax and torch TensorFlow is hidden
first (tests/no_tensorflow.py), so the run also proves the package imports, loads and encodes without it.
Writes every output of `backend_cases()` to OUT.npz for tests/test_backends.py to hold against FlagEmbedding.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

# Multilingual, emoji and combining marks, an empty text, mixed lengths (padding in every batch).
TEXTS = [
    "What is BGE M3?",
    "Defination of BM25",
    "BGE M3 is an embedding model supporting dense retrieval, lexical matching and multi-vector interaction.",
    "",
    "Der schnelle braune Fuchs springt über den faulen Hund. 東京は日本の首都です。 😀👍🏽 e\u0301",
    "BM25 is a bag-of-words retrieval function that ranks a set of documents based on the query terms "
    "appearing in each document " * 3,
    "a",
]
# Past the runners' LONG_INPUT_CHUNK (1024 tokens): the chunked-attention path, beside a short text.
LONG_TEXTS = ["retrieval with long inputs keeps memory bounded " * 150, "short"]
PAIRS = [(TEXTS[0], TEXTS[2]), (TEXTS[1], TEXTS[5]), (TEXTS[4], TEXTS[2])]
MODE_WEIGHTS = [0.4, 0.2, 0.4]
# Cross-encoder pairs: multilingual, a passage long enough to be cut at max_length 64 (RERANK_MAX_LENGTH).
RERANK_PAIRS = [(TEXTS[0], TEXTS[2]), (TEXTS[4], TEXTS[5]), ("", TEXTS[1]), (TEXTS[1], TEXTS[5] * 3)]
RERANK_MAX_LENGTH = 64


def flatten(prefix: str, out: dict[str, Any]) -> dict[str, np.ndarray]:
    """An encode() result as arrays: dense, ColBERT rows concatenated with their counts, lexical weights as
    (text index, token id, weight) rows sorted by text and id."""
    arrays = {f"{prefix}/dense": np.asarray(out["dense_vecs"], np.float32)}
    colbert = out["colbert_vecs"]
    arrays[f"{prefix}/colbert"] = np.concatenate([np.asarray(c, np.float32) for c in colbert])
    arrays[f"{prefix}/colbert_counts"] = np.array([len(c) for c in colbert])
    rows = [(i, int(k), float(v)) for i, d in enumerate(out["lexical_weights"]) for k, v in d.items()]
    arrays[f"{prefix}/sparse"] = np.array(sorted(rows), dtype=np.float64).reshape(-1, 3)
    return arrays


def reranker_cases(checkpoint: Path) -> dict[str, np.ndarray]:
    """BGEM3Reranker's raw scores of RERANK_PAIRS with right and left padding, and the normalized ones."""
    from bgem3_embeddings import BGEM3Reranker

    arrays = {}
    for side in ("right", "left"):
        reranker = BGEM3Reranker(
            checkpoint, precision="float32", device="cpu", max_length=RERANK_MAX_LENGTH, padding_side=side
        )
        arrays[f"rerank/raw_{side}"] = np.asarray(reranker.compute_score(RERANK_PAIRS), np.float64)
    scores = reranker.compute_score(RERANK_PAIRS, normalize=True)
    arrays["rerank/normalized"] = np.asarray(scores, np.float64)
    return arrays


def backend_cases(checkpoint: Path, checkpoint_pt: Path | None) -> dict[str, np.ndarray]:
    from bgem3_embeddings import BGEM3Encoder

    kwargs = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    arrays: dict[str, np.ndarray] = {}
    for side in ("right", "left"):
        encoder = BGEM3Encoder(checkpoint, precision="float32", device="cpu", padding_side=side)
        arrays |= flatten(f"texts_{side}", encoder.encode(TEXTS, **kwargs))
        # on the CPU a batch of mixed lengths runs as shorter calls (backends/portable/sub_batches.py): count
        # them
        arrays[f"texts_{side}/split_batches"] = np.array(encoder.runner.splitter.split_batches)
    # PyTorch on an x86-64 CPU: the projections ran as oneDNN's fused linear (backends/torch/kernels.py)
    arrays["onednn_linear"] = np.array(getattr(encoder.runner, "linear", None) is not None)
    import keras

    if keras.backend.backend() == "torch":  # bf16 matmuls take the same route (bf16 weights, f32 stream)
        bf16 = BGEM3Encoder(checkpoint, precision="bfloat16", compute_dtype="bfloat16", device="cpu")
        arrays["bf16/dense"] = np.asarray(bf16.encode(TEXTS)["dense_vecs"], np.float32)
        arrays["bf16/onednn_linear"] = np.array(bf16.runner.linear is not None)
    arrays |= flatten("long", encoder.encode(LONG_TEXTS, **kwargs))
    scores = encoder.compute_score(PAIRS, weights_for_different_modes=MODE_WEIGHTS)
    for key, values in scores.items():
        arrays[f"score/{key}"] = np.asarray(values, np.float64)
    if checkpoint_pt is not None:
        pt_encoder = BGEM3Encoder(checkpoint_pt, precision="float32", device="cpu", weights_cache=False)
        arrays |= flatten("texts_pt", pt_encoder.encode(TEXTS, **kwargs))
    import keras

    arrays["backend"] = np.array(keras.backend.backend())
    arrays["tensorflow_imported"] = np.array("tensorflow" in sys.modules)
    return arrays


def jax_length_route_cases(checkpoint: Path) -> dict[str, np.ndarray]:
    """The JAX runner's cuDNN route (attention told each row's length), taken on the CPU.

    cuDNN's kernel needs a CUDA GPU, so `flash_attend` is swapped for XLA's attention given the same lengths
    (`jax.nn.dot_product_attention(key_value_seq_lengths=...)`): what the route hands the kernel (each row's
    length, the all-padding rows the batch is rounded up with) is then held to FlagEmbedding on the CPU. The
    GPU's own kernel is checked by benchmarks/gpu_check.py. Counts the traces that took the route (left
    padding never does: tests/test_kernels_jax.py).
    """
    import jax

    from bgem3_embeddings import BGEM3Encoder
    from bgem3_embeddings.backends.jax import runner as jax_runner

    traced: list[str] = []

    def lengths_attend(q: Any, k: Any, v: Any, key_lengths: Any) -> Any:
        traced.append(str(key_lengths.shape))
        return jax.nn.dot_product_attention(
            q, k, v, scale=1.0, key_value_seq_lengths=key_lengths, implementation="xla"
        )

    kwargs = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    arrays: dict[str, np.ndarray] = {}
    original = jax_runner.flash_attend
    jax_runner.flash_attend = lengths_attend
    try:
        encoder = BGEM3Encoder(checkpoint, precision="float32", device="cpu")
        encoder.runner.flash_problem = None  # as on a CUDA GPU in half precision
        arrays |= flatten("length_route", encoder.encode(TEXTS, **kwargs))
        arrays["length_route/traces"] = np.array(len(traced))
    finally:
        jax_runner.flash_attend = original
    return arrays


def torch_runner_cases(checkpoint: Path) -> dict[str, np.ndarray]:
    """The PyTorch runner holds each layer's weight tensors (backends/torch/runner.py): a weight assigned
    after it was built still counts, as the Keras model called directly sees it; with half-precision
    weights and float32 matmuls nothing is held (a cast at each call) and the outputs stay the model's."""
    import keras

    from bgem3_embeddings import BGEM3Encoder
    from bgem3_embeddings.batching import pad_batch

    encoder = BGEM3Encoder(checkpoint, precision="float32", device="cpu", weights_cache=False)
    runner = encoder.runner
    # two texts padded to the longer: the keys' mask is exercised
    ids, mask = pad_batch(encoder.tokenize(TEXTS[:2], 64), encoder.config.pad_token_id)
    arrays = {"held/all_held": np.array(all(h is not None for h in runner.held_weights))}
    before = runner.run(ids, mask, ("dense_vecs",))["dense_vecs"]
    kernel = runner.model.encoder_layers[0].query.kernel
    kernel.assign(keras.ops.convert_to_numpy(kernel) * 1.5)
    after = runner.run(ids, mask, ("dense_vecs",))["dense_vecs"]
    inputs = {"input_ids": ids.astype(np.int32), "attention_mask": mask.astype(np.int32)}
    direct = keras.ops.convert_to_numpy(runner.model(inputs, outputs=("dense_vecs",))["dense_vecs"])
    arrays["held/changed_by"] = np.array(np.abs(after - before).max())
    arrays["held/off_the_model_by"] = np.array(np.abs(after - direct).max())
    half = BGEM3Encoder(checkpoint, precision="bfloat16", compute_dtype="float32", device="cpu")
    arrays["half_weights/none_held"] = np.array(all(h is None for h in half.runner.held_weights))
    arrays["half_weights/dense"] = np.asarray(half.encode(TEXTS)["dense_vecs"], np.float32)
    return arrays


def record_float64_handed_to_torch() -> list[str]:
    """Every float64 numpy array handed to torch from now on (keras-team/keras#23700: on Apple's MPS,
    Keras' convert_to_tensor of a float64 array fails), as a list of shapes filled as it happens."""
    import torch

    seen: list[str] = []
    for name in ("as_tensor", "tensor", "from_numpy"):
        original = getattr(torch, name)

        def recording(data: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if isinstance(data, np.ndarray) and data.dtype == np.float64:
                seen.append(str(data.shape))
            return _original(data, *args, **kwargs)

        setattr(torch, name, recording)
    return seen


def main(argv: list[str]) -> None:
    backend, out, checkpoint, checkpoint_pt, reranker = argv[0], Path(argv[1]), *map(Path, argv[2:5])
    os.environ["KERAS_BACKEND"] = backend
    if backend != "tensorflow":
        from tests.no_tensorflow import hide_tensorflow

        hide_tensorflow()
    float64_seen = record_float64_handed_to_torch() if backend == "torch" else []
    arrays = backend_cases(checkpoint, checkpoint_pt) | reranker_cases(reranker)
    if backend == "jax":
        arrays |= jax_length_route_cases(checkpoint)
    if backend == "torch":
        arrays |= torch_runner_cases(checkpoint)
    arrays["float64_handed_to_torch"] = np.array(float64_seen, dtype=str)
    if backend == "torch":  # the recording itself works: Keras given a float64 array is seen
        import keras

        keras.ops.convert_to_tensor(np.zeros(3, np.float64))
        arrays["float64_probe_seen"] = np.array(len(float64_seen) - len(arrays["float64_handed_to_torch"]))
    np.savez(out, **arrays)


if __name__ == "__main__":
    main(sys.argv[1:])
