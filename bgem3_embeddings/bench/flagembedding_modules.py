"""FlagEmbedding's own M3 modules, importable on the transformers its users get today.

FlagEmbedding 1.4.2's package `__init__` imports every model class, among them a MiniCPM reranker that needs
`transformers.modeling_attn_mask_utils`, which transformers 5 removed: `import FlagEmbedding` fails there. Its
M3 embedder, reranker and M3 fine-tuning modules themselves run on transformers 5, so they are imported with
empty stand-ins for the package `__init__` files above them (whose other imports are rerankers and LLM
embedders BGE-M3 does not use). The code that runs is FlagEmbedding's own. `bgem3 bench --finetune` and the
test suite's reference (tests/flagembedding_ref.py) both import it this way.

    model = m3_finetune_model(checkpoint, temperature=0.02, unified_finetuning=True)  # in training mode
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

# The packages between FlagEmbedding and its M3 embedder, cross-encoder reranker and M3 fine-tuning modules
# whose __init__ must not run.
STAND_IN_PACKAGES = (
    "FlagEmbedding",
    "FlagEmbedding.inference",
    "FlagEmbedding.inference.embedder",
    "FlagEmbedding.inference.embedder.encoder_only",
    "FlagEmbedding.inference.reranker",
    "FlagEmbedding.inference.reranker.encoder_only",
    "FlagEmbedding.abc",
    "FlagEmbedding.abc.finetune",
    "FlagEmbedding.finetune",
    "FlagEmbedding.finetune.embedder",
    "FlagEmbedding.finetune.embedder.encoder_only",
)


@functools.cache  # once per process: the stand-in packages have no import spec to look up a second time
def stand_in_packages() -> None:
    """Put empty packages in sys.modules for STAND_IN_PACKAGES (ImportError when FlagEmbedding is absent)."""
    spec = importlib.util.find_spec("FlagEmbedding")
    if spec is None or spec.origin is None:
        raise ImportError("FlagEmbedding is not installed: pip install FlagEmbedding (the dev extra has it)")
    root = Path(spec.origin).parent
    for name in STAND_IN_PACKAGES:
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = package


def m3_finetune_model(checkpoint: str | Path, **settings: Any) -> Any:
    """FlagEmbedding's M3 training model (`finetune/embedder/encoder_only/m3/modeling.py`,
    `EncoderOnlyEmbedderM3Model`) on `checkpoint`, built as its runner builds it: the encoder by
    `AutoModel.from_pretrained` and both heads from colbert_linear.pt / sparse_linear.pt, in training mode.

    `settings` are the model's keyword arguments (temperature, unified_finetuning, use_self_distill,
    kd_loss_type, normalize_embeddings, ...); dropout is whatever the checkpoint's config.json says.
    """
    stand_in_packages()
    from FlagEmbedding.finetune.embedder.encoder_only.m3.modeling import EncoderOnlyEmbedderM3Model
    from FlagEmbedding.finetune.embedder.encoder_only.m3.runner import EncoderOnlyEmbedderM3Runner
    from transformers import AutoTokenizer

    base = EncoderOnlyEmbedderM3Runner.get_model(str(checkpoint))
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    model = EncoderOnlyEmbedderM3Model(base, tokenizer=tokenizer, **settings)
    return model.train()
