"""An independent reference for the BGE-M3 outputs, written from FlagEmbedding's M3 semantics (v1.4).

It runs transformers' PyTorch XLMRobertaModel and the torch head Linears, and post-processes exactly as
the reference does (facts section 3). Tests compare the Keras implementation against this, never against
itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.tiny_checkpoint import reference_heads, reference_model


class ReferenceM3:
    """FlagEmbedding-style encode + scores on the torch model (fp32, CPU)."""

    def __init__(self, checkpoint: Path, tokenizer: Any = None) -> None:
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
        self.model = reference_model(checkpoint)
        self.colbert_linear, self.sparse_linear = reference_heads(checkpoint)
        self.tokenizer = tokenizer
        self.unused_tokens = {
            tokenizer.cls_token_id,
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
            tokenizer.unk_token_id,
        }

    @torch.no_grad()
    def last_hidden_state(self, texts: list[str], max_length: int = 8192) -> tuple[np.ndarray, np.ndarray]:
        batch = self.tokenizer(
            texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        )
        hidden = self.model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
        return hidden.numpy(), batch["attention_mask"].numpy()

    @torch.no_grad()
    def encode(self, texts: list[str], max_length: int = 8192) -> dict[str, Any]:
        batch = self.tokenizer(
            texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        )
        hidden = self.model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
        dense = torch.nn.functional.normalize(hidden[:, 0], dim=-1)
        token_weights = torch.relu(self.sparse_linear(hidden)).squeeze(-1)
        colbert = self.colbert_linear(hidden[:, 1:]) * batch["attention_mask"][:, 1:][:, :, None].float()
        colbert = torch.nn.functional.normalize(colbert, dim=-1)
        lexical, colbert_vecs = [], []
        for weights, ids, vecs, mask in zip(
            token_weights.numpy(),
            batch["input_ids"].numpy(),
            colbert.numpy(),
            batch["attention_mask"].numpy(),
            strict=True,
        ):
            result: dict[str, float] = {}
            for w, idx in zip(weights, ids, strict=True):
                if idx not in self.unused_tokens and w > 0:
                    key = str(idx)
                    if w > result.get(key, 0):
                        result[key] = float(w)
            lexical.append(result)
            colbert_vecs.append(vecs[: int(mask.sum()) - 1])
        return {"dense_vecs": dense.numpy(), "lexical_weights": lexical, "colbert_vecs": colbert_vecs}

    @staticmethod
    def lexical_score(a: dict[str, float], b: dict[str, float]) -> float:
        return sum(w * b[t] for t, w in a.items() if t in b)

    @staticmethod
    def colbert_score(q: np.ndarray, p: np.ndarray) -> float:
        scores = torch.einsum("in,jn->ij", torch.from_numpy(q), torch.from_numpy(p))
        return float(scores.max(1)[0].sum() / q.shape[0])

    def compute_score(
        self,
        pairs: list[tuple[str, str]],
        weights: list[float],
        max_query_length: int = 512,
        max_passage_length: int = 8192,
    ) -> dict[str, list[float]]:
        q = self.encode([p[0] for p in pairs], max_query_length)
        p = self.encode([p[1] for p in pairs], max_passage_length)
        dense = [float(a @ b) for a, b in zip(q["dense_vecs"], p["dense_vecs"], strict=True)]
        sparse = [
            self.lexical_score(a, b) for a, b in zip(q["lexical_weights"], p["lexical_weights"], strict=True)
        ]
        colbert = [
            self.colbert_score(a, b) for a, b in zip(q["colbert_vecs"], p["colbert_vecs"], strict=True)
        ]
        w0, w1, w2 = weights
        return {
            "colbert": colbert,
            "sparse": sparse,
            "dense": dense,
            "sparse+dense": [(s * w1 + d * w0) / (w0 + w1) for d, s in zip(dense, sparse, strict=True)],
            "colbert+sparse+dense": [
                (c * w2 + s * w1 + d * w0) / (w0 + w1 + w2)
                for d, s, c in zip(dense, sparse, colbert, strict=True)
            ],
        }
