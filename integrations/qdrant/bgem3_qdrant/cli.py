"""`bgem3-qdrant`: ingest documents into Qdrant with BGE-M3 vectors, search them, measure throughput."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from .errors import BGEM3QdrantError

if TYPE_CHECKING:
    from .search import Mode

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="BGE-M3 (dense + sparse + ColBERT) ingestion and hybrid search for Qdrant.",
)

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", envvar="BGEM3_MODEL", help="Hub id or local checkpoint directory.")
]
CollectionOpt = Annotated[
    str, typer.Option("--collection", "-c", envvar="BGEM3_QDRANT_COLLECTION", help="Collection name.")
]
PathOpt = Annotated[str, typer.Option("--path", help="Embedded store folder (used when no --url).")]
UrlOpt = Annotated[str | None, typer.Option("--url", envvar="QDRANT_URL", help="Qdrant server URL.")]
KeyOpt = Annotated[
    str | None, typer.Option("--api-key", envvar="QDRANT_API_KEY", help="Qdrant API key.", show_default=False)
]
PrecisionOpt = Annotated[str, typer.Option("--precision", help="auto | float32 | bfloat16 | float16")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | gpu | /GPU:0 ...")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO level.")]


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )


def _fail(e: Exception) -> typer.Exit:
    typer.echo(f"error: {e}", err=True)
    return typer.Exit(code=1)


def _display(path: str | None) -> str:
    """A source path relative to the working directory when it lies below it."""
    if not path:
        return "-"
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


@app.command()
def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Files (.txt, .md, .jsonl) and directories.")],
    collection: CollectionOpt = "documents",
    model: ModelOpt = "BAAI/bge-m3",
    path: PathOpt = "./qdrant_data",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    include: Annotated[
        list[str] | None,
        typer.Option(
            "--glob", "-g", help="File globs inside directories (repeatable; default *.txt *.md *.jsonl)."
        ),
    ] = None,
    exclude: Annotated[
        list[str] | None, typer.Option("--exclude", help="Globs to leave out (repeatable).")
    ] = None,
    chunk_size: Annotated[int, typer.Option(help="Tokens per chunk (special tokens excluded).")] = 512,
    chunk_overlap: Annotated[int, typer.Option(help="Tokens shared by consecutive chunks.")] = 64,
    batch_size: Annotated[int, typer.Option(help="Chunks per encode + upsert batch.")] = 32,
    skip_invalid: Annotated[
        bool,
        typer.Option(
            "--skip-invalid",
            help="Skip malformed JSONL lines and unreadable files (reported) instead of stopping.",
        ),
    ] = False,
    prune: Annotated[
        bool, typer.Option(help="Remove stored chunks of re-ingested documents that changed.")
    ] = True,
    encoding: Annotated[str, typer.Option(help="Text encoding of the input files.")] = "utf-8",
    text_field: Annotated[str, typer.Option(help="JSONL field holding the text.")] = "text",
    sparse_modifier: Annotated[str, typer.Option(help="none (reference lexical score) or idf.")] = "none",
    colbert_on_disk: Annotated[bool, typer.Option(help="Keep ColBERT vectors on disk (server).")] = True,
    dense_on_disk: Annotated[bool, typer.Option(help="Keep dense vectors on disk (server).")] = False,
    engine: Annotated[str, typer.Option(help="plain (this process) or ray (Ray Data actor pool).")] = "plain",
    concurrency: Annotated[int, typer.Option(help="Ray: encoder actors.")] = 2,
    writers: Annotated[int, typer.Option(help="Ray with a server: parallel writer actors.")] = 2,
    ray_address: Annotated[
        str | None, typer.Option(help="Ray: cluster address (default: start/attach locally).")
    ] = None,
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
    progress: Annotated[
        bool | None, typer.Option("--progress/--no-progress", help="Progress bar (default: on a terminal).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Chunk, encode (dense + sparse + ColBERT) and store documents; re-runs skip unchanged chunks."""
    _setup_logging(verbose)
    from .client import open_client, resolve_target
    from .encoder import load_encoder
    from .ingest import IngestOptions, Ingestor
    from .schema import CollectionSchema
    from .sources import DEFAULT_INCLUDE

    if engine not in ("plain", "ray"):
        raise _fail(ValueError(f"--engine must be plain or ray, not {engine!r}"))
    if sparse_modifier not in ("none", "idf"):
        raise _fail(ValueError(f"--sparse-modifier must be none or idf, not {sparse_modifier!r}"))
    target = resolve_target(path=path, url=url, api_key=api_key)
    try:
        client = open_client(target)
    except BGEM3QdrantError as e:
        raise _fail(e) from e
    try:
        engine_kwargs: dict[str, Any] = {}
        if engine == "ray":
            engine_kwargs = {
                "model": model,
                "concurrency": concurrency,
                "writers": writers,
                "ray_address": ray_address,
                "target": target,
                "encoder_kwargs": {"precision": precision, "device": device},
            }
            from .ray_engine import driver_tokenizer_encoder

            encoder: Any = driver_tokenizer_encoder(model)
        else:
            encoder = load_encoder(model, precision=precision, device=device)
        schema = CollectionSchema(
            size=int(encoder.hidden_size),
            sparse_modifier=sparse_modifier,  # type: ignore[arg-type]
            colbert_on_disk=colbert_on_disk,
            dense_on_disk=dense_on_disk,
        )
        opts = IngestOptions(
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            batch_size=batch_size,
            skip_invalid=skip_invalid,
            prune=prune,
            show_progress=progress,
        )
        ing = Ingestor(client, collection, encoder, schema=schema, options=opts, model_id=model)
        typer.echo(f"ingesting into {collection!r} ({target.describe()}) with {model}", err=True)
        summary = ing.ingest_paths(
            paths,
            include=include or DEFAULT_INCLUDE,
            exclude=exclude or (),
            encoding=encoding,
            text_field=text_field,
            engine=engine,  # type: ignore[arg-type]
            **engine_kwargs,
        )
    except (BGEM3QdrantError, ValueError) as e:
        raise _fail(e) from e
    finally:
        client.close()
    if json_out:
        typer.echo(json.dumps({**summary.__dict__, "tokens_per_second": summary.tokens_per_second}))
    else:
        for msg in summary.invalid:
            typer.echo(f"skipped: {msg}", err=True)
        typer.echo(summary.format())


@app.command()
def search(
    queries: Annotated[list[str], typer.Argument(help="Query text (several queries: searched in turn).")],
    collection: CollectionOpt = "documents",
    mode: Annotated[
        str, typer.Option(help="dense | sparse | hybrid (RRF) | rerank (ColBERT, default).")
    ] = "rerank",
    limit: Annotated[int, typer.Option("--limit", "-k", help="Number of hits.")] = 5,
    prefetch_limit: Annotated[int | None, typer.Option(help="Candidates per index (hybrid/rerank).")] = None,
    filters: Annotated[
        list[str] | None,
        typer.Option(
            "--filter", "-f", help="Payload filter key=value (repeatable; metadata keys as is, e.g. lang=fr)."
        ),
    ] = None,
    model: ModelOpt = "BAAI/bge-m3",
    path: PathOpt = "./qdrant_data",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
    width: Annotated[int, typer.Option(help="Characters of text shown per hit.")] = 160,
    json_out: Annotated[bool, typer.Option("--json", help="Print hits as JSON lines.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Search a collection; prints hits with their per-stage scores."""
    _setup_logging(verbose)
    from .client import open_client, resolve_target
    from .encoder import load_encoder
    from .search import MODES, Searcher, parse_filter_args

    if mode not in MODES:
        raise _fail(ValueError(f"--mode must be one of {', '.join(MODES)}, not {mode!r}"))
    try:
        flt = parse_filter_args(filters or [])
        client = open_client(resolve_target(path=path, url=url, api_key=api_key))
    except (BGEM3QdrantError, ValueError) as e:
        raise _fail(e) from e
    try:
        if not client.collection_exists(collection):
            raise _fail(
                BGEM3QdrantError(
                    f"collection {collection!r} does not exist; create it with "
                    f"`bgem3-qdrant ingest PATH --collection {collection}`"
                )
            )
        encoder = load_encoder(model, precision=precision, device=device)
        searcher = Searcher(client, collection, encoder)
        results = [
            (
                query,
                searcher.search(
                    query,
                    mode=cast("Mode", mode),
                    limit=limit,
                    prefetch_limit=prefetch_limit,
                    filter=flt or None,
                ),
            )
            for query in queries
        ]
    except BGEM3QdrantError as e:
        raise _fail(e) from e
    finally:
        client.close()
    for query, hits in results:
        if json_out:
            for h in hits:
                typer.echo(json.dumps({"query": query, **h.to_dict()}, ensure_ascii=False))
            continue
        if len(results) > 1:
            typer.echo(f"\n== {query}")
        _print_hits(hits, width)


def _print_hits(hits: list[Any], width: int) -> None:
    """Ranked hits: score, document, chunk, per-stage scores, then the text."""
    if not hits:
        typer.echo("no hits")
    for rank, h in enumerate(hits, start=1):
        stages = "  ".join(f"{k}={v:.4f}" for k, v in h.scores.items())
        where = h.doc_id if h.doc_id and h.doc_id != h.source else _display(h.source)
        text = " ".join(h.text.split())
        text = text if len(text) <= width else text[: width - 1] + "…"
        typer.echo(f"{rank}. [{h.score:.4f}] {where} #{h.chunk_index}  ({stages})")
        typer.echo(f"   {text}")


@app.command()
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
    """Encoder-only vs end-to-end (chunk + encode + write to a fresh embedded store) tokens/s."""
    _setup_logging(verbose)
    from .bench import run_bench
    from .encoder import load_encoder

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


def main() -> None:  # pragma: no cover
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app()
