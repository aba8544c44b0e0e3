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
from pathlib import Path

from bgem3_embeddings.finetune.options import OPTIMIZERS
from bgem3_embeddings.reranker import DEFAULT_RERANKER_ID
from bgem3_embeddings.reranker.pairs import PAIR_SPECIAL_TOKENS


@dataclass(frozen=True)
class RerankerFinetuneOptions:
    """Everything one reranker training run needs. Paths are resolved by the command."""

    train_data: tuple[Path, ...]
    output_dir: Path
    model: str = DEFAULT_RERANKER_ID
    # FlagEmbedding's data arguments
    train_group_size: int = 8
    query_max_len: int = 32
    passage_max_len: int = 128
    knowledge_distillation: bool = False
    query_instruction_for_rerank: str | None = None
    query_instruction_format: str = "{}{}"
    passage_instruction_for_rerank: str | None = None
    passage_instruction_format: str = "{}{}"
    shuffle_ratio: float = 0.0
    # its training arguments
    learning_rate: float = 5e-5
    num_train_epochs: float = 3.0
    per_device_train_batch_size: int = 8
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    gradient_checkpointing: bool = False
    seed: int = 42
    save_steps: int = 500
    overwrite_output_dir: bool = False
    # ours
    optimizer: str = "adamw"
    max_steps: int | None = None
    lora_rank: int | None = None
    lora_alpha: float | None = None
    save_adapter: bool = False
    resume: bool = False
    log_json: Path | None = None
    skip_invalid: bool = False

    @property
    def max_length(self) -> int:
        """Tokens of a joined pair: FlagEmbedding's query_max_len + passage_max_len."""
        return self.query_max_len + self.passage_max_len

    def problems(self) -> list[str]:
        """Each option value that cannot work, as `--option: why` (empty when all can)."""
        found = []
        positive = {
            "--train-group-size": self.train_group_size,
            "--query-max-len": self.query_max_len,
            "--passage-max-len": self.passage_max_len,
            "--per-device-train-batch-size": self.per_device_train_batch_size,
            "--save-steps": self.save_steps,
        }
        found += [f"{name}: must be at least 1, got {value}" for name, value in positive.items() if value < 1]
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
        if self.learning_rate <= 0:
            found.append(f"--learning-rate: must be positive, got {self.learning_rate}")
        if self.num_train_epochs <= 0:
            found.append(f"--num-train-epochs: must be positive, got {self.num_train_epochs}")
        if not 0 <= self.warmup_ratio < 1:
            found.append(f"--warmup-ratio: must be in [0, 1), got {self.warmup_ratio}")
        if self.weight_decay < 0:
            found.append(f"--weight-decay: must be >= 0, got {self.weight_decay}")
        if not 0 <= self.shuffle_ratio <= 1:
            found.append(f"--shuffle-ratio: must be in [0, 1], got {self.shuffle_ratio}")
        if self.max_steps is not None and self.max_steps < 1:
            found.append(f"--max-steps: must be at least 1, got {self.max_steps}")
        if self.lora_rank is not None and self.lora_rank < 1:
            found.append(f"--lora-rank: must be at least 1, got {self.lora_rank}")
        if self.lora_alpha is not None and self.lora_rank is None:
            found.append("--lora-alpha: needs --lora-rank")
        if self.save_adapter and self.lora_rank is None:
            found.append("--save-adapter: needs --lora-rank")
        if self.optimizer not in OPTIMIZERS:
            found.append(f"--optimizer: one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        return found
