"""LoRA adapters on the encoder's projections, from Keras' own `Dense.enable_lora`.

Each layer's query, key, value, attention output, intermediate and output projections get a frozen kernel
plus two trainable factors (rank r, scaled by alpha / r). The heads (colbert_linear, sparse_linear) train
whole by default; with `heads=True` they get factors too (see `enable_lora`). The saved model holds the
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
# The heads `enable_lora(..., heads=True)` adapts, by their attribute (and layer) names on BGEM3Model.
HEADS = ("colbert_linear", "sparse_linear")


def projections(model: BGEM3Model) -> list[tuple[str, Any]]:
    """(layer_N/name, Dense layer) for every adapted projection."""
    return [
        (f"{block.name}/{name}", getattr(block, name)) for block in model.encoder_layers for name in TARGETS
    ]


def head_layers(model: BGEM3Model) -> list[tuple[str, Any]]:
    """(name, Dense layer) for each head the model has (the reranker has none)."""
    return [(name, getattr(model, name)) for name in HEADS if hasattr(model, name)]


def adapted(model: BGEM3Model) -> list[tuple[str, Any]]:
    """(name, layer) for every layer that carries factors: the projections, then the heads given LoRA."""
    return projections(model) + [(n, layer) for n, layer in head_layers(model) if layer.lora_enabled]


def head_rank(units: int, rank: int) -> int:
    """The factors' rank on a head of `units` outputs: a (in, units) update has rank <= units, so a
    1-unit head (sparse_linear) gets rank 1 (A (in, 1), B (1, 1)); more would only add parameters."""
    return min(rank, units)


def enable_lora(
    model: BGEM3Model, rank: int, alpha: float | None = None, seed: int = 0, *, heads: bool = False
) -> None:
    """Adapters of `rank` (alpha defaults to rank: a scale of 1) on every projection; A starts He-uniform
    from `seed` (one stream per layer, no global random state), B at zero, as Keras does.

    heads=False (`bgem3 finetune --lora-rank`'s default): the heads are left alone, to train whole under
    --unified-finetuning (they are small: the full update costs little). heads=True: colbert_linear and
    sparse_linear get factors too, of `head_rank` and the same scale alpha / rank, their kernels and biases
    frozen: use it where only adapter factors may leave the machine (federated tuning) and the sparse and
    ColBERT modes must still learn. Either way the saved model holds the merged kernels.
    """
    alpha = alpha if alpha is not None else float(rank)
    layers = [layer for _, layer in projections(model) + (head_layers(model) if heads else [])]
    for i, layer in enumerate(layers):
        r = head_rank(layer.units, rank) if layer.name in HEADS else rank
        layer.enable_lora(
            r,
            lora_alpha=alpha if r == rank else alpha / rank * r,  # Keras scales by lora_alpha / r
            a_initializer=keras.initializers.HeUniform(seed=seed * 1009 + i),
        )


def _constant(value: np.ndarray) -> Callable[[], np.ndarray]:
    return lambda: value


def _factors(model: BGEM3Model) -> list[tuple[str, Any]]:
    """(layer_N/name/lora_a | lora_b, variable) for every adapted projection (then head/lora_a | lora_b
    for each head with factors), in a fixed order."""
    return [
        (f"{name}/{factor}", variable)
        for name, layer in adapted(model)
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
    """The adapters alone into `folder`: factors A (in, r) and B (r, out) per adapted layer, and their
    config (`targets`: the projections, plus the heads when they carry factors; `ranks` per head)."""
    tensors = [
        PendingTensor(name, tuple(value.shape), np.dtype(np.float32), _constant(value))
        for name, value in adapter_arrays(model).items()
    ]
    with open(folder / ADAPTER_FILE, "wb") as out:
        write_safetensors(out, tensors, {"format": "bgem3-lora"})
    config = {
        "rank": options.lora_rank,
        "alpha": options.lora_alpha or float(options.lora_rank),
        "targets": list(TARGETS) + [name for name, layer in head_layers(model) if layer.lora_enabled],
        "head_ranks": {name: layer.lora_rank for name, layer in head_layers(model) if layer.lora_enabled},
        "base_model": options.model,
    }
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=1), encoding="utf-8")
