"""FlagEmbedding itself (the package users run: `pip install FlagEmbedding`, 1.4.2) on a checkpoint folder.

FlagEmbedding 1.4.2's package `__init__` imports every model class, among them a MiniCPM reranker that needs
`transformers.modeling_attn_mask_utils`, which transformers 5 removed: `from FlagEmbedding import
BGEM3FlagModel` fails on the transformers FlagEmbedding users get today. Its M3 embedder module itself runs on
transformers 5, so it is imported here without the package `__init__` files above it (their other imports
are rerankers and LLM embedders that BGE-M3 does not use). The M3 code that runs is FlagEmbedding's own.

    m3 = flagembedding_m3(checkpoint)
    m3.compute_score([("q", "p")], weights_for_different_modes=[0.4, 0.2, 0.4])
    reranker = flag_reranker(reranker_checkpoint)   # FlagReranker, the same way
    reranker.compute_score([("q", "p")], normalize=True)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# One copy of the stand-in import, shared with `bgem3 bench --finetune` (the package cannot import tests/).
from bgem3_embeddings.bench.flagembedding_modules import m3_finetune_model as m3_finetune_model
from bgem3_embeddings.bench.flagembedding_modules import stand_in_packages as _stand_in_packages


def m3_embedder_class() -> Any:
    _stand_in_packages()
    from FlagEmbedding.inference.embedder.encoder_only.m3 import M3Embedder

    return M3Embedder


def flagembedding_m3(checkpoint: Path) -> Any:
    """FlagEmbedding's `M3Embedder` (= `BGEM3FlagModel`) on `checkpoint`, fp32 on the CPU."""
    return m3_embedder_class()(str(checkpoint), use_fp16=False, devices="cpu")


def flag_reranker(checkpoint: Path, *, use_fp16: bool = False, **kwargs: Any) -> Any:
    """FlagEmbedding's `FlagReranker` (inference/reranker/encoder_only/base.py) on `checkpoint`, on the CPU.

    `use_fp16` is ignored on the CPU by FlagEmbedding itself; a bf16 reference is `.model.to(torch.bfloat16)`.
    """
    _stand_in_packages()
    from FlagEmbedding.inference.reranker.encoder_only.base import BaseReranker

    return BaseReranker(str(checkpoint), use_fp16=use_fp16, devices="cpu", **kwargs)


def m3_collator(checkpoint: Path, *, query_max_len: int, passage_max_len: int) -> Any:
    """FlagEmbedding's training collator (`AbsEmbedderCollator`) with the checkpoint's tokenizer."""
    _stand_in_packages()
    from FlagEmbedding.abc.finetune.embedder.AbsDataset import AbsEmbedderCollator
    from transformers import AutoTokenizer

    return AbsEmbedderCollator(
        tokenizer=AutoTokenizer.from_pretrained(str(checkpoint)),
        query_max_len=query_max_len,
        passage_max_len=passage_max_len,
        return_tensors="pt",
    )
