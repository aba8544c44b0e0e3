"""The PyTorch side of the bench: transformers' XLMRobertaModel plus the two BGE-M3 heads, all three outputs.

One module serves two engines: the transformers engine runs it, and the ONNX Runtime engine runs its
torch.onnx export, so both compute exactly what the Keras model's `call` computes (the same masking and
normalisation as FlagEmbedding's M3Embedder) from the same checkpoint files. Needs torch (dev extra).

    >>> module = load_torch_m3("path/to/checkpoint")          # doctest: +SKIP
    >>> dense, sparse, colbert = module(input_ids, attention_mask)  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Tokens whose lexical weight the reference drops (cls, eos, pad, unk), as BGEM3Model.special_token_ids.
SPECIAL_IDS = (0, 2, 1, 3)
OUTPUT_NAMES = ("dense_vecs", "sparse_weights", "colbert_vecs")


def load_torch_m3(model_dir: str | Path, dtype: Any = None, attn_implementation: str = "eager") -> Any:
    """transformers' XLMRobertaModel + colbert_linear.pt + sparse_linear.pt as one eval-mode nn.Module.

    attn_implementation: transformers' "eager" (the reference's maths, op for op) or "sdpa" (PyTorch's
    fused scaled_dot_product_attention: flash / memory-efficient kernels on a CUDA GPU).
    """
    import torch
    from torch import nn
    from transformers import XLMRobertaModel

    root = Path(model_dir)
    encoder = XLMRobertaModel.from_pretrained(
        str(root),
        add_pooling_layer=False,
        dtype=dtype or torch.float32,
        attn_implementation=attn_implementation,
    )

    def head(name: str) -> nn.Linear:
        state = torch.load(root / name, map_location="cpu", weights_only=True)
        out_features, in_features = state["weight"].shape
        layer = nn.Linear(in_features, out_features)
        layer.load_state_dict(state)
        return layer

    class TorchM3(nn.Module):
        """forward(input_ids, attention_mask) -> (dense_vecs, sparse_weights, colbert_vecs), float32."""

        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder
            self.colbert_linear = head("colbert_linear.pt")
            self.sparse_linear = head("sparse_linear.pt")

        def forward(self, input_ids: Any, attention_mask: Any) -> tuple[Any, Any, Any]:
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.to(hidden.dtype)
            dense = nn.functional.normalize(hidden[:, 0], dim=-1)
            sparse = torch.relu(self.sparse_linear(hidden))[..., 0] * mask
            for token_id in SPECIAL_IDS:
                sparse = sparse * (input_ids != token_id).to(hidden.dtype)
            colbert = self.colbert_linear(hidden[:, 1:]) * mask[:, 1:, None]
            colbert = nn.functional.normalize(colbert, dim=-1)
            return dense.float(), sparse.float(), colbert.float()

    return TorchM3().eval()
