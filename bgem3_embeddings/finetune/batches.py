"""Sampled groups to token arrays, as FlagEmbedding's `AbsEmbedderCollator` makes them.

    batch = tokenize_batch(tokenizer, groups, query_max_len=32, passage_max_len=128)
    batch.passage_input_ids.shape  # (len(groups) * group size, longest passage after truncation)

Each text is truncated to its max length (special tokens included, as `tokenizer(..., truncation=True,
max_length=...)` does) and padded on the right with the pad id to the longest of its kind in the batch
(`DataCollatorWithPadding`'s default, padding=True); the tokenizer is the project's, which gives the ids
transformers 5's XLM-R tokenizer gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bgem3_embeddings.batching import pad_batch
from bgem3_embeddings.finetune.data import SampledGroup
from bgem3_embeddings.tokenizer import BGEM3Tokenizer


@dataclass(frozen=True)
class TrainBatch:
    """One training step's inputs. Passages are grouped per query: rows g*G .. g*G + G - 1 are query g's
    group, its positive first. `teacher_scores` (B, G) float32 with knowledge distillation, else None;
    `tokens`: the real (unpadded) tokens of queries and passages, for tokens/s."""

    query_input_ids: np.ndarray  # (B, Lq) int32
    query_attention_mask: np.ndarray  # (B, Lq) int32
    passage_input_ids: np.ndarray  # (B * G, Lp) int32
    passage_attention_mask: np.ndarray  # (B * G, Lp) int32
    teacher_scores: np.ndarray | None  # (B, G) float32
    no_in_batch_neg: bool
    tokens: int

    @property
    def batch_size(self) -> int:
        return int(self.query_input_ids.shape[0])

    @property
    def group_size(self) -> int:
        return int(self.passage_input_ids.shape[0]) // self.batch_size


def tokenize_batch(
    tokenizer: BGEM3Tokenizer,
    groups: Sequence[SampledGroup],
    *,
    query_max_len: int = 32,
    passage_max_len: int = 128,
) -> TrainBatch:
    """The TrainBatch of `groups` (all of one group size and one `no_in_batch_neg` kind).

    Example: `tokenize_batch(tok, [sample_group(ex, 2, rng, knowledge_distillation=False)]).group_size` -> 2.
    """
    if not groups:
        raise ValueError("tokenize_batch needs at least one group")
    group_size = len(groups[0].passages)
    if any(len(g.passages) != group_size for g in groups):
        sizes = [len(g.passages) for g in groups]
        raise ValueError(f"every group must hold {group_size} passages, got {sizes}")
    if len({g.no_in_batch_neg for g in groups}) > 1:
        raise ValueError("a batch mixes no_in_batch_neg groups with others (see epoch_batches)")
    with_scores = [g.teacher_scores is not None for g in groups]
    if any(with_scores) and not all(with_scores):
        raise ValueError("some groups have teacher scores and some not")
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise ValueError("the tokenizer has no pad token")
    query_ids = tokenizer.encode_batch([g.query for g in groups], max_length=query_max_len)
    passage_ids = tokenizer.encode_batch([p for g in groups for p in g.passages], max_length=passage_max_len)
    q_ids, q_mask = pad_batch(query_ids, pad_id, "right")
    p_ids, p_mask = pad_batch(passage_ids, pad_id, "right")
    teacher = None
    if all(with_scores):
        teacher = np.asarray([g.teacher_scores for g in groups], dtype=np.float32)
    return TrainBatch(
        query_input_ids=q_ids,
        query_attention_mask=q_mask,
        passage_input_ids=p_ids,
        passage_attention_mask=p_mask,
        teacher_scores=teacher,
        no_in_batch_neg=groups[0].no_in_batch_neg,
        tokens=int(q_mask.sum() + p_mask.sum()),
    )
