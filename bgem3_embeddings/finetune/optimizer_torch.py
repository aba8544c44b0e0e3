"""finetune/optimizer.py's AdamW on PyTorch: Keras' class, its clip in place and its update in groups."""

from __future__ import annotations

from typing import Any

from bgem3_embeddings.finetune import optimizer_groups


def adamw_class() -> type:
    """Keras' PyTorch AdamW (its foreach update; `keras.optimizers.AdamW` turns into it on torch), updating
    groups of at most optimizer_groups.GROUP_BYTES."""
    import torch
    from keras import ops
    from keras.src.backend.torch.optimizers import torch_adamw  # the class keras.optimizers.AdamW becomes
    from keras.src.optimizers.base_optimizer import global_norm  # the norm Keras' clip_by_global_norm takes

    class AdamW(torch_adamw.AdamW):
        def _apply_weight_decay(self, variables: Any) -> None:
            if optimizer_groups.decays(self):
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
            sizes = [g.numel() * g.element_size() for g in grads]
            for start, stop in optimizer_groups.groups(sizes, optimizer_groups.GROUP_BYTES):
                self._parallel_update_step(grads[start:stop], trainable_variables[start:stop], learning_rate)

    return AdamW
