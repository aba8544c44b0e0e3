"""`bgem3-qdrant bench-store`: the store engines side by side on synthetic BGE-M3-size data."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ..schema import COLBERT_DTYPES, check_choice
from ..stores.open import STORE_ENGINES
from .common import (
    fail,
)


def bench_store(
    chunks: Annotated[int, typer.Option(help="Chunks (points) to write.")] = 3000,
    engines: Annotated[str, typer.Option(help="Comma-separated: edge, local.")] = "edge,local",
    colbert_dtypes: Annotated[
        str,
        typer.Option(
            help="Edge ColBERT dtypes to compare (float32 first: agreement is measured against it)."
        ),
    ] = "float32,float16,uint8",
    tokens: Annotated[int, typer.Option(help="ColBERT rows per chunk.")] = 128,
    dim: Annotated[int, typer.Option(help="Vector size (1024 for BGE-M3).")] = 1024,
    sparse: Annotated[int, typer.Option(help="Sparse weights per chunk.")] = 40,
    queries: Annotated[int, typer.Option(help="Queries per search mode.")] = 20,
    workdir: Annotated[
        str | None, typer.Option(help="Where the stores are written (default: a temp dir).")
    ] = None,
    keep: Annotated[bool, typer.Option(help="Keep the stores after the run.")] = False,
    colbert_pooling: Annotated[
        str, typer.Option(help="ColBERT pooling factors to compare, comma-separated (1 = unpooled).")
    ] = "1",
    colbert_quantization: Annotated[
        str, typer.Option(help="ColBERT copies in RAM to compare, comma-separated: none, int8, binary.")
    ] = "none",
    storages: Annotated[
        str | None,
        typer.Option(
            help="Storage choices to compare instead of every dtype x pooling x quantization, "
            "comma-separated DTYPE[/poolN][/QUANTIZATION]: float16,uint8/pool3/binary,turbo4/pool2.",
            show_default=False,
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print every figure as JSON.")] = False,
) -> None:
    """Edge and local mode, and ColBERT storage choices, side by side on the same synthetic BGE-M3-size data
    (write, disk, reopen, memory, p50/p95 per search mode cold and warm, with and without a filter, planted
    recall@10, agreement with float32)."""
    from ..schema import COLBERT_QUANTIZATIONS, ColbertStorage
    from ..tools.bench_store import BenchData, format_report, run_store_bench, storage_choices

    eng = [e.strip() for e in engines.split(",") if e.strip()]
    dts = [d.strip() for d in colbert_dtypes.split(",") if d.strip()]
    try:
        for e in eng:
            check_choice("--engines", e, STORE_ENGINES)
        for d in dts:
            check_choice("--colbert-dtypes", d, COLBERT_DTYPES)
        from ..pooling import check_pool_factor

        pools = tuple(check_pool_factor(int(f)) for f in colbert_pooling.split(",") if f.strip())
        quants = tuple(q.strip() for q in colbert_quantization.split(",") if q.strip())
        for q in quants:
            check_choice("--colbert-quantization", q, COLBERT_QUANTIZATIONS)
        if storages is not None:
            choices = [ColbertStorage.parse(c) for c in storages.split(",") if c.strip()]
        else:
            choices = storage_choices(dts, pools or (1,), quants or ("none",))
    except ValueError as e:
        raise fail(e) from e
    if chunks < queries:
        raise fail(ValueError("--chunks must be at least --queries"))
    data = BenchData(chunks=chunks, dim=dim, tokens=tokens, sparse=sparse, queries=queries)
    rep = run_store_bench(data, engines=eng, storages=choices, workdir=workdir, keep=keep)
    typer.echo(json.dumps(rep) if json_out else format_report(rep))
