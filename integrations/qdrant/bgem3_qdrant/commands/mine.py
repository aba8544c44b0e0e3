"""`bgem3-qdrant mine`: FlagEmbedding training data (hard negatives) from a collection and its queries."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..tuning.mine import NEGATIVE_NUMBER, SEED
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
    setup_logging,
    store_target,
)


def mine(
    queries: Annotated[
        Path,
        typer.Argument(
            help="A BEIR folder (queries.jsonl + qrels/<split>.tsv, what eval reads) or a FlagEmbedding "
            'JSONL file of {"query": ..., "pos": [...]} lines (positives matched to stored chunk texts).'
        ),
    ],
    collection: CollectionOpt,
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            help="Folder for train.jsonl (what `bgem3 finetune` reads), holdout/ (what eval reads) and "
            "mine.json.",
        ),
    ],
    model: ReadModelOpt = None,
    path: PathOpt = "./qdrant_data",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    store_engine: EngineOpt = "edge",
    split: SplitOpt = "test",
    negative_number: Annotated[
        int, typer.Option(help="Negatives per query (FlagEmbedding hn_mine's --negative_number).")
    ] = NEGATIVE_NUMBER,
    range_for_sampling: Annotated[
        str,
        typer.Option(
            help="Sample negatives from ranks START-END of the dense search (0-based, END excluded: "
            "hn_mine's --range_for_sampling; 2-200 skips the best two)."
        ),
    ] = "2-200",
    seed: Annotated[int, typer.Option(help="Seed of the negatives' and the holdout's draws.")] = SEED,
    holdout: Annotated[
        float,
        typer.Option(
            help="Share of the queries set apart (never mined from), written as DIR/holdout for eval."
        ),
    ] = 0.0,
    teacher_reranker: Annotated[
        str | None,
        typer.Option(
            "--teacher-reranker",
            metavar="MODEL",
            show_default=False,
            help="Add pos_scores/neg_scores from this cross-encoder (knowledge distillation; FlagEmbedding's "
            "add_reranker_score).",
        ),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace the mined data an --output folder already holds.")
    ] = False,
    batch_size: Annotated[int, typer.Option(help="Queries per encode batch.")] = 32,
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
    progress: ProgressOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Hard negatives for each query from the collection's own dense vectors, as FlagEmbedding's hn_mine
    does; the JSONL `bgem3 finetune` reads. Nothing in the store changes."""
    setup_logging(verbose)
    from ..stores.open import open_store
    from ..tuning.mine import check_settings, mine_collection, parse_range
    from ..tuning.mine_output import check_output
    from ..tuning.query_sets import read_query_set

    # Everything that can be checked without the store or a model, first (each one line).
    sampling = parse_range(range_for_sampling)
    check_settings(negative_number, sampling, holdout)
    check_output(output, overwrite)
    read_query_set(queries, split)
    check_reranker_option(teacher_reranker)
    target = store_target(path, url, api_key, store_engine)
    with open_store(target) as store:
        report = mine_collection(
            store, collection, queries, output, negative_number=negative_number, range_for_sampling=sampling,
            holdout=holdout, seed=seed, teacher_reranker=teacher_reranker, model=model,
            load_options={"precision": precision, "device": device}, split=split, overwrite=overwrite,
            batch_size=batch_size, show_progress=progress,
        )  # fmt: skip
    typer.echo(report.format())
