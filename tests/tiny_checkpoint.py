"""Tiny random checkpoints for the tests (the generator is the library's: bgem3_embeddings/checkpoint/
tiny_weights.py, which the model name `tiny` uses too), and the reference's PyTorch model on them.

    python tests/tiny_checkpoint.py OUT_DIR [--weights safetensors|pytorch|both] [--size tiny|full] [--seed N]
                                    [--reranker]   (a cross-encoder: make_tiny_reranker_checkpoint)
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch
from torch import nn
from transformers import XLMRobertaModel

from bgem3_embeddings.checkpoint.tiny_weights import (
    FULL_VOCAB_SIZE,
    SAMPLE_TEXT,
    SIZES,
    centre_sparse_bias_,
    make_tiny_checkpoint,
    make_tiny_reranker_checkpoint,
    model_config,
    save_transformers_v5_layout,
    write_tokenizer,
)

__all__ = [
    "FULL_VOCAB_SIZE",
    "SAMPLE_TEXT",
    "SIZES",
    "centre_sparse_bias_",
    "make_tiny_checkpoint",
    "make_tiny_reranker_checkpoint",
    "model_config",
    "reference_heads",
    "reference_model",
    "save_transformers_v5_layout",
    "write_tokenizer",
]


def reference_model(out_dir: Path) -> XLMRobertaModel:
    """The transformers PyTorch model on a generated checkpoint's weights, eval mode, eager attention."""
    model = XLMRobertaModel.from_pretrained(out_dir, attn_implementation="eager", dtype=torch.float32)
    return model.eval()


def reference_heads(out_dir: Path) -> tuple[nn.Linear, nn.Linear]:
    """(colbert_linear, sparse_linear) as torch Linear layers, loaded from the checkpoint's .pt files."""
    heads = []
    for file_name in ("colbert_linear.pt", "sparse_linear.pt"):
        state = torch.load(Path(out_dir) / file_name, weights_only=True, map_location="cpu")
        out_features, in_features = state["weight"].shape
        head = nn.Linear(in_features, out_features)
        head.load_state_dict(state)
        heads.append(head.eval())
    return heads[0], heads[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--weights", choices=["safetensors", "pytorch", "both"], default="safetensors")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reranker", action="store_true", help="a bge-reranker-v2-m3 layout cross-encoder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    make = make_tiny_reranker_checkpoint if args.reranker else make_tiny_checkpoint
    make(args.out_dir, weights=args.weights, size=args.size, seed=args.seed)


if __name__ == "__main__":
    main()
