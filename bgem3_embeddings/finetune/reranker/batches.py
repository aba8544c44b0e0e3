"""A step's groups as the reranker's token arrays, as FlagEmbedding's reranker dataset and collator make them.

FlagEmbedding 1.4.2 (`abc/finetune/reranker/AbsDataset.py`): each group is sampled as the embedder's
(data.sample_group: one positive, n-1 negatives, its `random` draws in its order); each (query, passage) pair
is `create_one_example`: the query cut at query_max_len + passage_max_len // 4 tokens, the passage at
passage_max_len + query_max_len // 2, joined `<s> query </s></s> passage </s>` with only the passage cut to
query_max_len + passage_max_len (its `prepare_for_model_compat`, which is FlagReranker's join:
reranker/pairs.py); `AbsRerankerCollator` pads every pair of the batch on the right to the longest.

    batch = tokenize_pairs(tokenizer, groups, query_max_len=32, passage_max_len=128)
    batch.input_ids.shape   # (len(groups) * group size, longest pair)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bgem3_embeddings.batching import pad_batch
from bgem3_embeddings.finetune.data import SampledGroup
from bgem3_embeddings.reranker.pairs import pair_token_ids
from bgem3_embeddings.tokenizer import BGEM3Tokenizer


@dataclass(frozen=True)
class PairBatch:
    """One step's inputs: rows g*G .. g*G + G - 1 are group g's pairs, its positive first.
    `teacher_scores` (B, G) float32 with knowledge distillation, else None; `tokens`: real tokens."""

    input_ids: np.ndarray  # (B * G, L) int32, right-padded
    attention_mask: np.ndarray  # (B * G, L) int32
    teacher_scores: np.ndarray | None
    tokens: int


def pair_lengths(query_max_len: int, passage_max_len: int) -> tuple[int, int, int]:
    """(query cut, passage cut, pair length): FlagEmbedding's `create_one_example` lengths."""
    return (
        query_max_len + passage_max_len // 4,
        passage_max_len + query_max_len // 2,
        query_max_len + passage_max_len,
    )


def tokenize_pairs(
    tokenizer: BGEM3Tokenizer,
    groups: Sequence[SampledGroup],
    *,
    query_max_len: int = 32,
    passage_max_len: int = 128,
) -> PairBatch:
    """The PairBatch of `groups` (all of one group size).

    Example: `tokenize_pairs(tok, [sample_group(ex, 2, rng, knowledge_distillation=False)])` has
    `input_ids.shape[0] == 2`.
    """
    if not groups:
        raise ValueError("tokenize_pairs needs at least one group")
    sizes = {len(g.passages) for g in groups}
    if len(sizes) > 1:
        raise ValueError(f"every group must hold as many passages, got {sorted(sizes)}")
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise ValueError("the tokenizer has no pad token")
    query_cut, passage_cut, max_length = pair_lengths(query_max_len, passage_max_len)
    pairs = [(g.query, p) for g in groups for p in g.passages]
    ids = pair_token_ids(tokenizer, pairs, max_length, query_length=query_cut, passage_length=passage_cut)
    input_ids, mask = pad_batch(ids, pad_id, "right")
    teacher = None
    if groups[0].teacher_scores is not None:
        teacher = np.asarray([g.teacher_scores for g in groups], dtype=np.float32)
    return PairBatch(input_ids, mask, teacher, int(mask.sum()))


def pair_inputs(batch: PairBatch, step: int) -> dict[str, np.ndarray]:
    """A PairBatch as RerankerFinetuner's input dict (StepBatches' `to_inputs`; the step is not needed)."""
    inputs = {
        "input_ids": batch.input_ids.astype(np.int32),
        "attention_mask": batch.attention_mask.astype(np.int32),
    }
    if batch.teacher_scores is not None:
        inputs["teacher_scores"] = batch.teacher_scores.astype(np.float32)
    return inputs
