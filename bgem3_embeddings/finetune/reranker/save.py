"""Save a (fine-tuned) reranker as BAAI ships bge-reranker-v2-m3, for FlagEmbedding's FlagReranker and for us.

model.safetensors holds transformers' XLMRobertaForSequenceClassification names ("roberta." encoder,
"classifier.dense" / "classifier.out_proj"), float32, LoRA merged: the loading specs (reranker/loading.py)
read backwards, as finetune/save.py does for BGE-M3; config.json and the tokenizer are copied from the
checkpoint it started from. The folder is replaced atomically (finetune/save.save_bgem3_checkpoint).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from bgem3_embeddings.finetune.save import save_bgem3_checkpoint, spec_tensors, write_weights_and_copies
from bgem3_embeddings.reranker.loading import reranker_weight_specs
from bgem3_embeddings.reranker.model import BGEM3RerankerModel


def write_reranker_files(model: BGEM3RerankerModel, source_dir: Path, folder: Path) -> None:
    """The bge-reranker-v2-m3 layout of `model` into the existing empty `folder` (not atomic)."""

    def tensors(source: Any) -> Any:
        return spec_tensors(reranker_weight_specs(model), source)

    write_weights_and_copies(tensors, source_dir, folder)


def save_reranker_checkpoint(
    model: BGEM3RerankerModel, source_dir: Path, output_dir: Path, **kwargs: Any
) -> None:
    """`model` into `output_dir`, atomically; keyword arguments as save_bgem3_checkpoint's (overwrite,
    extra)."""
    save_bgem3_checkpoint(model, source_dir, output_dir, write=partial(write_reranker_files), **kwargs)
