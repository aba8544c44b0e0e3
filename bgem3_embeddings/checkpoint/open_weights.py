"""Opening a checkpoint's weights by file name: a safetensors file, a sharded index, a torch zip, a folder.

Kept apart from `tensor_source` (the interface both readers implement) so that no module imports one that
imports it back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bgem3_embeddings.checkpoint.safetensors_reader import SafetensorsFile
from bgem3_embeddings.checkpoint.tensor_source import (
    TORCH_SUFFIXES,
    CheckpointFormatError,
    ShardedTensorSource,
    TensorSource,
)
from bgem3_embeddings.checkpoint.torch_pickle import TorchZipFile

# Preference order when `open_tensor_source` is given a directory (same as transformers).
_DIRECTORY_CANDIDATES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def _read_weight_map(index_path: Path) -> dict[str, str]:
    """The `weight_map` of a sharded-checkpoint index json, validated."""
    try:
        index: Any = json.loads(index_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointFormatError(f"{index_path}: cannot read the shard index json: {e}") from e
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise CheckpointFormatError(f"{index_path}: shard index has no 'weight_map' of name -> file name")
    return weight_map


def open_tensor_source(path: Path | str) -> TensorSource:
    """Open a checkpoint file by name: *.safetensors, *.index.json (sharded), *.bin/*.pt/*.pth (torch zip).

    A directory opens its encoder weights, preferring model.safetensors, then the sharded safetensors
    index, then pytorch_model.bin (and its index).
    """
    path = Path(path)
    if path.is_dir():
        for candidate in _DIRECTORY_CANDIDATES:
            if (path / candidate).is_file():
                return open_tensor_source(path / candidate)
        raise CheckpointFormatError(
            f"{path}: no encoder weights found (looked for {', '.join(_DIRECTORY_CANDIDATES)})"
        )
    if not path.is_file():
        raise CheckpointFormatError(f"{path}: checkpoint file does not exist")
    name = path.name
    if name.endswith(".index.json"):
        return ShardedTensorSource(path, _read_weight_map(path), open_tensor_source)
    if name.endswith(".safetensors"):
        return SafetensorsFile(path)
    if name.endswith(TORCH_SUFFIXES):
        return TorchZipFile(path)
    raise CheckpointFormatError(
        f"{path}: unknown checkpoint file type (expected .safetensors, .index.json, .bin, .pt or .pth)"
    )
