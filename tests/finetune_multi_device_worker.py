"""Our M3 loss, its gradients and one `fit()` step on two virtual CPU devices (Keras' DataParallel on JAX),
and the same on one device, in a process of its own.

    python -m tests.finetune_multi_device_worker CHECKPOINT BATCH.npz OUT.npz

XLA is asked for two host devices and Keras for JAX before anything imports either. BATCH.npz holds one
batch of QUERIES (FlagEmbedding's collator made it); for every case of CASES, OUT.npz gets under
`{case}/two/` the loss terms and gradients (under Hugging Face names) of the step on two devices, whose
inputs are split between the devices as `fit()` splits them, and under `{case}/one/` those of the
single-device run that must equal it; for FIT_CASE also the weights after one SGD step of `fit()` on each.
tests/test_finetune_multi_device.py holds them to each other and to FlagEmbedding.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

DEVICES = 2
GROUP_SIZE = 2
# Four queries, two per device; each with its positive and one negative.
QUERIES = [
    (
        "what is bge m3 😀 and how is it trained",
        ["bge m3 is an embedding model 東京は日本の首都です", "bm25 is bag of words"],
    ),
    ("definition of bm25 bm25", ["bm25 ranks documents by query terms", "the the the the the"]),
    (
        "colbert late interaction",
        ["colbert scores every query token against every passage token", "cats e\u0301"],
    ),
    ("sparse lexical weights", ["a weight for each token of the text", "dense retrieval with bge m3"]),
]
# (name, FlagEmbedding's model keyword arguments, negatives_cross_device, the single-device run's blocks):
# the single-device run is the whole batch in one block where the two-device run's loss is the whole
# batch's (the dense loss across devices); where some terms are per device, it forms them per half too.
CASES: list[tuple[str, dict[str, Any], bool, int]] = [
    ("dense_cross_device", {}, True, 1),
    ("unified_cross_device", {"unified_finetuning": True, "use_self_distill": True}, True, DEVICES),
    ("dense_per_device", {}, False, DEVICES),
]
FIT_CASE = "dense_cross_device"
SGD_LEARNING_RATE = 0.5


def _finetuner(checkpoint: Path, model_kwargs: dict[str, Any], cross_device: bool, devices: int) -> Any:
    from bgem3_embeddings.checkpoint.files import checkpoint_files_in
    from bgem3_embeddings.finetune.train_model import M3Finetuner
    from bgem3_embeddings.loading import build_model
    from tests.finetune_worker import loss_settings

    model, _ = build_model(checkpoint_files_in(checkpoint), precision="float32", weights_cache=False)
    return M3Finetuner(
        model,
        loss_settings(model_kwargs, False),
        group_size=GROUP_SIZE,
        devices=devices,
        negatives_cross_device=cross_device,
    )


def _loss_and_gradients(finetuner: Any, inputs: dict[str, Any]) -> tuple[dict, list]:
    """The loss terms and gradients of a jitted step, as `fit()`'s step is compiled."""
    import jax

    non_trainable = [v.value for v in finetuner.non_trainable_variables]

    def loss(trainable: list, data: dict) -> tuple[Any, dict]:
        terms, _ = finetuner.stateless_call(trainable, non_trainable, data, training=True)
        return terms["loss"], terms

    trainable = [v.value for v in finetuner.trainable_variables]
    (_, terms), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(trainable, inputs)
    return terms, list(grads)


def _split(inputs: dict[str, np.ndarray]) -> tuple[dict[str, Any], np.ndarray]:
    """The inputs placed as DataParallel places a batch (rows split between the devices), and the devices
    and row count of each input's shards."""
    import keras

    distribution = keras.distribution.distribution()
    placed = {
        name: keras.distribution.distribute_tensor(value, distribution.get_data_layout(value.shape))
        for name, value in inputs.items()
    }
    shards = np.array(
        [
            [len(value.sharding.device_set), value.addressable_shards[0].data.shape[0]]
            for value in placed.values()
        ]
    )
    return placed, shards


def _record(out: dict, prefix: str, finetuner: Any, names: dict, terms: dict, grads: list) -> None:
    import keras

    for term, value in terms.items():
        out[f"{prefix}/term/{term}"] = np.asarray(keras.ops.convert_to_numpy(value))
    for variable, grad in zip(finetuner.trainable_variables, grads, strict=True):
        hf_name, transposed = names[variable.path]
        value = np.asarray(grad, np.float32)
        out[f"{prefix}/grad/{hf_name}"] = value.T if transposed else value


def _fit_step(finetuner: Any, names: dict, inputs: dict, out: dict, prefix: str) -> None:
    """One `fit()` step of plain SGD: the weights after it move by exactly the learning rate times the
    gradient `fit()` took."""
    import keras

    from tests.finetune_exactness import one_batch

    finetuner.compile(optimizer=keras.optimizers.SGD(SGD_LEARNING_RATE))
    history = finetuner.fit(one_batch(inputs), epochs=1, verbose=0)
    out[f"{prefix}/fit_loss"] = np.array(history.history["loss"][-1])
    for variable in finetuner.encoder.weights:
        hf_name, transposed = names[variable.path]
        value = np.asarray(keras.ops.convert_to_numpy(variable.value), np.float32)
        out[f"{prefix}/after_sgd/{hf_name}"] = value.T if transposed else value


def run(checkpoint: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import jax

    from bgem3_embeddings.finetune import data_parallel
    from bgem3_embeddings.finetune.options import FinetuneOptions
    from tests.finetune_worker import hf_names

    out: dict[str, np.ndarray] = {"device_count": np.array(jax.device_count())}
    # one device first: no distribution, every variable on the first device
    for name, model_kwargs, cross_device, blocks in CASES:
        finetuner = _finetuner(checkpoint, model_kwargs, cross_device, blocks)
        names = hf_names(finetuner.encoder)
        _record(out, f"{name}/one", finetuner, names, *_loss_and_gradients(finetuner, inputs))
        if name == FIT_CASE:
            _fit_step(finetuner, names, inputs, out, f"{name}/one")
    # then both, as `bgem3 finetune --data-parallel` sets them up before any variable exists
    options = FinetuneOptions(train_data=(), model=str(checkpoint), output_dir=checkpoint, data_parallel=True)
    out["parallel_devices"] = np.array(data_parallel.start(options).devices)
    for name, model_kwargs, cross_device, _ in CASES:
        finetuner = _finetuner(checkpoint, model_kwargs, cross_device, DEVICES)
        names = hf_names(finetuner.encoder)
        placed, out[f"{name}/shards"] = _split(inputs)
        _record(out, f"{name}/two", finetuner, names, *_loss_and_gradients(finetuner, placed))
        if name == FIT_CASE:
            _fit_step(finetuner, names, inputs, out, f"{name}/two")
    return out


def main() -> None:
    checkpoint, batch_path, out_path = sys.argv[1:4]
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
    os.environ["KERAS_BACKEND"] = "jax"
    from tests.no_tensorflow import hide_tensorflow

    hide_tensorflow()
    with np.load(batch_path) as data:
        inputs = {key: data[key] for key in data.files}
    np.savez(out_path, **run(Path(checkpoint), inputs))


if __name__ == "__main__":
    main()
