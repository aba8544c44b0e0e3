"""Keras' AdamW and finetune/optimizer.py's side by side on one Keras backend, in a process of its own.

    python -m tests.finetune_optimizer_worker BACKEND WEIGHT_DECAY CLIPNORM|none OUT.npz

A small model with an embedding table (on TensorFlow its gradient is IndexedSlices, as the word
embeddings' are) and two dense layers is trained STEPS steps of `train_on_batch` (compiled: TensorFlow's
traced step, JAX's jitted one) from the same initial weights, once with each optimizer (global norm clip
CLIPNORM, decay excluded from the biases as bgem3 finetune does; on TensorFlow the clip hands the update a
dense gradient, without it the table's update sums the IndexedSlices itself). OUT.npz gets `keras/NAME`
and `ours/NAME` for every weight and optimizer variable after the steps.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

STEPS = 3
VOCAB, WIDTH = 64, 16


def train(make_optimizer: Any, weight_decay: float, clipnorm: float | None) -> dict[str, np.ndarray]:
    import keras

    keras.utils.set_random_seed(0)
    ids = keras.Input((5,), dtype="int32")
    hidden = keras.layers.Embedding(VOCAB, WIDTH, name="emb")(ids)
    hidden = keras.layers.Dense(WIDTH, activation="tanh", name="d1")(hidden)
    out = keras.layers.Dense(1, name="d2")(keras.ops.mean(hidden, axis=1))
    model = keras.Model(ids, out)
    optimizer = make_optimizer(
        learning_rate=0.05, weight_decay=weight_decay, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
        global_clipnorm=clipnorm,
    )  # fmt: skip
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(1)
    for _ in range(STEPS):
        # Half the table gets no gradient; a batch's ids are distinct, as bgem3 finetune's TensorFlow step
        # hands the optimizer one row per index (finetune/step_tf.py): Keras' own squares duplicates apart.
        x = rng.permutation(VOCAB // 2)[:30].reshape(6, 5).astype("int32")
        model.train_on_batch(x, rng.normal(size=(6, 1)).astype("float32"))
    variables = [*model.weights, *optimizer.variables]
    return {v.path: keras.ops.convert_to_numpy(v) for v in variables}


def main() -> None:
    backend, weight_decay, out = sys.argv[1], float(sys.argv[2]), sys.argv[4]
    clipnorm = None if sys.argv[3] == "none" else float(sys.argv[3])
    os.environ["KERAS_BACKEND"] = backend
    import keras

    from bgem3_embeddings.finetune import optimizer_groups
    from bgem3_embeddings.finetune.optimizer import adamw

    optimizer_groups.GROUP_BYTES = 1024  # PyTorch: the update in groups; TensorFlow: the table by rows

    theirs = train(keras.optimizers.AdamW, weight_decay, clipnorm)
    keras.backend.clear_session()  # the same variable names in both runs
    ours = train(adamw, weight_decay, clipnorm)
    arrays: dict[str, Any] = {f"keras/{k}": v for k, v in theirs.items()}
    arrays.update({f"ours/{k}": v for k, v in ours.items()})
    np.savez(out, **arrays)


if __name__ == "__main__":
    main()
