"""The options of `bgem3 finetune`: FlagEmbedding's M3 trainer's names and defaults, then ours.

FlagEmbedding's come from `AbsEmbedderDataArguments`, `AbsEmbedderTrainingArguments`,
`EncoderOnlyEmbedderM3TrainingArguments` and Hugging Face's `TrainingArguments` (learning rate 5e-5, 3 epochs,
batch 8 per device, AdamW with betas 0.9 / 0.999 and eps 1e-8, gradient clipping at norm 1.0, a linear
schedule after `warmup_ratio` of the steps, seed 42, a checkpoint every 500 steps). `LoopOptions` holds
the ones `bgem3 finetune-reranker` shares (its RerankerFinetuneOptions adds the reranker's own).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

OPTIMIZERS = ("adamw", "sgd")
PRECISIONS = ("float32", "bfloat16")


@dataclass(frozen=True)
class LoopOptions:
    """What both trainers take: the shared loop (trainer.make_plan, batch_maker, compile_for, fit_steps,
    check_output) reads these. FinetuneOptions and the reranker's RerankerFinetuneOptions add their own;
    each subclass's problems() runs the shared checks below in its own order."""

    train_data: tuple[Path, ...]
    output_dir: Path
    model: str
    # FlagEmbedding's data arguments
    train_group_size: int = 8
    query_max_len: int = 32
    passage_max_len: int = 128
    knowledge_distillation: bool = False
    query_instruction_format: str = "{}{}"
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

    def problems(self) -> list[str]:
        """Each option value that cannot work, as `--option: why` (empty when all can): each command's
        checks, the shared ones below among them."""
        raise NotImplementedError

    def _size_problems(self) -> list[str]:
        positive = {
            "--train-group-size": self.train_group_size,
            "--query-max-len": self.query_max_len,
            "--passage-max-len": self.passage_max_len,
            "--per-device-train-batch-size": self.per_device_train_batch_size,
            "--save-steps": self.save_steps,
        }
        return [f"{name}: must be at least 1, got {value}" for name, value in positive.items() if value < 1]

    def _schedule_problems(self) -> list[str]:
        found = []
        if self.learning_rate <= 0:
            found.append(f"--learning-rate: must be positive, got {self.learning_rate}")
        if self.num_train_epochs <= 0:
            found.append(f"--num-train-epochs: must be positive, got {self.num_train_epochs}")
        if not 0 <= self.warmup_ratio < 1:
            found.append(f"--warmup-ratio: must be in [0, 1), got {self.warmup_ratio}")
        if self.weight_decay < 0:
            found.append(f"--weight-decay: must be >= 0, got {self.weight_decay}")
        return found

    def _max_steps_problems(self) -> list[str]:
        if self.max_steps is not None and self.max_steps < 1:
            return [f"--max-steps: must be at least 1, got {self.max_steps}"]
        return []

    def _lora_problems(self) -> list[str]:
        found = []
        if self.lora_rank is not None and self.lora_rank < 1:
            found.append(f"--lora-rank: must be at least 1, got {self.lora_rank}")
        if self.lora_alpha is not None and self.lora_rank is None:
            found.append("--lora-alpha: needs --lora-rank")
        if self.save_adapter and self.lora_rank is None:
            found.append("--save-adapter: needs --lora-rank")
        return found

    def _optimizer_problems(self) -> list[str]:
        if self.optimizer not in OPTIMIZERS:
            return [f"--optimizer: one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}"]
        return []


@dataclass(frozen=True)
class FinetuneOptions(LoopOptions):
    """Everything one training run needs. Paths are resolved by the command."""

    # FlagEmbedding's data arguments
    query_instruction_for_retrieval: str | None = None
    # its training arguments
    temperature: float = 0.02
    unified_finetuning: bool = False
    use_self_distill: bool = False
    self_distill_start_step: int = -1
    kd_loss_type: str = "kl_div"
    fix_encoder: bool = False
    negatives_cross_device: bool = False  # every device's passages join every query's negatives
    # ours
    lora_heads: bool = False  # LoRA factors on the heads too, instead of training them whole (lora.py)
    precision: str = "float32"
    sub_batch_size: int | None = None  # GradCache: rows per encoder pass (grad_cache.py)
    # more than one device (data_parallel.py): every JAX device, several hosts through jax.distributed
    data_parallel: bool = False
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None

    def problems(self) -> list[str]:
        """Each option value that cannot work, as `--option: why` (empty when all can)."""
        found = self._size_problems()
        if self.temperature <= 0:
            found.append(f"--temperature: must be positive, got {self.temperature}")
        found += self._schedule_problems()
        found += self._max_steps_problems()
        if self.sub_batch_size is not None and self.sub_batch_size < 1:
            found.append(f"--sub-batch-size: must be at least 1, got {self.sub_batch_size}")
        found += self._lora_problems()
        if self.lora_heads and self.lora_rank is None:
            found.append("--lora-heads: needs --lora-rank")
        elif self.lora_heads and not self.unified_finetuning:
            found.append(
                "--lora-heads: the heads learn from the sparse and ColBERT terms; add --unified-finetuning"
            )
        if self.lora_rank is not None and self.fix_encoder:
            found.append("--lora-rank: --fix-encoder trains the heads only; choose one")
        found += self._optimizer_problems()
        if self.precision not in PRECISIONS:
            found.append(f"--precision: one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.kd_loss_type not in ("kl_div", "m3_kd_loss"):
            found.append(f"--kd-loss-type: kl_div or m3_kd_loss, got {self.kd_loss_type!r}")
        if self.use_self_distill and not self.unified_finetuning:
            found.append(
                "--use-self-distill: distils from the ensemble of all three modes; add --unified-finetuning"
            )
        if self.fix_encoder and not self.unified_finetuning:
            found.append("--fix-encoder: trains the sparse and ColBERT heads only; add --unified-finetuning")
        return found + self._device_problems()

    def _device_problems(self) -> list[str]:
        found = []
        needs_devices = {
            "--negatives-cross-device": self.negatives_cross_device,
            "--coordinator-address": self.coordinator_address is not None,
            "--num-processes": self.num_processes is not None,
            "--process-id": self.process_id is not None,
        }
        if not self.data_parallel:
            found += [
                f"{name}: needs --data-parallel (more than one device; Keras' JAX backend only)"
                for name, given in needs_devices.items()
                if given
            ]
        if self.num_processes is not None and self.num_processes < 1:
            found.append(f"--num-processes: must be at least 1, got {self.num_processes}")
        if self.process_id is not None and self.process_id < 0:
            found.append(f"--process-id: must be >= 0, got {self.process_id}")
        if self.data_parallel and self.sub_batch_size is not None:
            found.append("--sub-batch-size: GradCache runs on one device here; drop it or --data-parallel")
        return found
