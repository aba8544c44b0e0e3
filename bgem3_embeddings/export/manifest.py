"""export_manifest.json: what a consumer without this library needs to run the exported model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from bgem3_embeddings.checkpoint.files import CONFIG_FILE, TOKENIZER_FILES
from bgem3_embeddings.tokenizer import BGEM3Tokenizer

MANIFEST_FILE = "export_manifest.json"
TOKENIZER_DIR = "tokenizer"


def revision_of(root: Path) -> str | None:
    """The commit hash when `root` is a Hugging Face cache snapshot (.../snapshots/<sha>), else None."""
    return root.name if root.parent.name == "snapshots" else None


def copy_tokenizer(root: Path, dest: Path) -> list[str]:
    """Copy the tokenizer files (and config.json, which AutoTokenizer may read) into `dest`.

    tokenizer.json is written as the pipeline the encoder runs (transformers 5's, docs/tokenizer.md), not
    copied as published: `tokenizers.Tokenizer.from_file` and transformers 4.x run that file as it is, so
    only then do they give the exported model the reference's ids on every input.
    """
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in (*TOKENIZER_FILES, CONFIG_FILE):
        if (root / name).is_file():
            if name == "tokenizer.json":
                BGEM3Tokenizer.from_dir(root).backend_tokenizer.save(str(dest / name), pretty=True)
            else:
                shutil.copy2(root / name, dest / name)
            copied.append(name)
    return copied


def build_manifest(encoder: Any, *, format: str, weights: str, model_file: str, revision: str | None,
                   tokenizer_files: list[str]) -> dict[str, Any]:
    """The manifest dict: model id and revision, weight type, signature, shapes, special tokens, versions."""
    import tensorflow as tf

    from bgem3_embeddings._version import __version__

    config = encoder.config
    tokenizer = encoder.tokenizer
    hidden, colbert_dim = config.hidden_size, config.colbert_dim
    return {
        "format": format,
        "model_id": encoder.model_id,
        "revision": revision or revision_of(Path(encoder.files.root)),
        "weights": weights,
        "model_file": model_file,
        "signature": "serving_default",
        "inputs": {
            "input_ids": {"dtype": "int32", "shape": [None, None]},
            "attention_mask": {"dtype": "int32", "shape": [None, None]},
        },
        "outputs": {
            "dense_vecs": {"dtype": "float32", "shape": [None, hidden],
                           "meaning": "hidden state of each row's first real token (<s>), L2-normalised"},
            "sparse_weights": {"dtype": "float32", "shape": [None, None],
                               "meaning": "relu(sparse head) per token; special tokens and padding are 0. "
                                          "Lexical weights: {token_id: max weight} over weights > 0"},
            "colbert_vecs": {"dtype": "float32", "shape": [None, None, colbert_dim],
                             "meaning": "seq_len - 1 rows: the real tokens after <s> first (on either "
                                        "padding side), L2-normalised, then zero rows. Keep the first "
                                        "(number_of_tokens - 1) rows per text"},
        },
        "padding": "right or left with pad_token_id; attention_mask 1 for real tokens; outputs per text are "
                   "the same on both sides",
        "special_token_ids": {
            "cls": tokenizer.cls_token_id,
            "eos": tokenizer.eos_token_id,
            "pad": tokenizer.pad_token_id,
            "unk": tokenizer.unk_token_id,
        },
        "max_length": config.max_sequence_length,
        "tokenizer_dir": TOKENIZER_DIR,
        "tokenizer_files": tokenizer_files,
        "config": config.to_dict(),
        "bgem3_embeddings_version": __version__,
        "tensorflow_version": tf.__version__,
    }


def write_manifest(folder: Path, manifest: dict[str, Any]) -> Path:
    path = folder / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path
