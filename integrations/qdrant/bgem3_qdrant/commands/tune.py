"""`bgem3-qdrant tune -c NAME QUERIES --output DIR`: mine -> finetune -> reindex -> eval, resumable."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .common import (
    CollectionOpt,
    DeviceOpt,
    EngineOpt,
    KeyOpt,
    PathOpt,
    PrecisionOpt,
    ProgressOpt,
    ReadModelOpt,
    SplitOpt,
    UrlOpt,
    VerboseOpt,
    check_reranker_option,
    collection_model,
    fail,
    setup_logging,
    store_target,
)


def _ft(text: str) -> Any:
    """A `bgem3 finetune` option passed through (its name and default there)."""
    return typer.Option(help=f"Finetune: {text}", show_default=False)


def tune(
    queries: Annotated[
        Path,
        typer.Argument(
            help="A BEIR folder (queries.jsonl + qrels/<split>.tsv) or a FlagEmbedding JSONL of "
            '{"query": ..., "pos": [...]} lines: what `bgem3-qdrant mine` reads.'
        ),
    ],
    collection: CollectionOpt,
    output: Annotated[
        Path,
        typer.Option(
            "--output", "-o", help="Folder for every stage's output (mined/, model/, eval.json); a second "
            "run continues the first.",
        ),
    ],
    model: ReadModelOpt = None,
    into: Annotated[
        str | None,
        typer.Option(help="The tuned collection [default: <collection>-tuned].", show_default=False),
    ] = None,
    path: PathOpt = "./qdrant_data",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    store_engine: EngineOpt = "edge",
    split: SplitOpt = "test",
    holdout: Annotated[
        float, typer.Option(help="Share of the queries held out (never trained on) to compare the models.")
    ] = 0.2,
    negative_number: Annotated[int, typer.Option(help="Mine: negatives per query.")] = 15,
    range_for_sampling: Annotated[
        str, typer.Option(help="Mine: ranks START-END of the dense search negatives are drawn from.")
    ] = "2-200",
    seed: Annotated[int, typer.Option(help="Mine and finetune: the seed.")] = 42,
    lora_rank: Annotated[
        int, typer.Option(min=0, help="Finetune: LoRA rank (0: train every weight).")
    ] = 8,
    unified_finetuning: Annotated[
        bool,
        typer.Option(
            "--unified-finetuning/--dense-only",
            help="Finetune all three modes (dense, sparse, ColBERT) or the dense one alone.",
        ),
    ] = True,
    learning_rate: Annotated[float | None, _ft("the learning rate [default: 5e-5].")] = None,
    num_train_epochs: Annotated[float | None, _ft("epochs [default: 3].")] = None,
    max_steps: Annotated[int | None, _ft("stop after N steps.")] = None,
    temperature: Annotated[float | None, _ft("the loss's temperature [default: 0.02].")] = None,
    per_device_train_batch_size: Annotated[int | None, _ft("queries per step [default: 8].")] = None,
    train_group_size: Annotated[int | None, _ft("passages per query [default: 8].")] = None,
    save_steps: Annotated[int | None, _ft("a checkpoint every N steps [default: 500].")] = None,
    modes: Annotated[
        str | None, typer.Option(help="Eval: comma-separated modes [default: all].", show_default=False)
    ] = None,
    candidates: Annotated[int, typer.Option(min=1, help="Eval: chunks each index gives per query.")] = 200,
    reranker: Annotated[
        str | None,
        typer.Option(
            "--reranker",
            metavar="MODEL",
            show_default=False,
            help="Tune this cross-encoder too (bgem3 finetune-reranker on the same mined data; e.g. "
            "BAAI/bge-reranker-v2-m3 or a folder) and compare it in eval's cross mode.",
        ),
    ] = None,
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
    progress: ProgressOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Tune the collection's model on its own data: mine hard negatives, fine-tune (LoRA by default),
    re-index into a new collection, and compare both on held-out queries per mode. Each stage's output is
    kept in --output; a second run skips the stages that are complete."""
    setup_logging(verbose)
    from ..evaluation import check_modes
    from ..stores.open import open_store
    from ..tuning.loop import TuneOptions, run_tune
    from ..tuning.mine import check_settings, parse_range
    from ..tuning.query_sets import read_query_set

    # Everything that can be checked without the store or a model first (each one line).
    sampling = parse_range(range_for_sampling)
    check_settings(negative_number, sampling, holdout)
    read_query_set(queries, split)
    check_reranker_option(reranker)
    try:
        asked = [m.strip() for m in modes.split(",") if m.strip()] if modes else None
        chosen = check_modes(asked, reranker=reranker is not None) if asked is not None else None
    except ValueError as e:
        raise fail(e) from e
    finetune: dict[str, Any] = {
        "lora_rank": lora_rank or None,
        "unified_finetuning": unified_finetuning,
        "seed": seed,
        "learning_rate": learning_rate,
        "num_train_epochs": num_train_epochs,
        "max_steps": max_steps,
        "temperature": temperature,
        "per_device_train_batch_size": per_device_train_batch_size,
        "train_group_size": train_group_size,
        "save_steps": save_steps,
    }
    finetune = {k: v for k, v in finetune.items() if v is not None or k == "lora_rank"}
    target = store_target(path, url, api_key, store_engine)
    with open_store(target) as store:
        if not store.collection_exists(collection):
            raise fail(store.missing(collection))
        base_model = collection_model(store, collection, model)
    options = TuneOptions(
        collection=collection,
        queries=queries,
        output=output,
        model=base_model,
        into=into,
        holdout=holdout,
        split=split,
        mine={"negative_number": negative_number, "range_for_sampling": sampling, "seed": seed},
        finetune=finetune,
        modes=chosen,
        candidates=candidates,
        reranker=reranker,
        show_progress=progress,
    )
    report = run_tune(
        options,
        lambda: open_store(target),
        encoder_kwargs={"precision": precision, "device": device},
        on_stage=lambda s: typer.echo(f"{s.stage}: {'done before: ' if s.skipped else ''}{s.line}"),
    )
    typer.echo("")
    typer.echo(report.table.rstrip("\n"))
