"""Keras' AdamW, its arithmetic unchanged, its transient memory cut (`bgem3 finetune --optimizer adamw`).

At full size (568M weights, 2.27 GB) Keras' own AdamW held model-sized temporaries beside the weights, their
gradients and the two moments, measured on one full fine-tuning step (docs/performance/finetune.md):

- its weight-decay pass runs at `weight_decay` 0 too (`w - w * 0 * lr`, the weight itself), allocating
  `w * 0 * lr` for every weight; skipped here at 0, where it can change nothing;
- on TensorFlow the update ops of all 391 weights sit in one graph with no order between them, and the
  executor ran them side by side: the temporaries of `g - m`, `g * g`, `sqrt(v)`, ... of many weights at
  once. Here each weight's update waits for the previous one's (control dependencies), so one weight's
  temporaries live at a time; the word-embedding gradient (IndexedSlices) is made dense once, not once per
  op that reads it;
- on PyTorch its global-norm clip makes a scaled copy of every gradient (here they are scaled in place), and
  its foreach update forms `g * g`, `sqrt(v) + eps` and `m * alpha` for every weight at once
  (three model-sized lists); here the same foreach update runs on groups of weights of at most
  `GROUP_BYTES`.

Every weight gets exactly the operations Keras gives it, in the same order (elementwise, so the grouping does
not change a bit): tests/test_finetune_optimizer.py checks the weights and moments equal Keras' AdamW's after
steps on each backend. JAX's step is one compiled XLA program whose buffers XLA plans itself: Keras' class
there, with only the weight-decay pass skipped at 0.
"""

from __future__ import annotations

from typing import Any

import keras

from bgem3_embeddings.backends.keras_backend import backend_name

# PyTorch: the foreach update's temporaries are three times a group's size (g * g, sqrt(v) + eps, m * alpha).
GROUP_BYTES = 64 << 20


def adamw(**kwargs: Any) -> keras.optimizers.Optimizer:
    """Keras' `AdamW(**kwargs)` on the backend in use, with the memory savings above. The classes are named
    AdamW as Keras' is, so the state's variables are named alike (adam_w/...): a state saved with Keras' own
    class resumes."""
    if backend_name() == "torch":
        return _torch_class()(**kwargs)
    return AdamW(**kwargs)


def decays(optimizer: Any) -> bool:
    """Whether the weight-decay pass changes anything: at weight_decay 0 (or None) `w - w * 0 * lr == w`."""
    return bool(optimizer.weight_decay)


class AdamW(keras.optimizers.AdamW):
    """Keras' AdamW on TensorFlow (one weight's update at a time) and JAX, without the weight-decay pass at
    weight_decay 0."""

    def _apply_weight_decay(self, variables: Any) -> None:
        if not decays(self):
            return
        if backend_name() != "tensorflow":
            super()._apply_weight_decay(variables)
            return
        _one_at_a_time(lambda v: super(AdamW, self)._apply_weight_decay([v]), list(variables))

    def _backend_update_step(self, grads: list, trainable_variables: list, learning_rate: Any) -> None:
        if backend_name() != "tensorflow":
            super()._backend_update_step(grads, trainable_variables, learning_rate)
            return
        _one_at_a_time(
            lambda pair: super(AdamW, self)._backend_update_step([_dense(pair[0])], [pair[1]], learning_rate),
            list(zip(grads, trainable_variables, strict=True)),
        )


def _dense(grad: Any) -> Any:
    """An IndexedSlices gradient as the dense tensor Keras' ops make of it (once, not once per op)."""
    import tensorflow as tf

    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


def _one_at_a_time(update: Any, items: list) -> None:
    """Call update(item) for each item; inside a traced function every op an update adds waits for all
    the ops the previous update added (outside one, eager ops run in order anyway)."""
    import tensorflow as tf

    if not tf.inside_function():
        for item in items:
            update(item)
        return
    graph = tf.compat.v1.get_default_graph()
    previous: list = []
    for item in items:
        start = len(graph.get_operations())
        with tf.control_dependencies(previous):
            update(item)
        previous = graph.get_operations()[start:]


def _torch_class() -> type:
    """Keras' PyTorch AdamW (its foreach update; `keras.optimizers.AdamW` turns into it on torch), updating
    groups of at most GROUP_BYTES."""
    import torch
    from keras import ops
    from keras.src.backend.torch.optimizers import torch_adamw  # the class keras.optimizers.AdamW becomes
    from keras.src.optimizers.base_optimizer import global_norm  # the norm Keras' clip_by_global_norm takes

    class AdamW(torch_adamw.AdamW):
        def _apply_weight_decay(self, variables: Any) -> None:
            if decays(self):
                super()._apply_weight_decay(variables)

        @torch.no_grad()
        def _clip_gradients(self, grads: list) -> list:
            """Keras' global-norm clip (its norm, its scale) multiplied into the gradients in place, where
            Keras makes a scaled copy of every one (2.27 GB at full size) beside them."""
            if self.clipnorm or not self.global_clipnorm or any(g is None for g in grads):
                return super()._clip_gradients(grads)
            norm = global_norm(grads)
            scale = self.global_clipnorm * ops.minimum(1.0 / norm, 1.0 / self.global_clipnorm)
            torch._foreach_mul_(grads, scale + (norm - norm))  # as Keras: NaN for a non-finite norm
            return grads

        @torch.no_grad()
        def _backend_update_step(self, grads: list, trainable_variables: list, learning_rate: Any) -> None:
            for start, stop in _groups([g.numel() * g.element_size() for g in grads], GROUP_BYTES):
                self._parallel_update_step(grads[start:stop], trainable_variables[start:stop], learning_rate)

    return AdamW


def _groups(sizes: list[int], limit: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of consecutive items, each of at most `limit` bytes (an item above it alone).

    >>> _groups([10, 10, 30, 5], 20)
    [(0, 2), (2, 3), (3, 4)]
    """
    ranges, start, total = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > limit:
            ranges.append((start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        ranges.append((start, len(sizes)))
    return ranges
