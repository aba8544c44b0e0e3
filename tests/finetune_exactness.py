"""What the fine-tuning exactness tests share (tests/test_finetune_loss.py with tests/finetune_worker.py,
tests/test_finetune_reranker.py with tests/reranker_finetune_worker.py).

In a worker (one Keras backend, a process of its own): `record_gradients` and `record_sgd_step` write ours
into the arrays `worker_main` saves. In a test: `run_worker` starts one, `reference_step` is torch's side
(autograd, Hugging Face's clip, one SGD step), `gradients_of` and `assert_one_sgd_step` compare.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

SGD_LEARNING_RATE = 0.5
MAX_GRAD_NORM = 1.0
GRAD_RTOL = 1e-5

Arrays = dict[str, np.ndarray]
# a weight's path -> (its Hugging Face name, stored transposed)
Names = dict[str, tuple[str, bool]]


# --- in a worker ------------------------------------------------------------------------------------
def one_batch(inputs: Arrays) -> Any:
    """A keras PyDataset of the one batch `inputs`, for `fit()`."""
    import keras

    class OneBatch(keras.utils.PyDataset):
        def __init__(self, inputs: Arrays) -> None:
            super().__init__()
            self.inputs = inputs

        def __len__(self) -> int:
            return 1

        def __getitem__(self, index: int) -> Arrays:
            return self.inputs

    return OneBatch(inputs)


def _as_hf(value: np.ndarray, transposed: bool) -> np.ndarray:
    return value.T if transposed else value


def record_gradients(out: Arrays, case: str, finetuner: Any, inputs: Arrays, names: Names) -> None:
    """The loss terms and every trained weight's gradient (under its Hugging Face name) as out[case/...]."""
    from bgem3_embeddings.finetune.gradients import loss_and_gradients

    terms, grads = loss_and_gradients(finetuner, inputs)
    for term, value in terms.items():
        out[f"{case}/term/{term}"] = np.array(value)
    for variable, grad in zip(finetuner.trainable_variables, grads, strict=True):
        hf_name, transposed = names[variable.path]
        out[f"{case}/grad/{hf_name}"] = _as_hf(grad, transposed)


def record_sgd_step(
    out: Arrays, case: str, finetuner: Any, inputs: Arrays, weights: Any, names: Names
) -> None:
    """Every weight after one `fit()` step of SGD clipped as Hugging Face's Trainer clips (the norm must be
    the true one), as out[case/after_sgd/...]."""
    import keras

    finetuner.compile(optimizer=keras.optimizers.SGD(SGD_LEARNING_RATE, global_clipnorm=MAX_GRAD_NORM))
    finetuner.fit(one_batch(inputs), epochs=1, verbose=0)
    for variable in weights:
        hf_name, transposed = names[variable.path]
        value = np.asarray(keras.ops.convert_to_numpy(variable.value), np.float32)
        out[f"{case}/after_sgd/{hf_name}"] = _as_hf(value, transposed)


def worker_main(run: Callable[[Path, Arrays], Arrays]) -> None:
    """`python -m tests.WORKER BACKEND CHECKPOINT BATCHES.npz OUT.npz`: KERAS_BACKEND set before anything
    imports Keras (TensorFlow hidden on jax and torch), then run(checkpoint, batches) saved to OUT.npz."""
    backend, checkpoint, batches_path, out_path = sys.argv[1:5]
    os.environ["KERAS_BACKEND"] = backend
    if backend != "tensorflow":
        from tests.no_tensorflow import hide_tensorflow

        hide_tensorflow()
    with np.load(batches_path) as data:
        batches = {key: data[key] for key in data.files}
    np.savez(out_path, **run(Path(checkpoint), batches))  # type: ignore[arg-type]  # numpy's stub


# --- in a test ----------------------------------------------------------------------------------------
def run_worker(module: str, backend: str, checkpoint: Path, batches: Path, out: Path) -> Arrays:
    """worker_main's arrays from `module` on `backend`, in a process of its own."""
    command = [sys.executable, "-m", module, backend, str(checkpoint), str(batches), str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    with np.load(out) as data:
        arrays = {key: data[key] for key in data.files}
    assert str(arrays["backend"]) == backend
    return arrays


def reference_step(loss: Any, params: Mapping[str, Any]) -> dict[str, Any]:
    """torch's side of a case: the loss, autograd's gradients, the weights, then the gradient norm clipped
    at MAX_GRAD_NORM as Hugging Face's Trainer clips it and the weights after one SGD step."""
    import torch

    loss.backward()
    result: dict[str, Any] = {
        "loss": float(loss),
        "grads": {n: p.grad.numpy().copy() for n, p in params.items() if p.grad is not None},
        "weights": {n: p.detach().numpy().copy() for n, p in params.items()},
    }
    trained = [p for p in params.values() if p.grad is not None]
    result["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(trained, MAX_GRAD_NORM))
    torch.optim.SGD(trained, lr=SGD_LEARNING_RATE).step()
    result["after_sgd"] = {n: p.detach().numpy().copy() for n, p in params.items()}
    return result


def gradients_of(ours: Arrays, case: str) -> Arrays:
    """Our gradients of `case`, by Hugging Face name."""
    prefix = f"{case}/grad/"
    return {key.removeprefix(prefix): value for key, value in ours.items() if key.startswith(prefix)}


def assert_one_sgd_step(
    ours: Arrays,
    case_name: str,
    case: dict[str, Any],
    *,
    skip: str | None = None,
    gradient_scale: Mapping[str, float] | None = None,
) -> None:
    """Every weight (but those named `skip...`) after our SGD step within float32 rounding of torch's: 1e-6
    of the weight plus GRAD_RTOL of the step (the learning rate times the largest gradient, or times
    `gradient_scale[name]`); and the step moved the weights, so equality is not the untouched weights'."""
    for name, after in case["after_sgd"].items():
        if skip is not None and name.startswith(skip):
            continue
        got = ours[f"{case_name}/after_sgd/{name}"]
        scale = float(np.abs(case["grads"].get(name, np.zeros(1))).max())
        step = SGD_LEARNING_RATE * (gradient_scale or {}).get(name, scale)
        tolerance = 1e-6 * float(np.abs(case["weights"][name]).max()) + GRAD_RTOL * step
        assert float(np.abs(got - after).max()) <= tolerance, name
    moved = max(float(np.abs(case["after_sgd"][n] - case["weights"][n]).max()) for n in case["grads"])
    assert moved > 1e-3
