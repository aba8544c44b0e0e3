"""The Keras peer in `bgem3 bench`: KerasHub's XLMRobertaBackbone with CLS pooling and L2 normalisation.

KerasHub (keras-hub 0.32) loads `hf://BAAI/bge-m3` through huggingface_hub and converts the transformers
weights itself. The bench points it at a local Hugging Face cache whose `BAAI/bge-m3` snapshot is the bench's
own checkpoint (symbolic links, no copy) and sets HF_HUB_OFFLINE, so nothing is downloaded and both sides
run the same weights. Only the backbone is loaded: KerasHub's tokenizer wants sentencepiece.bpe.model, and
the bench feeds both engines the same token ids anyway. XLMRobertaTextEmbedder(pooling_mode="cls") adds
what BGE-M3's dense output is (the <s> state, L2-normalised), as KerasHub's own bge_m3 preset does.

keras-hub is installed with `pip install --no-deps keras-hub==0.32.0`: its declared dependencies include
tensorflow-text, which would pin (and so change) TensorFlow; it imports without it.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any

HUB_ID = "BAAI/bge-m3"
# What KerasHub's transformers loader reads for an XLM-RoBERTa backbone.
NEEDED_FILES = ("config.json", "model.safetensors")


def hf_cache_for(checkpoint: str | Path, cache_root: str | Path, repo_id: str = HUB_ID) -> Path:
    """A Hugging Face cache under `cache_root` whose `repo_id` snapshot links to `checkpoint`'s files.

    The layout is huggingface_hub's (models--ORG--NAME/snapshots/REV, refs/main); REV is derived from the
    checkpoint's path, so two checkpoints never share a snapshot. Returns the cache root.
    """
    source = Path(checkpoint).resolve()
    missing = [name for name in NEEDED_FILES if not (source / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"KerasHub loads {', '.join(NEEDED_FILES)}; {source} lacks {', '.join(missing)}"
        )
    root = Path(cache_root)
    repo = root / ("models--" + repo_id.replace("/", "--"))
    revision = hashlib.sha1(str(source).encode()).hexdigest()
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        link = snapshot / item.name
        if item.is_file() and not link.exists():
            link.symlink_to(item)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return root


def use_offline_cache(cache_root: Path) -> None:
    """Make huggingface_hub read `cache_root` and never go online, whether it is imported yet or not."""
    os.environ["HF_HUB_CACHE"] = str(cache_root)
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:  # imported already: its module-level settings were read from the old env
        constants.HF_HUB_CACHE = str(cache_root)  # type: ignore[attr-defined]
        constants.HF_HUB_OFFLINE = True  # type: ignore[attr-defined]


def load_kerashub_embedder(checkpoint: str | Path, cache_root: str | Path, dtype: str = "float32") -> Any:
    """KerasHub's XLMRobertaTextEmbedder (CLS + L2, no preprocessor) on `checkpoint`, offline, on the
    current Keras backend; run it as `embedder.predict_on_batch({"token_ids": ..., "padding_mask": ...})`."""
    use_offline_cache(hf_cache_for(checkpoint, cache_root))
    try:
        import keras_hub
    except ImportError as err:
        raise ImportError(
            "the KerasHub engine needs keras-hub: pip install --no-deps keras-hub==0.32.0 "
            "(--no-deps: its tensorflow-text requirement would change TensorFlow)"
        ) from err
    backbone = keras_hub.models.XLMRobertaBackbone.from_preset(f"hf://{HUB_ID}", dtype=dtype)
    return keras_hub.models.XLMRobertaTextEmbedder(
        backbone=backbone, preprocessor=None, pooling_mode="cls", normalize=True
    )
