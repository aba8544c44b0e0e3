"""`bgem3-qdrant bench`: encoder-only vs end-to-end ingest throughput."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from bgem3_embeddings.cli_support import check_inputs

from .common import (
    DeviceOpt,
    ModelOpt,
    PrecisionOpt,
    VerboseOpt,
    setup_logging,
)


def bench(
    paths: Annotated[list[Path], typer.Argument(help="Corpus to ingest (files / directories).")],
    model: ModelOpt = "BAAI/bge-m3",
    chunk_size: Annotated[int, typer.Option(help="Tokens per chunk.")] = 512,
    chunk_overlap: Annotated[int, typer.Option(help="Token overlap.")] = 64,
    batch_size: Annotated[int, typer.Option(help="Chunks per batch.")] = 32,
    repeat: Annotated[int, typer.Option(help="Ingest the corpus this many times (distinct copies).")] = 1,
    rounds: Annotated[int, typer.Option(help="Alternating encoder-only / end-to-end rounds (median).")] = 3,
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Ingest throughput: encoder-only vs end-to-end (chunk + encode + write to a fresh embedded store)
    tokens/s. The encoder alone against other engines (transformers, ONNX Runtime, FlagEmbedding): `bgem3
    bench`."""
    setup_logging(verbose)
    from ..encoder import load_encoder
    from ..tools.bench import run_bench

    check_inputs(model, [str(p) for p in paths])
    encoder = load_encoder(model, precision=precision, device=device)
    result = run_bench(
        encoder,
        paths,
        chunk_size=chunk_size,
        chunk_overlap=chunk_overlap,
        batch_size=batch_size,
        repeat=repeat,
        rounds=rounds,
        model_id=model,
    )
    typer.echo(json.dumps(result, indent=None if json_out else 2))
