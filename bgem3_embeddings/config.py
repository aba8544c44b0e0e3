"""The network's sizes, read from a checkpoint's config.json.

One config object drives both the full BGE-M3 and the tiny test checkpoints, so they share one code path.

Example:
    >>> cfg = BGEM3Config.from_dict({"vocab_size": 1000, "hidden_size": 32, "num_hidden_layers": 2,
    ...                              "num_attention_heads": 4, "intermediate_size": 64})
    >>> cfg.head_dim
    8
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """config.json is missing, malformed or describes a network this implementation does not support."""


@dataclass(frozen=True)
class BGEM3Config:
    """Sizes of an XLM-RoBERTa encoder plus BGE-M3 heads. Defaults are BAAI/bge-m3's."""

    vocab_size: int = 250002
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    max_position_embeddings: int = 8194
    type_vocab_size: int = 1
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 1
    bos_token_id: int = 0
    eos_token_id: int = 2
    hidden_act: str = "gelu"
    # The BGE-M3 ColBERT head maps hidden -> hidden (1024 -> 1024).
    colbert_dim: int = 1024

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}"
            )
        if self.hidden_act != "gelu":
            # BGE-M3 uses exact erf GELU; other activations would silently change the outputs.
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported (only 'gelu', exact erf)")
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def max_sequence_length(self) -> int:
        """Longest input: position ids start at pad_token_id + 1, so two table rows are unusable."""
        return self.max_position_embeddings - self.pad_token_id - 1

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, colbert_dim: int | None = None) -> BGEM3Config:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        # A config.json without layer_norm_eps would otherwise get transformers' wrong 1e-12 default.
        kwargs.setdefault("layer_norm_eps", 1e-5)
        kwargs["colbert_dim"] = (
            colbert_dim if colbert_dim is not None else kwargs.get("hidden_size", cls.hidden_size)
        )
        try:
            return cls(**kwargs)
        except TypeError as err:
            raise ConfigError(f"bad config values: {err}") from err

    @classmethod
    def from_json_file(cls, path: str | Path) -> BGEM3Config:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as err:
            raise ConfigError(f"{path} does not exist: not a BGE-M3 checkpoint directory") from err
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path} is not valid JSON: {err}") from err
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a JSON object")
        model_type = data.get("model_type")
        if model_type not in (None, "xlm-roberta", "roberta"):
            raise ConfigError(f"{path}: model_type {model_type!r} is not an XLM-RoBERTa encoder")
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
