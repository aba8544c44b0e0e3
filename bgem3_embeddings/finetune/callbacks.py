"""What happens around the steps of `fit()`: checkpoints, Ctrl-C, the JSON log, the sparse-collapse warning.

Each is a `keras.callbacks.Callback`; `trainer.run_finetune` installs them. Step numbers here are global
(steps completed since the run's first start), so a resumed run carries on counting.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import keras
from keras import ops

logger = logging.getLogger(__name__)

# The share of all-zero sparse vectors that counts as a collapse, and the rise over the run's first steps.
COLLAPSE_SHARE = 0.5
COLLAPSE_RISE = 0.2


class StopOnSignal(keras.callbacks.Callback):
    """Ctrl-C stops after the step in progress (never inside one), so the state saved is a whole step's."""

    def __init__(self) -> None:
        super().__init__()
        self.requested = False
        self.steps_done = 0

    def request(self, signum: int, frame: Any) -> None:
        self.requested = True

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.steps_done = batch + 1
        if self.requested:
            self.model.stop_training = True


class CheckpointEvery(keras.callbacks.Callback):
    """run.save(step) every `save_steps` global steps (the final save is the trainer's)."""

    def __init__(self, run: Any, save_steps: int, start: int) -> None:
        super().__init__()
        self.run, self.save_steps, self.start = run, save_steps, start

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        step = self.start + batch + 1
        if step % self.save_steps == 0 and not self.model.stop_training:
            self.run.save(step)


class SparseCollapseWarning(keras.callbacks.Callback):
    """One warning line when the share of all-zero sparse vectors grows into a collapse
    (FlagEmbedding #982)."""

    def __init__(self, unified: bool) -> None:
        super().__init__()
        self.unified = unified
        self.first: float | None = None
        self.warned = False

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if not self.unified or logs is None or "sparse_zero_share" not in logs or self.warned:
            return
        share = float(logs["sparse_zero_share"])
        if self.first is None:
            self.first = share
        elif share >= COLLAPSE_SHARE and share - self.first >= COLLAPSE_RISE:
            self.warned = True
            logger.warning(
                "the sparse vectors are collapsing: %.0f%% of passages have no lexical weight left "
                "(%.0f%% at "
                "the start); a lower --learning-rate or dense-only training keeps them",
                share * 100,
                self.first * 100,
            )


class JsonLog(keras.callbacks.Callback):
    """One JSON object per step: step, loss and each term, learning rate, tokens/s, sparse_zero_share.

    The terms are the step's own (train_model.LastValue); the learning rate is the one the step used.
    """

    def __init__(
        self, path: Path | None, source: Any, start: int, schedule: Any, history: list, *, resume: bool
    ) -> None:
        super().__init__()
        self.path, self.source, self.start, self.schedule, self.history = (
            path,
            source,
            start,
            schedule,
            history,
        )
        self.out = None if path is None else open(path, "a" if resume else "w", encoding="utf-8")  # noqa: SIM115
        self.clock = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        now = time.perf_counter()
        seconds, self.clock = now - self.clock, now
        step = self.start + batch + 1
        record: dict[str, Any] = {"step": step}
        record |= {name: float(value) for name, value in (logs or {}).items()}
        record["learning_rate"] = float(ops.convert_to_numpy(self.schedule(step - 1)))
        tokens = self.source.tokens.get(step - 1, 0)
        record["tokens_per_s"] = tokens / seconds if seconds > 0 else 0.0
        self.history.append(record)
        if self.out is not None:
            self.out.write(json.dumps(record) + "\n")
            self.out.flush()

    def on_train_end(self, logs: dict | None = None) -> None:
        if self.out is not None:
            self.out.close()
