"""The learning rate over the steps: Hugging Face's default linear schedule with warmup.

`get_linear_schedule_with_warmup`: from 0 up to the peak over `warmup_steps`, then linearly down to 0 at
`total_steps`. Keras calls it with the optimizer's step count (steps done), the step number Hugging Face's
scheduler has when the same update is made.

    >>> schedule = LinearWarmupDecay(1e-4, warmup_steps=10, total_steps=100)
    >>> float(schedule(5)), float(schedule(55))
    (5e-05, 5e-05)
"""

from __future__ import annotations

from typing import Any

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="bgem3_embeddings")
class LinearWarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, peak: float, warmup_steps: int, total_steps: int) -> None:
        if total_steps < 1 or not 0 <= warmup_steps <= total_steps:
            raise ValueError(
                f"need 0 <= warmup_steps <= total_steps, total >= 1: {warmup_steps}, {total_steps}"
            )
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)

    def __call__(self, step: Any) -> Any:
        step = ops.cast(step, "float32")
        warmup = step / max(self.warmup_steps, 1)
        decay = ops.maximum(0.0, (self.total_steps - step) / max(self.total_steps - self.warmup_steps, 1))
        return self.peak * ops.where(step < self.warmup_steps, warmup, decay)

    def get_config(self) -> dict[str, Any]:
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "total_steps": self.total_steps}
