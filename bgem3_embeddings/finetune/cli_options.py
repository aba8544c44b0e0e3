"""What `bgem3 finetune` and `bgem3 finetune-reranker` share on the command line, defined once: the options
both take (FlagEmbedding's names, in kebab case), the options object built from a command's arguments, and
the lines a finished or interrupted run prints.

    options = build_options(FinetuneOptions, locals())  # first thing in the command, after check_inputs
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from bgem3_embeddings.cli_support import CommandError
from bgem3_embeddings.finetune.options import LoopOptions

if TYPE_CHECKING:  # the trainer imports Keras: not at the command's import
    from bgem3_embeddings.finetune.trainer import FinetuneResult

TrainDataArg = Annotated[
    list[Path],
    typer.Argument(help="FlagEmbedding's training data: .jsonl/.json files or folders of them."),
]
TrainGroupSizeOpt = Annotated[int, typer.Option(help="1 positive + n-1 negatives per query.")]
KnowledgeDistillationOpt = Annotated[bool, typer.Option(help="Learn from pos_scores / neg_scores.")]
QueryInstructionOpt = Annotated[str | None, typer.Option(help="Prefix for queries.")]
QueryInstructionFormatOpt = Annotated[str, typer.Option(help="How instruction and query join.")]
LearningRateOpt = Annotated[float, typer.Option(help="Peak learning rate.")]
NumTrainEpochsOpt = Annotated[float, typer.Option(help="Passes over the data.")]
BatchSizeOpt = Annotated[int, typer.Option(help="Queries per step.")]
WarmupRatioOpt = Annotated[float, typer.Option(help="Share of the steps the learning rate rises over.")]
WeightDecayOpt = Annotated[float, typer.Option(help="AdamW's decoupled weight decay.")]
MaxGradNormOpt = Annotated[float, typer.Option(help="Gradient clipping by global norm (0: off).")]
GradientCheckpointingOpt = Annotated[bool, typer.Option(help="Recompute each layer in the backward pass.")]
SeedOpt = Annotated[int, typer.Option(help="Data order, sampling, dropout.")]
SaveStepsOpt = Annotated[int, typer.Option(help="A checkpoint every this many steps.")]
OverwriteOutputDirOpt = Annotated[
    bool, typer.Option(help="Replace an output folder that holds something else.")
]
OptimizerOpt = Annotated[str, typer.Option(help="adamw | sgd")]
MaxStepsOpt = Annotated[int | None, typer.Option(help="Stop after this many steps in all.")]
LoraRankOpt = Annotated[
    int | None, typer.Option(help="LoRA adapters of this rank instead of full fine-tuning.")
]
LoraAlphaOpt = Annotated[float | None, typer.Option(help="LoRA scale numerator (default: the rank).")]
SaveAdapterOpt = Annotated[bool, typer.Option(help="Also write the LoRA adapters alone.")]
ResumeOpt = Annotated[bool, typer.Option(help="Continue the run saved in --output.")]
LogJsonOpt = Annotated[Path | None, typer.Option(help="One JSON object per step.")]
SkipInvalidOpt = Annotated[
    bool, typer.Option(help="Skip malformed training lines (counted) instead of stopping.")
]
ProgressOpt = Annotated[
    bool | None, typer.Option("--progress/--no-progress", help="A progress bar (default: on a terminal).")
]

Options = TypeVar("Options", bound=LoopOptions)


def build_options(cls: type[Options], arguments: Mapping[str, Any]) -> Options:
    """`cls` from a command's arguments (its locals()): each field from the argument of its name (one
    missing is a KeyError: every field is an option), TRAIN and --output with ~ expanded, and a typed "\\n"
    in an --*-instruction-format a newline, as FlagEmbedding's argument parsing does. Values that cannot
    work are one CommandError line."""
    values = {f.name: arguments[f.name] for f in dataclasses.fields(cls)}
    values["train_data"] = tuple(p.expanduser() for p in values["train_data"])
    values["output_dir"] = values["output_dir"].expanduser()
    for name, value in values.items():
        if name.endswith("_instruction_format"):
            values[name] = value.replace("\\n", "\n")
    options = cls(**values)
    problems = options.problems()
    if problems:
        raise CommandError("; ".join(problems))
    return options


def end_of_run(result: FinetuneResult) -> None:
    """The skipped lines, and after Ctrl-C how to continue (exit 130); where a finished run went is the
    caller's line."""
    if result.skipped_lines:
        typer.echo(f"skipped {result.skipped_lines} invalid training lines (--skip-invalid)", err=True)
    if result.interrupted:
        typer.echo(
            f"interrupted after step {result.steps}: saved to {result.output_dir}; run the same command with "
            "--resume to continue",
            err=True,
        )
        raise typer.Exit(code=130)
