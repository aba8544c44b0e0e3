"""GradCache in `fit()` (`M3Finetuner(sub_batch_size=...)`, finetune/grad_cache*.py) on every backend.

tests/grad_cache_worker.py runs it on TensorFlow, JAX and PyTorch, each in a process of its own, on the batch
of tests/test_finetune_loss.py's unified self-distillation case (2 queries, 6 passages) and the same
FlagEmbedding reference (its `EncoderOnlyEmbedderM3Model`, differentiated by torch):
- without dropout, GradCache's loss and gradients equal FlagEmbedding's and our whole-batch step's, and one
  `fit()` step (SGD, clipped at global norm 1.0) leaves the weights FlagEmbedding's clipped step gives;
- with dropout 0.1, the masks are replayed: the re-encoded representations equal the cached ones (bit for
  bit on torch, and on TensorFlow with its kernel fusion off), and the gradients equal those of the same
  sub-batches all on one tape;
- the mechanism: on torch, the peak bytes autograd holds for the backward pass with one row at a time;
- `bgem3 finetune --sub-batch-size` as a user runs it (the default backend): it trains as the whole batch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests import test_finetune_loss as loss_tests
from tests.finetune_worker import CASES, SGD_LEARNING_RATE
from tests.grad_cache_worker import CASE, CLIPNORM
from tests.optional import require_module
from tests.support import assert_clean_failure, run_module

torch = require_module("torch", "the reference trainer runs on torch (the dev extra)")

BACKENDS = ("tensorflow", "jax", "torch")
RTOL = 1e-5  # of the loss, and of the gradients' largest value (float32 sums in another order)
# A re-encoded value may differ from the cached one by float32 rounding where a compiler fuses a
# forward-only graph's kernels otherwise than a graph with a backward pass (TensorFlow's remapper, XLA);
# a dropout mask drawn anew changes values by a whole activation (0.1 and more here).
REPLAY_ATOL = 1e-6



@pytest.fixture(scope="module")
def reference(no_dropout_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    _, model_kwargs, no_in_batch_neg, kd, max_lengths = next(c for c in CASES if c[0] == CASE)
    case, batch = loss_tests._reference_case(
        no_dropout_checkpoint, model_kwargs, no_in_batch_neg, kd, max_lengths
    )
    batches = tmp_path_factory.mktemp("grad_cache_batches") / "batches.npz"
    np.savez(batches, **{f"{CASE}/{key}": value for key, value in batch.items()})
    return {"case": case, "batches": batches}


@pytest.fixture(scope="module", params=BACKENDS)
def ours(
    request: pytest.FixtureRequest,
    reference: dict,
    no_dropout_checkpoint: Path,
    tiny_checkpoint: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, np.ndarray]:
    out = tmp_path_factory.mktemp(f"grad_cache_{request.param}") / "out.npz"
    command = [
        sys.executable,
        "-m",
        "tests.grad_cache_worker",
        request.param,
        str(no_dropout_checkpoint),
        str(tiny_checkpoint),
        str(reference["batches"]),
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    with np.load(out) as data:
        arrays = {key: data[key] for key in data.files}
    assert str(arrays["backend"]) == request.param
    return arrays


def _under(arrays: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {key[len(prefix) + 1 :]: value for key, value in arrays.items() if key.startswith(prefix + "/")}


def _largest_error(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> tuple[float, float]:
    """(largest |got - expected| over every tensor of `expected`, the largest |expected|)."""
    error = max(float(np.abs(got[name] - ref).max()) for name, ref in expected.items())
    return error, max(float(np.abs(ref).max()) for ref in expected.values())


def test_loss_and_gradients_equal_flagembedding(ours: dict, reference: dict) -> None:
    """GradCache (sub-batches of 4: the queries in one short one, the passages as 4 + 2) is FlagEmbedding's
    loss and torch autograd's gradient of every parameter."""
    case = reference["case"]
    assert float(ours["gc/term/loss"]) == pytest.approx(case["loss"], rel=RTOL)
    got = _under(ours, "gc/grad")
    assert set(case["grads"]) <= set(got)
    error, largest = _largest_error(got, case["grads"])
    assert error <= RTOL * largest, (error, largest)


def test_gradients_equal_the_whole_batch_step(ours: dict) -> None:
    """Our backend's whole-batch derivative (what Keras' own train step takes) is GradCache's, per term."""
    whole_terms = _under(ours, "whole/term")
    for name, value in whole_terms.items():
        assert float(ours[f"gc/term/{name}"]) == pytest.approx(float(value), rel=RTOL, abs=1e-7), name
    error, largest = _largest_error(_under(ours, "gc/grad"), _under(ours, "whole/grad"))
    assert error <= RTOL * largest, (error, largest)


def test_one_clipped_fit_step_equals_flagembedding(ours: dict, reference: dict) -> None:
    """`fit()` with sub_batch_size 2 and SGD clipped at global norm 1.0 steps where FlagEmbedding's gradient,
    clipped the same way, steps: one optimizer update with the accumulated gradient, clipping included."""
    case = reference["case"]
    norm = float(np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in case["grads"].values())))
    assert norm > 2 * CLIPNORM  # the clip acts: an unclipped step would be over twice as long
    scale = SGD_LEARNING_RATE * CLIPNORM / norm
    got = _under(ours, "after_clip")
    for name, weight in case["weights"].items():
        if name.startswith("pooler."):
            continue  # BGE-M3 does not use the pooler; our model has none
        expected = weight - scale * case["grads"].get(name, np.zeros_like(weight))
        tolerance = 1e-6 * float(np.abs(weight).max()) + RTOL * scale * float(
            np.abs(case["grads"][name]).max()
        )
        assert float(np.abs(got[name] - expected).max()) <= tolerance, name
    moved = max(float(np.abs(got[n] - case["weights"][n]).max()) for n in case["grads"])
    assert moved > 1e-2
    # the step's loss reached fit()'s logs (the metrics were updated)
    assert float(ours["after_clip/logged_loss"]) == pytest.approx(case["loss"], rel=RTOL)


def test_dropout_masks_are_replayed(ours: dict) -> None:
    """With dropout 0.1, each sub-batch's second forward draws the masks of its first: the re-encoded
    representations equal the cached ones, and (TensorFlow, torch) the gradient is that of the same masks
    on one tape, FlagEmbedding's `sub_batch_size` forward."""
    backend = str(ours["backend"])
    error = float(ours["dropout/replay_error"])
    if backend == "torch":
        assert error == 0.0  # bit for bit
        assert float(ours["gc/replay_error"]) == 0.0
    else:
        assert error <= REPLAY_ATOL
    if backend == "tensorflow":
        assert float(ours["dropout/replay_error_unfused"]) == 0.0  # bit for bit, the same kernels both times
    dropped = _under(ours, "dropout/grad")
    # dropout acts: the gradient is another than without it, by far more than the tolerances here
    difference, largest = _largest_error(_under(ours, "gc/grad"), dropped)
    assert difference > 100 * RTOL * largest
    if backend == "jax":
        return  # no chunked reference there (see the worker)
    assert float(ours["dropout/term/loss"]) == pytest.approx(float(ours["chunked/term/loss"]), rel=RTOL)
    error, largest = _largest_error(dropped, _under(ours, "chunked/grad"))
    assert error <= RTOL * largest, (error, largest)
    # the step leaves the seed state where one pass over the sub-batches leaves it
    np.testing.assert_array_equal(ours["dropout/seed_after"], ours["chunked/seed_after"])


def test_one_row_at_a_time_holds_a_fraction_of_the_activations(ours: dict) -> None:
    """The mechanism, measured on torch: the bytes autograd keeps for the backward pass (weights left out)
    peak at one sub-batch's activations, or the loss's graph on the representations. One row at a time
    (a passage of 43 tokens, of the batch's 322 token rows) keeps under a quarter of the whole batch's."""
    if str(ours["backend"]) != "torch":
        pytest.skip("measured with torch's saved-tensor hooks")
    whole, one_row = int(ours["saved_bytes/whole"]), int(ours["saved_bytes/gc"])
    assert 0 < one_row < 0.25 * whole, (one_row, whole)


def test_bgem3_finetune_sub_batch_size_trains_as_the_whole_batch(
    no_dropout_checkpoint: Path, tmp_path: Path
) -> None:
    """Two SGD steps of `bgem3 finetune` on 2 queries x 3 passages, whole and in sub-batches of 2: the tuned
    weights differ by float32 rounding only. They do differ (an ignored option would give the same bits).
    (No clipping: Keras' own TensorFlow step clips an embedding table's IndexedSlices by another norm.)"""
    train = tmp_path / "train.jsonl"
    lines = [
        {"query": f"query {i} on topic {i % 3}", "pos": [f"topic {i % 3} for query {i}"], "neg": ["a", "b c"]}
        for i in range(4)
    ]
    train.write_text("".join(json.dumps(line) + "\n" for line in lines))
    common = (
        str(train),
        "--model",
        str(no_dropout_checkpoint),
        "--unified-finetuning",
        "--optimizer",
        "sgd",
        "--learning-rate",
        "0.05",
        "--max-grad-norm",
        "0",
        "--max-steps",
        "2",
        "--per-device-train-batch-size",
        "2",
        "--train-group-size",
        "3",
    )
    done = run_module(
        "bgem3_embeddings.cli", "finetune", *common, "--sub-batch-size", "0", "-o", str(tmp_path / "x")
    )
    assert_clean_failure(done, 1, "--sub-batch-size: must be at least 1, got 0")
    for name, extra in (("whole", ()), ("split", ("--sub-batch-size", "2"))):
        done = run_module("bgem3_embeddings.cli", "finetune", *common, *extra, "-o", str(tmp_path / name))
        assert done.returncode == 0, done.stderr[-3000:]
    from safetensors.numpy import load_file

    start, whole, split = (
        load_file(str(f / "model.safetensors"))
        for f in (no_dropout_checkpoint, tmp_path / "whole", tmp_path / "split")
    )
    moved = max(float(np.abs(whole[n] - start[n]).max()) for n in start)
    error = max(float(np.abs(split[n] - whole[n]).max()) for n in whole)
    largest = max(float(np.abs(w).max()) for w in start.values())
    assert moved > 1e-3
    assert error <= 2e-6 * largest + 1e-4 * moved, (error, moved)  # seen: 7e-7 of 0.016
    assert any(not np.array_equal(split[n], whole[n]) for n in whole)
