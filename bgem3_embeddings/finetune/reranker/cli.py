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
from bgem3_embeddings.reranker import DEFAULT_RERANKER_ID
from bgem3_embeddings.reranker.cli import RERANKER_MODEL_ENV


def finetune_reranker_command(
    train_data: Annotated[
        list[Path],
        typer.Argument(help="FlagEmbedding's training data: .jsonl/.json files or folders of them."),
    ],
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
    train_group_size: Annotated[int, typer.Option(help="1 positive + n-1 negatives per query.")] = 8,
    query_max_len: Annotated[int, typer.Option(help="Query tokens (a pair: both lengths summed).")] = 32,
    passage_max_len: Annotated[int, typer.Option(help="Passage tokens (see --query-max-len).")] = 128,
    knowledge_distillation: Annotated[bool, typer.Option(help="Learn from pos_scores / neg_scores.")] = False,
    query_instruction_for_rerank: Annotated[str | None, typer.Option(help="Prefix for queries.")] = None,
    query_instruction_format: Annotated[str, typer.Option(help="How instruction and query join.")] = "{}{}",
    passage_instruction_for_rerank: Annotated[str | None, typer.Option(help="Prefix for passages.")] = None,
    passage_instruction_format: Annotated[
        str, typer.Option(help="How instruction and passage join.")
    ] = "{}{}",
    shuffle_ratio: Annotated[float, typer.Option(help="Chance a long positive is shuffled.")] = 0.0,
    learning_rate: Annotated[float, typer.Option(help="Peak learning rate.")] = 5e-5,
    num_train_epochs: Annotated[float, typer.Option(help="Passes over the data.")] = 3.0,
    per_device_train_batch_size: Annotated[int, typer.Option(help="Queries per step.")] = 8,
    warmup_ratio: Annotated[
        float, typer.Option(help="Share of the steps the learning rate rises over.")
    ] = 0.0,
    weight_decay: Annotated[float, typer.Option(help="AdamW's decoupled weight decay.")] = 0.0,
    max_grad_norm: Annotated[float, typer.Option(help="Gradient clipping by global norm (0: off).")] = 1.0,
    gradient_checkpointing: Annotated[
        bool, typer.Option(help="Recompute each layer in the backward pass.")
    ] = False,
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
    save_adapter: Annotated[bool, typer.Option(help="Also write the LoRA adapters alone.")] = False,
    resume: Annotated[bool, typer.Option(help="Continue the run saved in --output.")] = False,
    log_json: Annotated[Path | None, typer.Option(help="One JSON object per step.")] = None,
    skip_invalid: Annotated[
        bool, typer.Option(help="Skip malformed training lines (counted) instead of stopping.")
    ] = False,
    progress: Annotated[
        bool | None, typer.Option("--progress/--no-progress", help="A progress bar (default: on a terminal).")
    ] = None,
) -> None:
    """Fine-tune a cross-encoder reranker on your data as FlagEmbedding's reranker trainer does
    (docs/finetune.md); the result loads in `bgem3 rerank --model` and FlagReranker."""
    from bgem3_embeddings.finetune.reranker.options import RerankerFinetuneOptions

    check_inputs(model, train_data, "TRAIN", kind="reranker")
    options = RerankerFinetuneOptions(
        train_data=tuple(p.expanduser() for p in train_data),
        model=model,
        output_dir=output_dir.expanduser(),
        train_group_size=train_group_size,
        query_max_len=query_max_len,
        passage_max_len=passage_max_len,
        knowledge_distillation=knowledge_distillation,
        query_instruction_for_rerank=query_instruction_for_rerank,
        # as FlagEmbedding's argument parsing does: a typed "\n" is a newline
        query_instruction_format=query_instruction_format.replace("\\n", "\n"),
        passage_instruction_for_rerank=passage_instruction_for_rerank,
        passage_instruction_format=passage_instruction_format.replace("\\n", "\n"),
        shuffle_ratio=shuffle_ratio,
        learning_rate=learning_rate,
        num_train_epochs=num_train_epochs,
        per_device_train_batch_size=per_device_train_batch_size,
        warmup_ratio=warmup_ratio,
        weight_decay=weight_decay,
        max_grad_norm=max_grad_norm,
        gradient_checkpointing=gradient_checkpointing,
        seed=seed,
        save_steps=save_steps,
        overwrite_output_dir=overwrite_output_dir,
        optimizer=optimizer,
        max_steps=max_steps,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        save_adapter=save_adapter,
        resume=resume,
        log_json=log_json,
        skip_invalid=skip_invalid,
    )
    problems = options.problems()
    if problems:
        raise CommandError("; ".join(problems))
    from bgem3_embeddings.finetune.data import TrainingDataError
    from bgem3_embeddings.finetune.reranker.trainer import run_reranker_finetune
    from bgem3_embeddings.finetune.save import CheckpointSaveError
    from bgem3_embeddings.finetune.state import TrainingStateError

    show_progress = sys.stdout.isatty() if progress is None else progress
    try:
        result = run_reranker_finetune(options, verbose=1 if show_progress else 0)
    except (TrainingDataError, TrainingStateError, CheckpointSaveError) as err:
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
    typer.echo(
        f"trained {result.steps} steps: the tuned reranker is in {result.output_dir} "
        f"(bgem3 rerank --model {result.output_dir})",
        err=True,
    )
