"""What `fit()` reads: training batches as dicts of arrays, one `keras.utils.PyDataset` item per step.

The order of steps is fixed by the seed (data.epoch_batches), and each step's sampling (which positive, which
negatives) by the seed and the step number alone: a run resumed at step k sees exactly the batches a run
never stopped saw from step k on, whatever happened before.

    >>> source = StepBatches(plan, make_batch, start_step=0)
    >>> source[0]["query_input_ids"].shape  # doctest: +SKIP
    (16, 32)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np

from bgem3_embeddings.backends.keras_backend import backend_name
from bgem3_embeddings.finetune.batches import TrainBatch


def model_inputs(batch: TrainBatch, step: int) -> dict[str, np.ndarray]:
    """A TrainBatch as M3Finetuner's input dict; `step` is the number of steps before this one."""
    inputs = {
        "query_input_ids": batch.query_input_ids.astype(np.int32),
        "query_attention_mask": batch.query_attention_mask.astype(np.int32),
        "passage_input_ids": batch.passage_input_ids.astype(np.int32),
        "passage_attention_mask": batch.passage_attention_mask.astype(np.int32),
        "step": np.full((batch.batch_size,), step, dtype=np.int32),
        "no_in_batch_neg": np.full((batch.batch_size,), int(batch.no_in_batch_neg), dtype=np.int32),
    }
    if batch.teacher_scores is not None:
        inputs["teacher_scores"] = batch.teacher_scores.astype(np.float32)
    return inputs


class StepBatches(keras.utils.PyDataset):
    """Steps `start_step` .. `len(plan) - 1` of a training plan: item i is step start_step + i.

    `plan[k]` names the examples of step k; `make_batch(k, plan[k])` samples and tokenizes them, and
    `to_inputs(batch, k)` makes the model's input dict (the embedder's by default; the reranker's batches
    have their own). A batch has `.tokens`, its real tokens.
    """

    def __init__(
        self,
        plan: Sequence[Any],
        make_batch: Callable[[int, Any], Any],
        *,
        start_step: int = 0,
        to_inputs: Callable[[Any, int], dict[str, np.ndarray]] = model_inputs,
    ) -> None:
        super().__init__(workers=1, use_multiprocessing=False)
        if not 0 <= start_step <= len(plan):
            raise ValueError(f"start_step {start_step} is outside the plan's {len(plan)} steps")
        self.plan = plan
        self.make_batch = make_batch
        self.to_inputs = to_inputs
        self.start_step = start_step
        self.tokens: dict[int, int] = {}  # step -> its batch's real tokens (tokens/s)

    def __len__(self) -> int:
        return len(self.plan) - self.start_step

    def __getitem__(self, index: int) -> Any:
        step = self.start_step + index
        batch = self.make_batch(step, self.plan[step])
        self.tokens[step] = batch.tokens
        return self.to_inputs(batch, step)


def fit_input(source: StepBatches) -> Any:
    """What `fit()` is given: the PyDataset itself on JAX and PyTorch; on TensorFlow a tf.data pipeline over
    it whose every dimension is unknown. Keras' own adapter fixes the lengths of the first batches it peeks
    at (a later batch of other lengths then fails), and each step's lengths are its batch's longest text."""
    if backend_name() != "tensorflow":
        return source
    import tensorflow as tf

    first = source[0]
    signature = {
        name: tf.TensorSpec((None,) * value.ndim, tf.as_dtype(value.dtype)) for name, value in first.items()
    }
    return tf.data.Dataset.from_generator(
        lambda: (source[i] for i in range(len(source))), output_signature=signature
    )
