"""Keras' AdamW, its arithmetic unchanged, its transient memory cut (`bgem3 finetune --optimizer adamw`).

At full size (568M weights, 2.27 GB) Keras' own AdamW held model-sized temporaries beside the weights, their
gradients and the two moments, measured on one full fine-tuning step (docs/performance/finetune.md):

- its weight-decay pass runs at `weight_decay` 0 too (`w - w * 0 * lr`, the weight itself), allocating
  `w * 0 * lr` for every weight; skipped here at 0, where it can change nothing;
- on TensorFlow the update ops of all 391 weights sit in one graph with no order between them, and the
  executor ran them side by side: the temporaries of `g - m`, `g * g`, `sqrt(v)`, ... of many weights at
  once. Here each weight's update waits for the previous one's, and a weight above `GROUP_BYTES` (the
  250,002 x 1,024 word-embedding table, 1 GiB) is updated in blocks of rows, its IndexedSlices gradient
  summed per block, so no temporary is the table's size (optimizer_tf.py);
- on PyTorch its global-norm clip makes a scaled copy of every gradient (here they are scaled in place), and
  its foreach update forms `g * g`, `sqrt(v) + eps` and `m * alpha` for every weight at once
  (three model-sized lists); here the same foreach update runs on groups of weights of at most
  `GROUP_BYTES` (optimizer_torch.py).

Every weight gets exactly the operations Keras gives it, in the same order (elementwise, so the grouping does
not change a bit): tests/test_finetune_optimizer.py checks the weights and moments equal Keras' AdamW's after
steps on each backend. JAX's step is one compiled XLA program whose buffers XLA plans itself: Keras' class
there, with only the weight-decay pass skipped at 0.
"""

from __future__ import annotations

from typing import Any

import keras

from bgem3_embeddings.backends.keras_backend import backend_name
from bgem3_embeddings.finetune import optimizer_groups
from bgem3_embeddings.finetune.optimizer_groups import decays


def adamw(**kwargs: Any) -> keras.optimizers.Optimizer:
    """Keras' `AdamW(**kwargs)` on the backend in use, with the memory savings above. The classes are named
    AdamW as Keras' is, so the state's variables are named alike (adam_w/...): a state saved with Keras' own
    class resumes."""
    if backend_name() == "torch":
        from bgem3_embeddings.finetune.optimizer_torch import adamw_class

        return adamw_class()(**kwargs)
    return AdamW(**kwargs)


class AdamW(keras.optimizers.AdamW):
    """Keras' AdamW on TensorFlow (one weight's update at a time, a large one by blocks of rows) and JAX,
    without the weight-decay pass at weight_decay 0."""

    def _apply_weight_decay(self, variables: Any) -> None:
        if not decays(self):
            return
        if backend_name() != "tensorflow":
            super()._apply_weight_decay(variables)
            return
        from bgem3_embeddings.finetune.optimizer_tf import one_at_a_time

        one_at_a_time(lambda v: super(AdamW, self)._apply_weight_decay([v]), list(variables))

    def _backend_update_step(self, grads: list, trainable_variables: list, learning_rate: Any) -> None:
        if backend_name() != "tensorflow":
            super()._backend_update_step(grads, trainable_variables, learning_rate)
            return
        from bgem3_embeddings.finetune.optimizer_tf import one_at_a_time, to_dense

        def update(pair: tuple) -> None:
            grad, variable = pair
            if not self._in_row_blocks(variable):
                grad = to_dense(grad)  # once, not once per op of the update that reads it
            super(AdamW, self)._backend_update_step([grad], [variable], learning_rate)

        one_at_a_time(update, list(zip(grads, trainable_variables, strict=True)))

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        if not self._in_row_blocks(variable):
            super().update_step(gradient, variable, learning_rate)
            return
        from bgem3_embeddings.finetune.optimizer_tf import update_in_row_blocks

        update_in_row_blocks(self, gradient, variable, learning_rate, optimizer_groups.GROUP_BYTES)

    def _in_row_blocks(self, variable: Any) -> bool:
        """TensorFlow updates a weight above GROUP_BYTES by blocks of rows (Adam's update without amsgrad)."""
        from bgem3_embeddings.finetune.optimizer_tf import size_in_bytes

        limit = optimizer_groups.GROUP_BYTES
        return backend_name() == "tensorflow" and not self.amsgrad and size_in_bytes(variable) > limit
