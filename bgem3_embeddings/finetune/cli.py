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

FLAG = "FlagEmbedding's option"


def finetune_command(
    train_data: Annotated[
        list[Path],
        typer.Argument(help="FlagEmbedding's training data: .jsonl/.json files or folders of them."),
    ],
    output_dir: Annotated[
        Path,
        typer.Option("--output", "--output-dir", "-o", help="Where the tuned model goes (BAAI's layout)."),
    ],
    model: Annotated[
        str, typer.Option("--model", "-m", help="Hub id, local folder, or tiny.", envvar="BGEM3_MODEL")
    ] = DEFAULT_MODEL_ID,
    train_group_size: Annotated[int, typer.Option(help="1 positive + n-1 negatives per query.")] = 8,
    query_max_len: Annotated[int, typer.Option(help="Queries are cut at this many tokens.")] = 32,
    passage_max_len: Annotated[int, typer.Option(help="Passages are cut at this many tokens.")] = 128,
    temperature: Annotated[float, typer.Option(help="Scores are divided by it.")] = 0.02,
    learning_rate: Annotated[float, typer.Option(help="Peak learning rate.")] = 5e-5,
    num_train_epochs: Annotated[float, typer.Option(help="Passes over the data.")] = 3.0,
    per_device_train_batch_size: Annotated[int, typer.Option(help="Queries per step.")] = 8,
    warmup_ratio: Annotated[
        float, typer.Option(help="Share of the steps the learning rate rises over.")
    ] = 0.0,
    weight_decay: Annotated[float, typer.Option(help="AdamW's decoupled weight decay.")] = 0.0,
    max_grad_norm: Annotated[float, typer.Option(help="Gradient clipping by global norm (0: off).")] = 1.0,
    unified_finetuning: Annotated[
        bool, typer.Option(help="Train sparse and ColBERT too (M3's unified loss).")
    ] = False,
    use_self_distill: Annotated[bool, typer.Option(help="Distil each mode from their ensemble.")] = False,
    self_distill_start_step: Annotated[int, typer.Option(help="Self-distillation after this step.")] = -1,
    knowledge_distillation: Annotated[bool, typer.Option(help="Learn from pos_scores / neg_scores.")] = False,
    kd_loss_type: Annotated[str, typer.Option(help="kl_div | m3_kd_loss")] = "kl_div",
    fix_encoder: Annotated[bool, typer.Option(help="Train the sparse and ColBERT heads only.")] = False,
    gradient_checkpointing: Annotated[
        bool, typer.Option(help="Recompute each layer in the backward pass.")
    ] = False,
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
    query_instruction_for_retrieval: Annotated[str | None, typer.Option(help="Prefix for queries.")] = None,
    query_instruction_format: Annotated[str, typer.Option(help="How instruction and query join.")] = "{}{}",
    seed: Annotated[int, typer.Option(help="Data order, sampling, dropout.")] = 42,
    save_steps: Annotated[int, typer.Option(help="A checkpoint every this many steps.")] = 500,
    overwrite_output_dir: Annotated[
        bool, typer.Option(help="Replace an output folder that holds something else.")
    ] = False,
    optimizer: Annotated[str, typer.Option(help="adamw | sgd")] = "adamw",
    max_steps: Annotated[int | None, typer.Option(help="Stop after this many steps in all.")] = None,
    lora_rank: Annotated[
        int | None, typer.Option(help="LoRA adapters of this rank instead of full fine-tuning.")
    ] = None,
    lora_alpha: Annotated[
        float | None, typer.Option(help="LoRA scale numerator (default: the rank).")
    ] = None,
    lora_heads: Annotated[
        bool, typer.Option(help="LoRA on the sparse and ColBERT heads too (they train whole by default).")
    ] = False,
    save_adapter: Annotated[bool, typer.Option(help="Also write the LoRA adapters alone.")] = False,
    precision: Annotated[
        str, typer.Option(help="float32 | bfloat16 (mixed: bf16 matmuls, float32 weights)")
    ] = "float32",
    resume: Annotated[bool, typer.Option(help="Continue the run saved in --output.")] = False,
    log_json: Annotated[Path | None, typer.Option(help="One JSON object per step.")] = None,
    skip_invalid: Annotated[
        bool, typer.Option(help="Skip malformed training lines (counted) instead of stopping.")
    ] = False,
    progress: Annotated[
        bool | None, typer.Option("--progress/--no-progress", help="A progress bar (default: on a terminal).")
    ] = None,
) -> None:
    """Fine-tune BGE-M3 on your data as FlagEmbedding's M3 trainer does (docs/finetune.md); the result
    loads wherever a model does."""
    from bgem3_embeddings.finetune.options import FinetuneOptions

    check_inputs(model, train_data, "TRAIN")
    options = FinetuneOptions(
        train_data=tuple(p.expanduser() for p in train_data),
        model=model,
        output_dir=output_dir.expanduser(),
        train_group_size=train_group_size,
        query_max_len=query_max_len,
        passage_max_len=passage_max_len,
        knowledge_distillation=knowledge_distillation,
        query_instruction_for_retrieval=query_instruction_for_retrieval,
        # as FlagEmbedding's argument parsing does: a typed "\n" is a newline
        query_instruction_format=query_instruction_format.replace("\\n", "\n"),
        temperature=temperature,
        learning_rate=learning_rate,
        num_train_epochs=num_train_epochs,
        per_device_train_batch_size=per_device_train_batch_size,
        warmup_ratio=warmup_ratio,
        weight_decay=weight_decay,
        max_grad_norm=max_grad_norm,
        unified_finetuning=unified_finetuning,
        use_self_distill=use_self_distill,
        self_distill_start_step=self_distill_start_step,
        kd_loss_type=kd_loss_type,
        fix_encoder=fix_encoder,
        gradient_checkpointing=gradient_checkpointing,
        seed=seed,
        save_steps=save_steps,
        overwrite_output_dir=overwrite_output_dir,
        optimizer=optimizer,
        max_steps=max_steps,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_heads=lora_heads,
        save_adapter=save_adapter,
        precision=precision,
        resume=resume,
        log_json=log_json,
        skip_invalid=skip_invalid,
        sub_batch_size=sub_batch_size,
        negatives_cross_device=negatives_cross_device,
        data_parallel=data_parallel,
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
    )
    problems = options.problems()
    if problems:
        raise CommandError("; ".join(problems))
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
    if result.skipped_lines:
        typer.echo(f"skipped {result.skipped_lines} invalid training lines (--skip-invalid)", err=True)
    if result.interrupted:
        typer.echo(
            f"interrupted after step {result.steps}: saved to {result.output_dir}; run the same command with "
            "--resume to continue",
            err=True,
        )
        raise typer.Exit(code=130)
    on = f" on {result.devices} devices" if result.devices > 1 else ""
    typer.echo(
        f"trained {result.steps} steps{on}: the tuned model is in {result.output_dir} "
        f"(--model {result.output_dir})",
        err=True,
    )
