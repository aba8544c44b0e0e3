"""`bgem3 finetune TRAIN --model M --output DIR`: FlagEmbedding's M3 fine-tuning, its option names in
kebab case.

Registered on the `bgem3` app by cli.py. Every expected failure is one line (cli_support.run_cli); the run
itself is trainer.run_finetune.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from bgem3_embeddings.checkpoint.files import DEFAULT_MODEL_ID
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

FLAG = "FlagEmbedding's option"


def finetune_command(
    train_data: TrainDataArg,
    output_dir: Annotated[
        Path,
        typer.Option("--output", "--output-dir", "-o", help="Where the tuned model goes (BAAI's layout)."),
    ],
    model: Annotated[
        str, typer.Option("--model", "-m", help="Hub id, local folder, or tiny.", envvar="BGEM3_MODEL")
    ] = DEFAULT_MODEL_ID,
    train_group_size: TrainGroupSizeOpt = 8,
    query_max_len: Annotated[int, typer.Option(help="Queries are cut at this many tokens.")] = 32,
    passage_max_len: Annotated[int, typer.Option(help="Passages are cut at this many tokens.")] = 128,
    temperature: Annotated[float, typer.Option(help="Scores are divided by it.")] = 0.02,
    learning_rate: LearningRateOpt = 5e-5,
    num_train_epochs: NumTrainEpochsOpt = 3.0,
    per_device_train_batch_size: BatchSizeOpt = 8,
    warmup_ratio: WarmupRatioOpt = 0.0,
    weight_decay: WeightDecayOpt = 0.0,
    max_grad_norm: MaxGradNormOpt = 1.0,
    unified_finetuning: Annotated[
        bool, typer.Option(help="Train sparse and ColBERT too (M3's unified loss).")
    ] = False,
    use_self_distill: Annotated[bool, typer.Option(help="Distil each mode from their ensemble.")] = False,
    self_distill_start_step: Annotated[int, typer.Option(help="Self-distillation after this step.")] = -1,
    knowledge_distillation: KnowledgeDistillationOpt = False,
    kd_loss_type: Annotated[str, typer.Option(help="kl_div | m3_kd_loss")] = "kl_div",
    fix_encoder: Annotated[bool, typer.Option(help="Train the sparse and ColBERT heads only.")] = False,
    gradient_checkpointing: GradientCheckpointingOpt = False,
    sub_batch_size: Annotated[
        int | None,
        typer.Option(
            help="Encode this many texts at a time, then backpropagate sub-batch by sub-batch (GradCache): "
            "the whole batch's in-batch negatives for one sub-batch's activation memory, same loss and "
            "gradients. (FlagEmbedding's --sub-batch-size only splits the forward and keeps every "
            "sub-batch's activations.)"
        ),
    ] = None,
    data_parallel: Annotated[
        bool,
        typer.Option(
            help="Train on every device JAX sees, --per-device-train-batch-size queries on each (Keras' "
            "DataParallel; JAX backend only)."
        ),
    ] = False,
    negatives_cross_device: Annotated[
        bool,
        typer.Option(
            help="Every device's passages join every query's negatives (dense term; needs --data-parallel)."
        ),
    ] = False,
    coordinator_address: Annotated[
        str | None,
        typer.Option(
            help="Several hosts: HOST:PORT of process 0 (jax.distributed; JAX also reads "
            "JAX_COORDINATOR_ADDRESS and detects Slurm, Open MPI, Kubernetes, Cloud TPU)."
        ),
    ] = None,
    num_processes: Annotated[int | None, typer.Option(help="Several hosts: how many processes.")] = None,
    process_id: Annotated[int | None, typer.Option(help="Several hosts: this one's number, from 0.")] = None,
    query_instruction_for_retrieval: QueryInstructionOpt = None,
    query_instruction_format: QueryInstructionFormatOpt = "{}{}",
    seed: SeedOpt = 42,
    save_steps: SaveStepsOpt = 500,
    overwrite_output_dir: OverwriteOutputDirOpt = False,
    optimizer: OptimizerOpt = "adamw",
    max_steps: MaxStepsOpt = None,
    lora_rank: LoraRankOpt = None,
    lora_alpha: LoraAlphaOpt = None,
    lora_heads: Annotated[
        bool, typer.Option(help="LoRA on the sparse and ColBERT heads too (they train whole by default).")
    ] = False,
    save_adapter: SaveAdapterOpt = False,
    precision: Annotated[
        str, typer.Option(help="float32 | bfloat16 (mixed: bf16 matmuls, float32 weights)")
    ] = "float32",
    resume: ResumeOpt = False,
    log_json: LogJsonOpt = None,
    skip_invalid: SkipInvalidOpt = False,
    progress: ProgressOpt = None,
) -> None:
    """Fine-tune BGE-M3 on your data as FlagEmbedding's M3 trainer does (docs/finetune.md); the result
    loads wherever a model does."""
    from bgem3_embeddings.finetune.options import FinetuneOptions

    check_inputs(model, train_data, "TRAIN")
    options = build_options(FinetuneOptions, locals())
    from bgem3_embeddings.finetune.data import TrainingDataError
    from bgem3_embeddings.finetune.data_parallel import DataParallelError
    from bgem3_embeddings.finetune.save import CheckpointSaveError
    from bgem3_embeddings.finetune.state import TrainingStateError
    from bgem3_embeddings.finetune.trainer import run_finetune
    from bgem3_embeddings.loading import MissingHeadError

    show_progress = sys.stdout.isatty() if progress is None else progress
    try:
        result = run_finetune(options, verbose=1 if show_progress else 0)
    except MissingHeadError as err:
        raise CommandError(
            f"{model} has no sparse or ColBERT head ({err.filename or err}): fine-tuning starts from a "
            "BGE-M3 "
            "checkpoint with colbert_linear.pt and sparse_linear.pt"
        ) from err
    except (TrainingDataError, TrainingStateError, CheckpointSaveError, DataParallelError) as err:
        raise CommandError(str(err)) from err
    end_of_run(result)
    on = f" on {result.devices} devices" if result.devices > 1 else ""
    typer.echo(
        f"trained {result.steps} steps{on}: the tuned model is in {result.output_dir} "
        f"(--model {result.output_dir})",
        err=True,
    )
