"""The options of `bgem3 finetune-reranker`: FlagEmbedding's reranker trainer's names and defaults, then ours.

FlagEmbedding's come from `AbsRerankerDataArguments` (train_group_size 8, query_max_len 32, passage_max_len
128, query_instruction_for_rerank, passage_instruction_for_rerank, knowledge_distillation, shuffle_ratio) and
Hugging Face's `TrainingArguments` (learning rate 5e-5, 3 epochs, batch 8 per device, AdamW, clipping at
1.0, linear schedule after warmup_ratio, seed 42, a checkpoint every 500 steps). Its `max_len` is not one:
its encoder-only dataset joins pairs to query_max_len + passage_max_len tokens and never reads max_len.

    >>> options = RerankerFinetuneOptions(train_data=(Path("train.jsonl"),), model="tiny-reranker",
    ...                                   output_dir=Path("tuned-reranker"))
    >>> options.problems()
    []
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path  # noqa: F401 - the docstring's example

from bgem3_embeddings.finetune.options import LoopOptions
from bgem3_embeddings.reranker import DEFAULT_RERANKER_ID
from bgem3_embeddings.reranker.pairs import PAIR_SPECIAL_TOKENS


@dataclass(frozen=True)
class RerankerFinetuneOptions(LoopOptions):
    """Everything one reranker training run needs. Paths are resolved by the command."""

    model: str = DEFAULT_RERANKER_ID
    # FlagEmbedding's data arguments
    query_instruction_for_rerank: str | None = None
    passage_instruction_for_rerank: str | None = None
    passage_instruction_format: str = "{}{}"
    shuffle_ratio: float = 0.0

    @property
    def max_length(self) -> int:
        """Tokens of a joined pair: FlagEmbedding's query_max_len + passage_max_len."""
        return self.query_max_len + self.passage_max_len

    def problems(self) -> list[str]:
        """Each option value that cannot work, as `--option: why` (empty when all can)."""
        found = self._size_problems()
        if self.train_group_size == 1:
            found.append("--train-group-size: a group needs negatives to rank against (at least 2), got 1")
        # FlagEmbedding's pair keeps the query whole (cut at query_max_len + passage_max_len // 4 tokens)
        # and cuts the passage: the pair must have room for that query, 4 special tokens and a passage token.
        room = self.passage_max_len - self.passage_max_len // 4 - PAIR_SPECIAL_TOKENS
        if self.passage_max_len >= 1 and room < 1:
            found.append(
                f"--passage-max-len: at least 6 leaves room for a passage beside the query and the "
                f"{PAIR_SPECIAL_TOKENS} special tokens, got {self.passage_max_len}"
            )
        found += self._schedule_problems()
        if not 0 <= self.shuffle_ratio <= 1:
            found.append(f"--shuffle-ratio: must be in [0, 1], got {self.shuffle_ratio}")
        found += self._max_steps_problems()
        found += self._lora_problems()
        found += self._optimizer_problems()
        return found
