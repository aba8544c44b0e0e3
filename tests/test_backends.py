"""Parity with FlagEmbedding on each Keras backend (TensorFlow, JAX, PyTorch), each in its own process.

The reference is FlagEmbedding's own M3 embedder (BGEM3FlagModel) on the current transformers, with its
own tokenizer, on the same tiny checkpoint. Each backend runs tests/backend_worker.py in a subprocess with
KERAS_BACKEND set; on JAX and PyTorch TensorFlow is hidden there, as on a machine without it. Checked:
dense, sparse and ColBERT outputs with right and left padding, an input past the chunked-attention
threshold, compute_score, both checkpoint formats (safetensors and pytorch_model.bin), and the
cross-encoder reranker (BGEM3Reranker against FlagReranker).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bgem3_embeddings.backends.torch.kernels import X86_64
from tests.backend_worker import (
    LONG_TEXTS,
    MODE_WEIGHTS,
    PAIRS,
    RERANK_MAX_LENGTH,
    RERANK_PAIRS,
    TEXTS,
    flatten,
)
from tests.optional import require_module
from tests.tolerances import SCALED, UNIT_VECTORS

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("tensorflow", "jax", "torch")
X86 = platform.machine().lower() in X86_64  # where PyTorch's projections take oneDNN's linear


@pytest.fixture(scope="module")
def reference(tiny_checkpoint: Path, tiny_reranker_checkpoint: Path) -> dict[str, np.ndarray]:
    """FlagEmbedding's outputs for every case the workers compute (BGEM3FlagModel, FlagReranker)."""
    from tests.flagembedding_ref import flag_reranker, flagembedding_m3

    m3 = flagembedding_m3(tiny_checkpoint)
    kwargs = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True, "max_length": 8192}
    arrays = flatten("texts", m3.encode(TEXTS, **kwargs)) | flatten("long", m3.encode(LONG_TEXTS, **kwargs))
    scores = m3.compute_score(PAIRS, max_passage_length=8192, weights_for_different_modes=MODE_WEIGHTS)
    for key, values in scores.items():
        arrays[f"score/{key}"] = np.asarray(values, np.float64)
    reranker = flag_reranker(tiny_reranker_checkpoint)
    for key, normalize in (("raw", False), ("normalized", True)):
        scores = reranker.compute_score(RERANK_PAIRS, max_length=RERANK_MAX_LENGTH, normalize=normalize)
        arrays[f"rerank/{key}"] = np.asarray(scores, np.float64)
    return arrays


def _run_worker(backend: str, out: Path, *checkpoints: Path) -> dict[str, Any]:
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "tests.backend_worker", backend, str(out), *map(str, checkpoints)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    with np.load(out) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module", params=BACKENDS)
def backend_outputs(
    request: pytest.FixtureRequest,
    tiny_checkpoint: Path,
    tiny_checkpoint_pt: Path,
    tiny_reranker_checkpoint: Path,
    tmp_path_factory: Any,
) -> tuple[str, dict[str, Any]]:
    backend = request.param
    if backend != "tensorflow":
        require_module(backend, reason=f"the {backend} extra is not installed")
    out = tmp_path_factory.mktemp(f"backend_{backend}") / "outputs.npz"
    return backend, _run_worker(backend, out, tiny_checkpoint, tiny_checkpoint_pt, tiny_reranker_checkpoint)


def _assert_encoded_equal(ours: dict[str, Any], prefix: str, ref: dict[str, Any], ref_prefix: str) -> None:
    np.testing.assert_allclose(ours[f"{prefix}/dense"], ref[f"{ref_prefix}/dense"], **UNIT_VECTORS)
    np.testing.assert_array_equal(ours[f"{prefix}/colbert_counts"], ref[f"{ref_prefix}/colbert_counts"])
    np.testing.assert_allclose(ours[f"{prefix}/colbert"], ref[f"{ref_prefix}/colbert"], **UNIT_VECTORS)
    sparse, ref_sparse = ours[f"{prefix}/sparse"], ref[f"{ref_prefix}/sparse"]
    np.testing.assert_array_equal(sparse[:, :2], ref_sparse[:, :2])  # the same tokens of the same texts
    np.testing.assert_allclose(sparse[:, 2], ref_sparse[:, 2], **SCALED)


def test_the_backend_ran_as_asked(backend_outputs: tuple[str, dict[str, Any]]) -> None:
    backend, ours = backend_outputs
    assert str(ours["backend"]) == backend
    # On JAX and PyTorch the worker hid TensorFlow: nothing imported it.
    assert bool(ours["tensorflow_imported"]) == (backend == "tensorflow")
    if backend == "torch":
        # keras-team/keras#23700: a float64 numpy array fails on Apple's MPS. Everything above went through
        # torch's tensor constructors with no float64 array, and the recording saw the worker's own probe.
        assert list(ours["float64_handed_to_torch"]) == []
        assert int(ours["float64_probe_seen"]) == 1
    # oneDNN's fused linear runs PyTorch's projections on an x86-64 CPU, and only there: every output these
    # tests hold to FlagEmbedding went through it on such a machine
    assert bool(ours["onednn_linear"]) == (backend == "torch" and X86)


def test_pytorch_bf16_matmuls_stay_within_bf16_rounding(
    backend_outputs: tuple[str, dict[str, Any]], reference: dict[str, Any]
) -> None:
    """PyTorch with bf16 weights and matmuls (oneDNN's linear on an x86-64 CPU): the dense vectors within
    bf16 rounding of FlagEmbedding's float32 ones."""
    backend, ours = backend_outputs
    if backend != "torch":
        pytest.skip("PyTorch's bf16 route")
    assert bool(ours["bf16/onednn_linear"]) == X86
    got, want = ours["bf16/dense"], reference["texts/dense"]
    cosine = (got * want).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() > 0.999, cosine


def test_pytorch_runner_weights_stay_current(
    backend_outputs: tuple[str, dict[str, Any]], reference: dict[str, Any]
) -> None:
    """The PyTorch runner holds the variables' own tensors: a weight assigned afterwards changes its outputs
    as it changes the Keras model's. Half-precision weights with float32 matmuls hold nothing (cast at each
    call) and stay within bf16 rounding of FlagEmbedding."""
    backend, ours = backend_outputs
    if backend != "torch":
        pytest.skip("the PyTorch runner")
    assert bool(ours["held/all_held"])
    assert float(ours["held/changed_by"]) > 1e-3  # the assigned kernel counted...
    assert float(ours["held/off_the_model_by"]) < 1e-5  # ...exactly as the Keras layers read it
    assert bool(ours["half_weights/none_held"])
    got, want = ours["half_weights/dense"], reference["texts/dense"]
    cosine = (got * want).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() > 0.999, cosine


@pytest.mark.parametrize("side", ["right", "left"])
def test_outputs_match_flagembedding(
    backend_outputs: tuple[str, dict[str, Any]], reference: dict[str, Any], side: str
) -> None:
    backend, ours = backend_outputs
    assert reference["texts/sparse"].shape[0] > 10  # the tiny model's weights give real lexical weights
    # on every backend the mixed-length batch ran as several calls, put back together (sub_batches)
    assert int(ours[f"texts_{side}/split_batches"]) > 0, backend
    _assert_encoded_equal(ours, f"texts_{side}", reference, "texts")


def test_jax_length_route_matches_flagembedding(
    backend_outputs: tuple[str, dict[str, Any]], reference: dict[str, Any]
) -> None:
    """JAX's cuDNN route (bgem3_embeddings/backends/jax/kernels.py), its kernel swapped for XLA's given the
    same lengths on the CPU: the right-padded batches took it and match FlagEmbedding."""
    backend, ours = backend_outputs
    if backend != "jax":
        pytest.skip("a JAX runner's route")
    assert int(ours["length_route/traces"]) > 0
    _assert_encoded_equal(ours, "length_route", reference, "texts")


def test_long_input_through_chunked_attention(
    backend_outputs: tuple[str, dict[str, Any]], reference: dict[str, Any]
) -> None:
    _, ours = backend_outputs
    assert reference["long/colbert_counts"][0] > 1024, "the long text must pass the chunking threshold"
    _assert_encoded_equal(ours, "long", reference, "long")


def test_compute_score_matches_flagembedding(
    backend_outputs: tuple[str, dict[str, Any]], reference: dict[str, Any]
) -> None:
    _, ours = backend_outputs
    keys = [k for k in reference if k.startswith("score/")]
    assert len(keys) == 5
    for key in keys:
        np.testing.assert_allclose(ours[key], reference[key], **SCALED, err_msg=key)


def test_pytorch_pickle_checkpoint_matches_flagembedding(
    backend_outputs: tuple[str, dict[str, Any]], reference: dict[str, Any]
) -> None:
    _, ours = backend_outputs
    _assert_encoded_equal(ours, "texts_pt", reference, "texts")


def test_cross_encoder_scores_match_flagreranker(
    backend_outputs: tuple[str, dict[str, Any]], reference: dict[str, Any]
) -> None:
    """BGEM3Reranker against FlagReranker, raw logits (right and left padding) and sigmoid, with a pair cut
    at max_length."""
    _, ours = backend_outputs
    for key, ref_key in (
        ("rerank/raw_right", "rerank/raw"),
        ("rerank/raw_left", "rerank/raw"),
        ("rerank/normalized", "rerank/normalized"),
    ):
        np.testing.assert_allclose(ours[key], reference[ref_key], **SCALED, err_msg=key)
    assert np.ptp(reference["rerank/raw"]) > 1e-3  # the pairs score differently: a swap would show
    np.testing.assert_array_equal(np.argsort(-ours["rerank/raw_right"]), np.argsort(-reference["rerank/raw"]))
