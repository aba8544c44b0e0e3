"""`bgem3-qdrant eval`: retrieval quality of every search mode on a BEIR dataset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from bgem3_embeddings.cli_support import check_inputs
from bgem3_embeddings.explain.cli import DEFAULT_WEIGHTS, parse_weights

from ..evaluation.cross_mode import CROSS_MODE, CROSS_MODE_HELP
from ..evaluation.modes import EVAL_MODES
from ..schema import COLBERT_DTYPES, check_choice
from .common import (
    DeviceOpt,
    EncoderKeyOpt,
    EncoderUrlOpt,
    EngineOpt,
    KeyOpt,
    PathOpt,
    PoolingOpt,
    PrecisionOpt,
    ProgressOpt,
    ReadModelOpt,
    RerankCandidatesOpt,
    RerankerOpt,
    UrlOpt,
    VerboseOpt,
    checked_engine,
    collection_model,
    fail,
    load_reranker_option,
    setup_logging,
)


def eval_command(
    dataset: Annotated[
        Path,
        typer.Argument(
            help="BEIR dataset folder: queries.jsonl, qrels/<split>.tsv and, to fill an empty collection, "
            "corpus.jsonl."
        ),
    ],
    collections: Annotated[
        list[str],
        typer.Option(
            "--collection",
            "-c",
            help="Collection (repeat to compare several of the same corpus; the first is the baseline).",
        ),
    ],
    model: ReadModelOpt = None,
    path: PathOpt = "./qdrant_data",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    store_engine: EngineOpt = "edge",
    split: Annotated[str, typer.Option(help="Qrels split: qrels/<split>.tsv.")] = "test",
    modes: Annotated[
        list[str] | None,
        typer.Option(
            help="Modes (repeatable or comma-separated; default all): "
            + ", ".join(EVAL_MODES)
            + f"; {CROSS_MODE}: {CROSS_MODE_HELP} (default with --reranker)"
        ),
    ] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option(help="Write one TREC run file per mode: DIR/<mode>.trec (top 100 per query)."),
    ] = None,
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Write the figures as JSON to FILE.")
    ] = None,
    ignore_identical_ids: Annotated[
        bool,
        typer.Option(
            "--ignore-identical-ids", help="Drop documents whose id is the query's (BEIR's default)."
        ),
    ] = False,
    candidates: Annotated[int, typer.Option(help="Chunks each index gives per query.")] = 200,
    weights: Annotated[
        str, typer.Option(help="Mode all: dense,sparse,colbert weights (FlagEmbedding compute_score).")
    ] = DEFAULT_WEIGHTS,
    exact: Annotated[bool, typer.Option("--exact", help="Brute-force candidates (no HNSW graph).")] = False,
    chunk_size: Annotated[int, typer.Option(help="Ingest of an empty collection: tokens per chunk.")] = 512,
    chunk_overlap: Annotated[int, typer.Option(help="Ingest: tokens shared by consecutive chunks.")] = 64,
    batch_size: Annotated[int, typer.Option(help="Ingest: chunks per encode + upsert batch.")] = 32,
    colbert_dtype: Annotated[
        str, typer.Option(help="Ingest of a new collection: ColBERT float16, float32 or uint8.")
    ] = "float16",
    colbert_pooling: PoolingOpt = None,
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
    encoder_url: EncoderUrlOpt = None,
    encoder_api_key: EncoderKeyOpt = None,
    reranker: RerankerOpt = None,
    rerank_candidates: RerankCandidatesOpt = None,
    progress: ProgressOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Retrieval quality of every search mode on a BEIR dataset (nDCG@10, Recall@100, MRR@10, latency,
    bytes per chunk); an empty collection is filled from the corpus first; several -c side by side."""
    setup_logging(verbose)
    from ..chunking import check_sizes
    from ..cross_encoder import DEFAULT_RERANK_CANDIDATES
    from ..encoder import connect_encoder, load_encoder
    from ..evaluation import EvalOptions, ModeSettings, check_corpus, check_modes, evaluate, load_beir
    from ..evaluation.metrics import import_pytrec_eval
    from ..ingest import IngestOptions
    from ..pooling import check_pool_factor
    from ..schema import CollectionSchema
    from ..stores.open import open_store, resolve_target

    mode_weights = parse_weights(weights)
    import_pytrec_eval()  # a missing eval extra is said before anything loads
    try:
        every = [*EVAL_MODES, CROSS_MODE] if reranker else list(EVAL_MODES)
        asked = [m.strip() for arg in modes or [",".join(every)] for m in arg.split(",")]
        chosen = check_modes([m for m in asked if m], reranker=reranker is not None)
        check_choice("--colbert-dtype", colbert_dtype, COLBERT_DTYPES)
        check_sizes(chunk_size, chunk_overlap)
        if candidates < 1:
            raise ValueError("--candidates must be at least 1")
        ingest_opts = IngestOptions(
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            batch_size=batch_size,
            show_progress=progress,
            colbert_pooling=None if colbert_pooling is None else check_pool_factor(colbert_pooling),
        )
        target = resolve_target(path=path, url=url, api_key=api_key, engine=checked_engine(store_engine))
    except ValueError as e:
        raise fail(e) from e
    data = load_beir(dataset, split)
    options = EvalOptions(
        split=split,
        modes=chosen,
        settings=ModeSettings(candidates=candidates, weights=mode_weights, exact=exact),
        ignore_identical_ids=ignore_identical_ids,
        show_progress=progress,
        run_dir=run_dir,
        rerank_candidates=rerank_candidates or DEFAULT_RERANK_CANDIDATES,
    )
    store = open_store(target)
    try:
        # Before the model loads: a collection of another corpus is refused, one missing some judged
        # documents is said.
        for line in check_corpus(store, collections, data):
            typer.echo(f"warning: {line}", err=True)
        if encoder_url:
            encoder = connect_encoder(encoder_url, encoder_api_key)
            model = encoder.model_id  # type: ignore[attr-defined]  # the server's model, as ingest records it
        else:
            model = collection_model(store, collections[0], model)  # the baseline's, without --model
            check_inputs(model)  # its files, before the model loads
            encoder = load_encoder(model, precision=precision, device=device)
        options.reranker = load_reranker_option(reranker, precision, device)
        schema = CollectionSchema(
            size=int(encoder.hidden_size),
            colbert_dtype=colbert_dtype,  # type: ignore[arg-type]
        )
        report = evaluate(
            store,
            collections,
            encoder,
            data,
            options=options,
            ingest_options=ingest_opts,
            schema=schema,
            model_id=model,
        )
    finally:
        store.close()
    for c in report.collections:
        if c.ingested:
            typer.echo(f"ingested {c.collection!r}: {c.ingested}")
    typer.echo(report.format())
    if json_file is not None:
        json_file.parent.mkdir(parents=True, exist_ok=True)
        json_file.write_text(json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8")
        typer.echo(f"figures: {json_file}")
