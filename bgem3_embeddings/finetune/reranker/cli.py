"""`bgem3 finetune-reranker TRAIN --model M --output DIR`: FlagEmbedding's cross-encoder fine-tuning, its
option names in kebab case.

Registered on the `bgem3` app by cli.py. Every expected failure is one line (cli_support.run_cli); the run
itself is trainer.run_reranker_finetune.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from bgem3_embeddings.cli_support import CommandError, check_inputs
from bgem3_embeddings.finetune.cli_options import (
    BatchSizeOpt,
    GradientCheckpointingOpt,
    KnowledgeDistillationOpt,
    LearningRateOpt,
    LogJsonOpt,
    LoraAlphaOpt,
    LoraRankOpt,
    MaxGradNormOpt,
    MaxStepsOpt,
    NumTrainEpochsOpt,
    OptimizerOpt,
    OverwriteOutputDirOpt,
    ProgressOpt,
    QueryInstructionFormatOpt,
    QueryInstructionOpt,
    ResumeOpt,
    SaveAdapterOpt,
    SaveStepsOpt,
    SeedOpt,
    SkipInvalidOpt,
    TrainDataArg,
    TrainGroupSizeOpt,
    WarmupRatioOpt,
    WeightDecayOpt,
    build_options,
    end_of_run,
)
from bgem3_embeddings.reranker import DEFAULT_RERANKER_ID
from bgem3_embeddings.reranker.cli import RERANKER_MODEL_ENV


def finetune_reranker_command(
    train_data: TrainDataArg,
    output_dir: Annotated[
        Path,
        typer.Option("--output", "--output-dir", "-o", help="Where the tuned reranker goes (BAAI's layout)."),
    ],
    model: Annotated[
        str,
        typer.Option(
            "--model", "-m", help="Reranker: hub id, local folder, or tiny.", envvar=RERANKER_MODEL_ENV
        ),
    ] = DEFAULT_RERANKER_ID,
    train_group_size: TrainGroupSizeOpt = 8,
    query_max_len: Annotated[int, typer.Option(help="Query tokens (a pair: both lengths summed).")] = 32,
    passage_max_len: Annotated[int, typer.Option(help="Passage tokens (see --query-max-len).")] = 128,
    knowledge_distillation: KnowledgeDistillationOpt = False,
    query_instruction_for_rerank: QueryInstructionOpt = None,
    query_instruction_format: QueryInstructionFormatOpt = "{}{}",
    passage_instruction_for_rerank: Annotated[str | None, typer.Option(help="Prefix for passages.")] = None,
    passage_instruction_format: Annotated[
        str, typer.Option(help="How instruction and passage join.")
    ] = "{}{}",
    shuffle_ratio: Annotated[float, typer.Option(help="Chance a long positive is shuffled.")] = 0.0,
    learning_rate: LearningRateOpt = 5e-5,
    num_train_epochs: NumTrainEpochsOpt = 3.0,
    per_device_train_batch_size: BatchSizeOpt = 8,
    warmup_ratio: WarmupRatioOpt = 0.0,
    weight_decay: WeightDecayOpt = 0.0,
    max_grad_norm: MaxGradNormOpt = 1.0,
    gradient_checkpointing: GradientCheckpointingOpt = False,
    seed: SeedOpt = 42,
    save_steps: SaveStepsOpt = 500,
    overwrite_output_dir: OverwriteOutputDirOpt = False,
    optimizer: OptimizerOpt = "adamw",
    max_steps: MaxStepsOpt = None,
    lora_rank: LoraRankOpt = None,
    lora_alpha: LoraAlphaOpt = None,
    save_adapter: SaveAdapterOpt = False,
    resume: ResumeOpt = False,
    log_json: LogJsonOpt = None,
    skip_invalid: SkipInvalidOpt = False,
    progress: ProgressOpt = None,
) -> None:
    """Fine-tune a cross-encoder reranker on your data as FlagEmbedding's reranker trainer does
    (docs/finetune.md); the result loads in `bgem3 rerank --model` and FlagReranker."""
    from bgem3_embeddings.finetune.reranker.options import RerankerFinetuneOptions

    check_inputs(model, train_data, "TRAIN", kind="reranker")
    options = build_options(RerankerFinetuneOptions, locals())
    from bgem3_embeddings.finetune.data import TrainingDataError
    from bgem3_embeddings.finetune.reranker.trainer import run_reranker_finetune
    from bgem3_embeddings.finetune.save import CheckpointSaveError
    from bgem3_embeddings.finetune.state import TrainingStateError

    show_progress = sys.stdout.isatty() if progress is None else progress
    try:
        result = run_reranker_finetune(options, verbose=1 if show_progress else 0)
    except (TrainingDataError, TrainingStateError, CheckpointSaveError) as err:
        raise CommandError(str(err)) from err
    end_of_run(result)
    typer.echo(
        f"trained {result.steps} steps: the tuned reranker is in {result.output_dir} "
        f"(bgem3 rerank --model {result.output_dir})",
        err=True,
    )
