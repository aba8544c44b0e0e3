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

    def encode(self, texts: list[str], max_length: int = 8192) -> dict[str, Any]:
        """FlagEmbedding's encode: tokenize (truncating to max_length), then encode_ids."""
        ids = self.tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
        return self.encode_ids(ids)

    @torch.no_grad()
    def encode_ids(self, token_ids: list[list[int]]) -> dict[str, Any]:
        """The reference outputs of token id lists, right-padded into one batch as FlagEmbedding pads.

        Returns dense_vecs (n, H), lexical_weights [{str(id): w}], colbert_vecs [(len - 1, C)] and
        token_weights [(len,)]: the per-token sparse weights with the unused tokens (cls, eos, pad, unk)
        set to 0, as they stand before the lexical dict is built.
        """
        width = max(len(ids) for ids in token_ids)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([list(ids) + [pad] * (width - len(ids)) for ids in token_ids])
        attention_mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in token_ids])
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        dense = torch.nn.functional.normalize(hidden[:, 0], dim=-1)
        token_weights = torch.relu(self.sparse_linear(hidden)).squeeze(-1)
        colbert = self.colbert_linear(hidden[:, 1:]) * attention_mask[:, 1:][:, :, None].float()
        colbert = torch.nn.functional.normalize(colbert, dim=-1)
        lexical, colbert_vecs, per_token = [], [], []
        for weights, ids, vecs, mask in zip(
            token_weights.numpy(), input_ids.numpy(), colbert.numpy(), attention_mask.numpy(), strict=True
        ):
            n = int(mask.sum())
            result: dict[str, float] = {}
            kept = np.zeros(n, dtype=np.float32)
            for position, (w, idx) in enumerate(zip(weights[:n], ids[:n], strict=True)):
                if idx not in self.unused_tokens and w > 0:
                    kept[position] = w
                    key = str(idx)
                    if w > result.get(key, 0):
                        result[key] = float(w)
            lexical.append(result)
            per_token.append(kept)
            colbert_vecs.append(vecs[: n - 1])
        return {
            "dense_vecs": dense.numpy(),
            "lexical_weights": lexical,
            "colbert_vecs": colbert_vecs,
            "token_weights": per_token,
        }

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


def assert_batch_matches_reference(
    out: dict[str, np.ndarray],
    input_ids: np.ndarray,
    attention_mask: np.ndarray,
    ref: dict[str, Any],
    *,
    atol: float = 1e-5,
    rtol: float = 1e-5,
) -> None:
    """A padded batch's raw outputs (either padding side) hold, row by row, the reference's per-text outputs.

    The layout checked is the documented one: dense_vecs per row; sparse_weights aligned with input_ids,
    zero on padding; colbert_vecs with the row's real tokens after <s> first, then zero rows.
    `ref` is ReferenceM3.encode_ids (or encode) of the rows' real tokens, in row order.
    """
    for row, mask in enumerate(np.asarray(attention_mask)):
        real = np.nonzero(mask)[0]
        n = len(real)
        assert n and np.all(np.diff(real) == 1), f"row {row}: real tokens must be contiguous"
        where = f"row {row} ({'left' if real[0] > 0 else 'right'}-padded, {n} tokens)"
        np.testing.assert_allclose(out["dense_vecs"][row], ref["dense_vecs"][row], atol=atol, err_msg=where)
        sparse = out["sparse_weights"][row]
        np.testing.assert_allclose(
            sparse[real], ref["token_weights"][row], atol=atol, rtol=rtol, err_msg=where
        )
        assert np.all(sparse[mask == 0] == 0), f"{where}: padding has sparse weights"
        colbert = out["colbert_vecs"][row]
        np.testing.assert_allclose(colbert[: n - 1], ref["colbert_vecs"][row], atol=atol, err_msg=where)
        assert np.all(colbert[n - 1 :] == 0), f"{where}: colbert rows past the text are not zero"
