"""LoRA adapters on the encoder's projections, from Keras' own `Dense.enable_lora`.

Each layer's query, key, value, attention output, intermediate and output projections get a frozen kernel
plus two trainable factors (rank r, scaled by alpha / r); the heads train whole. The saved model holds the
merged kernels (what FlagEmbedding and every command load); `--save-adapter` also writes the factors alone,
a small file (`adapter_model.safetensors` + `adapter_config.json`), for whoever wants to ship only them.

    >>> enable_lora(model, rank=8)
    >>> sum(v.numpy().size for v in model.trainable_variables if "lora" in v.path)  # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
from keras import ops

from bgem3_embeddings.checkpoint.safetensors_writer import PendingTensor, write_safetensors
from bgem3_embeddings.model import BGEM3Model

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
# The projections LoRA adapts in every layer (TransformerBlock's Dense layers), by their stable names.
TARGETS = ("query", "key", "value", "attention_output", "intermediate", "output_dense")


def projections(model: BGEM3Model) -> list[tuple[str, Any]]:
    """(layer_N/name, Dense layer) for every adapted projection."""
    return [
        (f"{block.name}/{name}", getattr(block, name)) for block in model.encoder_layers for name in TARGETS
    ]


def enable_lora(model: BGEM3Model, rank: int, alpha: float | None = None, seed: int = 0) -> None:
    """Adapters of `rank` (alpha defaults to rank: a scale of 1) on every projection; A starts He-uniform
    from `seed` (one stream per projection, no global random state), B at zero, as Keras does."""
    for i, (_, layer) in enumerate(projections(model)):
        layer.enable_lora(
            rank,
            lora_alpha=alpha if alpha is not None else float(rank),
            a_initializer=keras.initializers.HeUniform(seed=seed * 1009 + i),
        )


def _constant(value: np.ndarray) -> Callable[[], np.ndarray]:
    return lambda: value


def _factors(model: BGEM3Model) -> list[tuple[str, Any]]:
    """(layer_N/name/lora_a | lora_b, variable) for every adapted projection, in a fixed order."""
    return [
        (f"{name}/{factor}", variable)
        for name, layer in projections(model)
        for factor, variable in (("lora_a", layer.lora_kernel_a), ("lora_b", layer.lora_kernel_b))
    ]


def adapter_arrays(model: BGEM3Model) -> dict[str, np.ndarray]:
    """The adapters alone, as float32 arrays named like the saved file's tensors: A (in, r), B (r, out)."""
    return {name: np.asarray(ops.convert_to_numpy(v.value), np.float32) for name, v in _factors(model)}


def load_adapter_arrays(model: BGEM3Model, arrays: dict[str, np.ndarray]) -> None:
    """Set a LoRA-enabled model's factors from `arrays` (as `adapter_arrays` names them): every factor must
    be there with its shape, and nothing else (a base weight or another rank is refused: ValueError)."""
    factors = dict(_factors(model))
    if set(arrays) != set(factors):
        unknown, missing = sorted(set(arrays) - set(factors)), sorted(set(factors) - set(arrays))
        raise ValueError(
            f"adapter arrays do not match the model: unknown {unknown[:3]}, missing {missing[:3]}"
        )
    for name, variable in factors.items():
        if tuple(arrays[name].shape) != tuple(variable.shape):
            raise ValueError(
                f"adapter array {name}: shape {arrays[name].shape}, the model's {tuple(variable.shape)}"
            )
        variable.assign(np.asarray(arrays[name], np.float32))


def write_adapter(model: BGEM3Model, folder: Path, options: Any) -> None:
    """The adapters alone into `folder`: factors A (in, r) and B (r, out) per projection, and their config."""
    tensors = [
        PendingTensor(name, tuple(value.shape), np.dtype(np.float32), _constant(value))
        for name, value in adapter_arrays(model).items()
    ]
    with open(folder / ADAPTER_FILE, "wb") as out:
        write_safetensors(out, tensors, {"format": "bgem3-lora"})
    config = {
        "rank": options.lora_rank,
        "alpha": options.lora_alpha or float(options.lora_rank),
        "targets": list(TARGETS),
        "base_model": options.model,
    }
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=1), encoding="utf-8")
