"""GradCache's gradients and `fit()` step on one Keras backend, in a process of its own.

    python -m tests.grad_cache_worker BACKEND NO_DROPOUT_CHECKPOINT CHECKPOINT BATCHES.npz OUT.npz

As tests/finetune_worker.py (whose cases, batches and names it reuses): KERAS_BACKEND from BACKEND first.
For CASE, OUT.npz gets:
- `gc/term/*`, `gc/grad/*`: GradCache's loss terms and gradients (sub-batches of GRADIENT_SUB_BATCH rows)
  on the checkpoint without dropout, and `whole/...` the same from the whole batch (as
  gradients.loss_and_gradients takes them, compiled on JAX);
- `after_clip/*`: every weight after one `fit()` step with sub_batch_size=FIT_SUB_BATCH and SGD clipped at
  global norm CLIPNORM (on TensorFlow compiled by XLA);
- `dropout/*` on CHECKPOINT (dropout 0.1 as its config.json says): GradCache's gradients, its replay error
  and the seed state after, and (on TensorFlow and torch) `chunked/*` the same batch's gradients from a
  forward split into the same sub-batches all on one tape (FlagEmbedding's `sub_batch_size`), which draws
  the same masks;
- on TensorFlow, `dropout/replay_error_unfused`: the replay error with grappler's remapper off (it fuses
  a forward-only graph's kernels otherwise than one with a backward pass);
- on torch, `saved_bytes/whole` and `saved_bytes/gc`: the peak bytes autograd held for the backward pass
  (activations; the weights it saves are left out), whole batch against GradCache with one row at a time.
"""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tests.finetune_exactness import one_batch
from tests.finetune_worker import (
    CASES,
    GROUP_SIZE,
    SGD_CASE,
    SGD_LEARNING_RATE,
    hf_names,
    loss_settings,
)

CASE = SGD_CASE  # unified with self-distillation: dense, token weights and ColBERT all reach the loss
GRADIENT_SUB_BATCH = 4  # 2 queries in one short sub-batch; 6 passages as 4 + 2
FIT_SUB_BATCH = 2  # every side in full sub-batches
CLIPNORM = 1.0  # FlagEmbedding's max_grad_norm, below this batch's gradient norm (3.5): the clip acts
DROPOUT_SEED = 7


def _finetuner(
    checkpoint: Path,
    case: str,
    *,
    sub_batch_size: int | None,
    dropout_seed: int | None = None,
    chunked: bool = False,
) -> Any:
    """A fresh M3Finetuner for `case` (the ChunkedForward reference when `chunked`), dropout as the
    checkpoint's config.json says when `dropout_seed` is given, else none."""
    from bgem3_embeddings.checkpoint.files import checkpoint_files_in
    from bgem3_embeddings.finetune.dropout import EncoderDropout, dropout_rates
    from bgem3_embeddings.finetune.train_model import M3Finetuner
    from bgem3_embeddings.loading import build_model

    _, model_kwargs, no_in_batch_neg, kd, _ = next(c for c in CASES if c[0] == case)
    files = checkpoint_files_in(checkpoint)
    model, _ = build_model(files, precision="float32", weights_cache=False)
    dropout = (
        None if dropout_seed is None else EncoderDropout(*dropout_rates(files.config), seed=dropout_seed)
    )
    return (_chunked_class() if chunked else M3Finetuner)(
        model,
        loss_settings(model_kwargs, kd),
        group_size=GROUP_SIZE,
        no_in_batch_neg=no_in_batch_neg,
        dropout=dropout,
        sub_batch_size=sub_batch_size,
    )


def _chunked_class() -> Any:
    from keras import ops

    from bgem3_embeddings.finetune.grad_cache import chunk_bounds
    from bgem3_embeddings.finetune.loss import Representations
    from bgem3_embeddings.finetune.train_model import M3Finetuner

    class ChunkedForward(M3Finetuner):
        """FlagEmbedding's `sub_batch_size`: each side encoded in sub-batches, concatenated, all on one
        tape (`gradients.loss_and_gradients` differentiates it); its dropout draws are GradCache pass 1's."""

        def represent(self, input_ids: Any, attention_mask: Any, training: bool) -> Representations:
            bounds = chunk_bounds(int(input_ids.shape[0]), self.sub_batch_size)
            parts = [
                super(ChunkedForward, self).represent(input_ids[a:b], attention_mask[a:b], training)
                for a, b in bounds
            ]

            def joined(name: str) -> Any:
                values = [getattr(part, name) for part in parts]
                return None if values[0] is None else ops.concatenate(values, axis=0)

            names = ("dense", "token_weights", "input_ids", "colbert", "mask")
            return Representations(**{name: joined(name) for name in names})

        def train_step(self, *args: Any) -> Any:
            raise AssertionError("the chunked forward is a reference for gradients, not trained")

    return ChunkedForward


def _named(finetuner: Any, grads: list[np.ndarray], prefix: str, out: dict) -> None:
    names = hf_names(finetuner.encoder)
    for variable, grad in zip(finetuner.trainable_variables, grads, strict=True):
        hf_name, transposed = names[variable.path]
        out[f"{prefix}/{hf_name}"] = grad.T if transposed else grad


def _weights(finetuner: Any, prefix: str, out: dict) -> None:
    import keras

    names = hf_names(finetuner.encoder)
    for variable in finetuner.encoder.weights:
        hf_name, transposed = names[variable.path]
        value = np.asarray(keras.ops.convert_to_numpy(variable.value), np.float32)
        out[f"{prefix}/{hf_name}"] = value.T if transposed else value


def _reference_gradients(finetuner: Any, inputs: dict) -> tuple[dict[str, float], list[np.ndarray]]:
    """gradients.loss_and_gradients; on JAX its own derivative under jax.jit (eager JAX takes minutes)."""
    import keras

    from bgem3_embeddings.finetune import gradients

    if keras.backend.backend() != "jax":
        return gradients.loss_and_gradients(finetuner, inputs)
    import jax

    terms, grads = jax.jit(lambda x: gradients._jax(finetuner, x))(inputs)
    dense = [gradients.as_numpy(g, v) for g, v in zip(grads, finetuner.trainable_variables, strict=True)]
    return {name: float(value) for name, value in terms.items()}, dense


def _seed_state(finetuner: Any) -> np.ndarray:
    from keras import ops

    return np.asarray(ops.convert_to_numpy(finetuner.dropout.seed_generator.state.value))


def run(no_dropout: Path, checkpoint: Path, batches: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import keras

    from bgem3_embeddings.finetune import grad_cache_route

    backend = keras.backend.backend()
    out: dict[str, np.ndarray] = {"backend": np.array(backend)}
    inputs = {key.split("/", 1)[1]: value for key, value in batches.items() if key.startswith(f"{CASE}/")}
    finetuner = _finetuner(no_dropout, CASE, sub_batch_size=GRADIENT_SUB_BATCH)
    terms, grads, error = grad_cache_route.loss_and_gradients(finetuner, inputs)
    out |= {f"gc/term/{name}": np.array(value) for name, value in terms.items()}
    out["gc/replay_error"] = np.array(error)
    _named(finetuner, grads, "gc/grad", out)
    whole = _finetuner(no_dropout, CASE, sub_batch_size=None)
    terms, grads = _reference_gradients(whole, inputs)
    out |= {f"whole/term/{name}": np.array(value) for name, value in terms.items()}
    _named(whole, grads, "whole/grad", out)

    finetuner = _finetuner(no_dropout, CASE, sub_batch_size=FIT_SUB_BATCH)
    # on TensorFlow through XLA, as Keras compiles the step on a GPU (the tf.functions above are not)
    jit_compile = True if backend == "tensorflow" else "auto"
    optimizer = keras.optimizers.SGD(SGD_LEARNING_RATE, global_clipnorm=CLIPNORM)
    finetuner.compile(optimizer=optimizer, jit_compile=jit_compile)
    history = finetuner.fit(one_batch(inputs), epochs=1, verbose=0).history
    out["after_clip/logged_loss"] = np.array(history["loss"][-1])
    _weights(finetuner, "after_clip", out)

    finetuner = _finetuner(checkpoint, CASE, sub_batch_size=FIT_SUB_BATCH, dropout_seed=DROPOUT_SEED)
    terms, grads, error = grad_cache_route.loss_and_gradients(finetuner, inputs)
    out["dropout/term/loss"] = np.array(terms["loss"])
    out["dropout/replay_error"] = np.array(error)
    out["dropout/seed_after"] = _seed_state(finetuner)
    _named(finetuner, grads, "dropout/grad", out)
    if backend != "jax":  # (its compile would take as long as the rest; the replay error says it there)
        chunked = _finetuner(
            checkpoint, CASE, sub_batch_size=FIT_SUB_BATCH, dropout_seed=DROPOUT_SEED, chunked=True
        )
        terms, grads = _reference_gradients(chunked, inputs)
        out["chunked/term/loss"] = np.array(terms["loss"])
        out["chunked/seed_after"] = _seed_state(chunked)
        _named(chunked, grads, "chunked/grad", out)
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.optimizer.set_experimental_options({"remapping": False})  # for the functions made now on
        finetuner = _finetuner(checkpoint, CASE, sub_batch_size=FIT_SUB_BATCH, dropout_seed=DROPOUT_SEED)
        unfused = grad_cache_route.loss_and_gradients(finetuner, inputs)[2]
        out["dropout/replay_error_unfused"] = np.array(unfused)
    if backend == "torch":
        _saved_bytes(no_dropout, CASE, inputs, out)
    return out


def _saved_bytes(no_dropout: Path, case: str, inputs: dict, out: dict) -> None:
    from bgem3_embeddings.finetune import grad_cache_route
    from bgem3_embeddings.finetune.gradients import loss_and_gradients

    whole = _finetuner(no_dropout, case, sub_batch_size=None)
    out["saved_bytes/whole"] = np.array(_peak_saved_bytes(whole, lambda: loss_and_gradients(whole, inputs)))
    one_row = _finetuner(no_dropout, case, sub_batch_size=1)
    peak = _peak_saved_bytes(one_row, lambda: grad_cache_route.loss_and_gradients(one_row, inputs))
    out["saved_bytes/gc"] = np.array(peak)


def _peak_saved_bytes(finetuner: Any, step: Callable[[], Any]) -> int:
    """The most bytes torch's autograd held at once for backward (tensors saved by the graph), weights
    excluded: a tensor's bytes count from when the graph saves it until the graph lets it go."""
    import torch

    weights = {v.value.data_ptr() for v in finetuner.weights}
    live, peak = [0], [0]

    class Held:
        def __init__(self, tensor: Any) -> None:
            self.tensor = tensor

    def release(size: int) -> None:
        live[0] -= size

    def pack(tensor: Any) -> Any:
        if tensor.data_ptr() in weights:
            return tensor
        size = tensor.numel() * tensor.element_size()
        live[0] += size
        peak[0] = max(peak[0], live[0])
        held = Held(tensor)
        weakref.finalize(held, release, size)
        return held

    def unpack(held: Any) -> Any:
        return held.tensor if isinstance(held, Held) else held

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        step()
    return peak[0]


def main() -> None:
    backend, no_dropout, checkpoint, batches_path, out_path = sys.argv[1:6]
    os.environ["KERAS_BACKEND"] = backend
    if backend != "tensorflow":
        from tests.no_tensorflow import hide_tensorflow

        hide_tensorflow()
    with np.load(batches_path) as data:
        batches = {key: data[key] for key in data.files}
    np.savez(out_path, **run(Path(no_dropout), Path(checkpoint), batches))


if __name__ == "__main__":
    main()
