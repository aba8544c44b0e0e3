"""`bgem3-qdrant`: ingest documents into Qdrant with BGE-M3 vectors, search them, measure throughput."""

from __future__ import annotations

import itertools
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from bgem3_embeddings.cli_support import check_inputs
from bgem3_embeddings.explain.cli import DEFAULT_WEIGHTS, parse_weights

from .errors import BGEM3QdrantError, collection_missing_message
from .evaluation.modes import EVAL_MODES
from .ingest.options import ENGINES
from .schema import COLBERT_DTYPES, SPARSE_MODIFIERS, check_choice
from .stores.base import MODES
from .stores.open import STORE_ENGINES

if TYPE_CHECKING:
    from .stores.base import Mode
    from .stores.open import StoreEngine

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="BGE-M3 (dense + sparse + ColBERT) ingestion and hybrid search for Qdrant.",
    epilog="Any command: --debug (anywhere on the line) shows the traceback and logs behind an error; "
    "-v logs what it does. One process at a time opens an embedded store (--path).",
)

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", envvar="BGEM3_MODEL", help="Hub id or local checkpoint directory.")
]
CollectionOpt = Annotated[
    str, typer.Option("--collection", "-c", envvar="BGEM3_QDRANT_COLLECTION", help="Collection name.")
]
PathOpt = Annotated[str, typer.Option("--path", help="Embedded store folder (used when no --url).")]
EngineOpt = Annotated[
    str,
    typer.Option(
        "--store-engine",
        envvar="BGEM3_QDRANT_ENGINE",
        help="Embedded engine for --path: edge (Qdrant Edge, default) or local (qdrant-client local mode, "
        "for stores of earlier releases).",
    ),
]
UrlOpt = Annotated[str | None, typer.Option("--url", envvar="QDRANT_URL", help="Qdrant server URL.")]
KeyOpt = Annotated[
    str | None, typer.Option("--api-key", envvar="QDRANT_API_KEY", help="Qdrant API key.", show_default=False)
]
PrecisionOpt = Annotated[str, typer.Option("--precision", help="auto | float32 | bfloat16 | float16")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto | cpu | gpu | /GPU:0 ...")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO level.")]
ProgressOpt = Annotated[
    bool | None,
    typer.Option(
        "--progress/--no-progress", help="Progress bar with total and ETA (default: on a terminal)."
    ),
]
EncoderUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--encoder-url",
        envvar="BGEM3_ENCODER_URL",
        help="Encode through a running `bgem3 serve` at this URL: no model (no TensorFlow) in this process. "
        "Not --url, the Qdrant server.",
    ),
]
EncoderKeyOpt = Annotated[
    str | None,
    typer.Option("--encoder-api-key", envvar="BGEM3_ENCODER_API_KEY", help="The encoder server's --api-key.",
                 show_default=False),
]
PoolingOpt = Annotated[
    int | None,
    typer.Option(
        "--colbert-pooling",
        help="Pool each document's ColBERT rows by this factor (2, 3, 4; 1 = off): Ward clustering of its "
        "token vectors, about 1/N of the rows stored. Default: the collection's own factor (1 if new).",
        show_default=False,
    ),
]


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")  # a no-op under run_cli
    if verbose:
        logging.getLogger().setLevel(logging.INFO)


def _fail(e: Exception) -> BGEM3QdrantError:
    """An expected failure for run_cli to print as one line (exit 1)."""
    return e if isinstance(e, BGEM3QdrantError) else BGEM3QdrantError(str(e))


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
    store_engine: EngineOpt = "edge",
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
    colbert_dtype: Annotated[
        str,
        typer.Option(
            help="ColBERT storage of a new collection: float16 (default), float32 (exact) or uint8."
        ),
    ] = "float16",
    colbert_on_disk: Annotated[bool, typer.Option(help="Keep ColBERT vectors on disk.")] = True,
    dense_on_disk: Annotated[bool, typer.Option(help="Keep dense vectors on disk (server).")] = False,
    colbert_pooling: PoolingOpt = None,
    engine: Annotated[str, typer.Option(help="plain (this process) or ray (Ray Data actor pool).")] = "plain",
    concurrency: Annotated[int, typer.Option(help="Ray: encoder actors.")] = 2,
    writers: Annotated[int, typer.Option(help="Ray with a server: parallel writer actors.")] = 2,
    ray_address: Annotated[
        str | None, typer.Option(help="Ray: cluster address (default: start/attach locally).")
    ] = None,
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
    encoder_url: EncoderUrlOpt = None,
    encoder_api_key: EncoderKeyOpt = None,
    progress: ProgressOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Chunk, encode (dense + sparse + ColBERT) and store documents; re-runs skip unchanged chunks."""
    _setup_logging(verbose)
    from .chunking import check_sizes
    from .encoder import connect_encoder, load_encoder
    from .ingest import IngestOptions, Ingestor
    from .pooling import check_pool_factor
    from .schema import CollectionSchema
    from .sources import DEFAULT_INCLUDE
    from .stores.open import open_store, resolve_target

    try:
        check_choice("--engine", engine, ENGINES)
        if encoder_url and engine != "plain":
            raise ValueError("--encoder-url encodes through one server: use it with --engine plain")
        check_choice("--sparse-modifier", sparse_modifier, SPARSE_MODIFIERS)
        check_choice("--colbert-dtype", colbert_dtype, COLBERT_DTYPES)
        opts = IngestOptions(
            chunk_size=chunk_size,
            chunk_overlap=chunk_overlap,
            batch_size=batch_size,
            skip_invalid=skip_invalid,
            prune=prune,
            show_progress=progress,
            colbert_pooling=None if colbert_pooling is None else check_pool_factor(colbert_pooling),
        )
        check_sizes(chunk_size, chunk_overlap)
        target = resolve_target(path=path, url=url, api_key=api_key, engine=_engine(store_engine))
    except ValueError as e:
        raise _fail(e) from e
    # Before anything loads: every missing path at once, the checkpoint's files, Ray installed.
    check_inputs(None if encoder_url else model, [str(p) for p in paths])
    if engine == "ray":
        from .ingest.ray import import_ray

        import_ray()
    store = open_store(target)
    try:
        encoder: Any
        if engine == "ray":
            from .ingest.ray import RayEncoding

            encoder = RayEncoding(
                model,
                concurrency=concurrency,
                writers=writers,
                target=target,
                ray_address=ray_address,
                encoder_kwargs={"precision": precision, "device": device},
            )
        elif encoder_url:
            encoder = connect_encoder(encoder_url, encoder_api_key)
            model = encoder.model_id  # the server's model is the one recorded with the points
        else:
            encoder = load_encoder(model, precision=precision, device=device)
        schema = CollectionSchema(
            size=int(encoder.hidden_size),
            sparse_modifier=sparse_modifier,  # type: ignore[arg-type]
            colbert_on_disk=colbert_on_disk,
            dense_on_disk=dense_on_disk,
            colbert_dtype=colbert_dtype,  # type: ignore[arg-type]
        )
        ing = Ingestor(store, collection, encoder, schema=schema, options=opts, model_id=model)
        # A log line (shown with -v), so that an expected failure stays the only line on stderr.
        log = logging.getLogger(__name__)
        log.info("ingesting into %r (%s) with %s", collection, target.describe(), model)
        summary = ing.ingest_paths(
            paths,
            include=include or DEFAULT_INCLUDE,
            exclude=exclude or (),
            encoding=encoding,
            text_field=text_field,
        )
    finally:
        store.close()
    if json_out:
        typer.echo(json.dumps({**summary.__dict__, "tokens_per_second": summary.tokens_per_second}))
    else:
        for msg in summary.invalid:
            typer.echo(f"skipped: {msg}", err=True)
        typer.echo(f"{collection!r} ({target.describe()}): {summary.format()}")


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
    store_engine: EngineOpt = "edge",
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
    encoder_url: EncoderUrlOpt = None,
    encoder_api_key: EncoderKeyOpt = None,
    width: Annotated[int, typer.Option(help="Characters of text shown per hit.")] = 160,
    explain: Annotated[
        bool,
        typer.Option(
            "--explain",
            help="Under each hit: its score per mode, top sparse terms and ColBERT alignments "
            "(with --json: an `explanation` object per hit).",
        ),
    ] = False,
    weights: Annotated[
        str, typer.Option(help="With --explain: weights of dense,sparse,colbert in the combined score.")
    ] = DEFAULT_WEIGHTS,
    json_out: Annotated[bool, typer.Option("--json", help="Print hits as JSON lines.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Search a collection; prints hits with their per-stage scores (--explain: why each hit ranked)."""
    _setup_logging(verbose)
    from .encoder import connect_encoder, load_encoder
    from .filters import parse_filter_args
    from .search import Searcher
    from .stores.open import open_store, resolve_target

    mode_weights = parse_weights(weights)
    try:
        check_choice("--mode", mode, MODES)
        flt = parse_filter_args(filters or [])
        target = resolve_target(path=path, url=url, api_key=api_key, engine=_engine(store_engine))
    except ValueError as e:
        raise _fail(e) from e
    if not target.is_server and target.engine == "edge" and not Path(path).exists():
        raise _fail(
            BGEM3QdrantError(
                f"no store at {path}; create it with `bgem3-qdrant ingest PATH --path {path} "
                f"--collection {collection}`"
            )
        )
    store = open_store(target)
    try:
        if not store.collection_exists(collection):
            raise _fail(BGEM3QdrantError(collection_missing_message(collection, store.describe())))
        if encoder_url:
            encoder = connect_encoder(encoder_url, encoder_api_key)
        else:
            check_inputs(model)  # its files, before the model loads
            encoder = load_encoder(model, precision=precision, device=device)
        searcher = Searcher(store, collection, encoder)
        for key in searcher.missing_filter_keys(flt):
            typer.echo(
                f"warning: no point of {collection!r} has the filter key {key!r} (--filter); "
                "the search runs but cannot match it",
                err=True,
            )
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
        # One encode per query: the query and its hits' texts together (explain_many).
        explained = [
            encoder.explain_many(query, [h.text for h in hits], weights=mode_weights)
            if explain and hits
            else []
            for query, hits in results
        ]
    finally:
        store.close()
    for (query, hits), explanations in zip(results, explained, strict=True):
        if json_out:
            for h, explanation in itertools.zip_longest(hits, explanations):
                extra = {"explanation": explanation.to_dict()} if explanation is not None else {}
                typer.echo(json.dumps({"query": query, **h.to_dict(), **extra}, ensure_ascii=False))
            continue
        if len(results) > 1:
            typer.echo(f"\n== {query}")
        _print_hits(hits, width, explanations)


def _print_hits(hits: list[Any], width: int, explanations: list[Any] | None = None) -> None:
    """Ranked hits: score, document, chunk, per-stage scores, then the text (and its explanation)."""
    from bgem3_embeddings.explain.render import render

    if not hits:
        typer.echo("no hits")
    for rank, (h, explanation) in enumerate(itertools.zip_longest(hits, explanations or []), start=1):
        stages = "  ".join(f"{k}={v:.4f}" for k, v in h.scores.items())
        where = h.doc_id if h.doc_id and h.doc_id != h.source else _display(h.source)
        text = " ".join(h.text.split())
        text = text if len(text) <= width else text[: width - 1] + "…"
        typer.echo(f"{rank}. [{h.score:.4f}] {where} #{h.chunk_index}  ({stages})")
        typer.echo(f"   {text}")
        if explanation is not None:
            for line in render(explanation, top_terms=EXPLAIN_TOP, top_matches=EXPLAIN_TOP, indent="   "):
                typer.echo(line)


# Sparse terms and ColBERT alignments shown under each hit by `search --explain`.
EXPLAIN_TOP = 5
# `check` exits with this when it found damage (and did not repair all of it); 1 is an error.
EXIT_DAMAGED = 3


@app.command()
def check(
    collection: CollectionOpt = "documents",
    path: PathOpt = "./qdrant_data",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    store_engine: EngineOpt = "edge",
    repair: Annotated[
        bool,
        typer.Option(
            "--repair", help="Replace damaged points: re-encode their recorded text, re-read their sources."
        ),
    ] = False,
    model: Annotated[
        str | None,
        typer.Option(
            "--model", "-m", envvar="BGEM3_MODEL", help="Model for --repair (default: the one recorded)."
        ),
    ] = None,
    chunk_size: Annotated[int, typer.Option(help="--repair: tokens per chunk of re-read sources.")] = 512,
    chunk_overlap: Annotated[int, typer.Option(help="--repair: overlap of re-read sources.")] = 64,
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
    progress: ProgressOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Verify every point of a collection (vectors, norms, row counts, payload, count); exit 3 on damage.

    --repair replaces the damaged points and checks again.
    """
    _setup_logging(verbose)
    from .errors import StoreDamagedError
    from .stores.open import open_store, resolve_target

    try:
        target = resolve_target(path=path, url=url, api_key=api_key, engine=_engine(store_engine))
    except ValueError as e:
        raise _fail(e) from e
    if not target.is_server and target.engine == "edge" and not Path(path).exists():
        raise _fail(BGEM3QdrantError(f"no store at {path} (--path): give the folder of an existing store"))
    store = open_store(target)
    try:
        if not store.collection_exists(collection):
            raise _fail(BGEM3QdrantError(collection_missing_message(collection, store.describe())))
        try:
            store.probe(collection)  # an engine abort ends a child process, not this one
            report = _checked(store, collection, progress)
            repaired = None
            if repair and not report.ok:
                repaired = _repair(store, collection, report, model, precision, device, chunk_size,
                                   chunk_overlap, progress)
                report = _checked(store, collection, progress)
        except StoreDamagedError as e:
            raise _fail(
                BGEM3QdrantError(
                    f"collection {collection!r} of the {store.describe()} cannot be read at all ({e.cause}); "
                    "check cannot tell its points apart: re-ingest its documents into a new collection "
                    "(--collection) or a new store (--path)"
                )
            ) from e
    finally:
        store.close()
    if json_out:
        out = report.to_dict()
        if repaired is not None:
            out["repair"] = repaired.__dict__
        typer.echo(json.dumps(out))
    else:
        if repaired is not None:
            typer.echo(repaired.format())
        typer.echo(report.format())
        if not report.ok and not repair:
            typer.echo("to replace the damaged points, run the same command with --repair")
    if not report.ok or (repaired is not None and not repaired.complete):
        raise typer.Exit(EXIT_DAMAGED)


def _checked(store: Any, collection: str, progress: bool | None) -> Any:
    """check_collection with a progress bar over the engine's count."""
    from tqdm.auto import tqdm

    from .check import check_collection

    show = progress if progress is not None else sys.stderr.isatty()
    with tqdm(total=store.count(collection), desc="check", unit="point", disable=not show) as bar:
        return check_collection(store, collection, progress=bar.update)


def _repair(
    store: Any,
    collection: str,
    report: Any,
    model: str | None,
    precision: str,
    device: str,
    chunk_size: int,
    chunk_overlap: int,
    progress: bool | None,
) -> Any:
    from .chunking import check_sizes
    from .encoder import load_encoder
    from .ingest import IngestOptions
    from .repair import repair_collection

    name = model or (report.identity.model if report.identity else None)
    if not name:
        raise _fail(
            BGEM3QdrantError(
                f"collection {collection!r} records no model (--model): give the model that wrote it"
            )
        )
    try:
        check_sizes(chunk_size, chunk_overlap)
    except ValueError as e:
        raise _fail(e) from e
    encoder = load_encoder(name, precision=precision, device=device)
    opts = IngestOptions(chunk_size=chunk_size, chunk_overlap=chunk_overlap, show_progress=progress)
    return repair_collection(store, collection, report, encoder, options=opts)


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
    from .encoder import load_encoder
    from .tools.bench import run_bench

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


@app.command()
def migrate(
    path: Annotated[Path, typer.Argument(help="Folder of a store written by qdrant-client's local mode.")],
    colbert_dtype: Annotated[
        str,
        typer.Option(help="ColBERT storage in the new store: float32 (exact copy, default), float16, uint8."),
    ] = "float32",
    verbose: VerboseOpt = False,
) -> None:
    """Move a local-mode store (earlier releases) to Qdrant Edge in place; old files kept as a backup."""
    _setup_logging(verbose)
    from tqdm.auto import tqdm

    from .tools.migrate import migrate_local_store

    try:
        check_choice("--colbert-dtype", colbert_dtype, COLBERT_DTYPES)
    except ValueError as e:
        raise _fail(e) from e
    bars: dict[str, Any] = {}

    def progress(name: str, done: int, total: int) -> None:
        bar = bars.get(name) or bars.setdefault(name, tqdm(total=total, desc=name, unit="point"))
        bar.update(done - bar.n)

    try:
        report = migrate_local_store(path, colbert_dtype=colbert_dtype, progress=progress)  # type: ignore[arg-type]
    finally:
        for bar in bars.values():
            bar.close()
    typer.echo(report.format())


@app.command("bench-store")
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
    json_out: Annotated[bool, typer.Option("--json", help="Print every figure as JSON.")] = False,
) -> None:
    """Edge and local mode side by side on the same synthetic BGE-M3-size data (write, disk, reopen, memory,
    p50/p95 per search mode with and without a filter, ColBERT dtype agreement)."""
    from .tools.bench_store import BenchData, format_report, run_store_bench

    eng = [e.strip() for e in engines.split(",") if e.strip()]
    dts = [d.strip() for d in colbert_dtypes.split(",") if d.strip()]
    try:
        for e in eng:
            check_choice("--engines", e, STORE_ENGINES)
        for d in dts:
            check_choice("--colbert-dtypes", d, COLBERT_DTYPES)
        from .pooling import check_pool_factor

        pools = tuple(check_pool_factor(int(f)) for f in colbert_pooling.split(",") if f.strip())
    except ValueError as e:
        raise _fail(e) from e
    if chunks < queries:
        raise _fail(ValueError("--chunks must be at least --queries"))
    data = BenchData(chunks=chunks, dim=dim, tokens=tokens, sparse=sparse, queries=queries)
    rep = run_store_bench(data, engines=eng, dtypes=dts, workdir=workdir, keep=keep, poolings=pools or (1,))
    typer.echo(json.dumps(rep) if json_out else format_report(rep))


@app.command("eval")
def eval_command(
    dataset: Annotated[
        Path, typer.Argument(help="BEIR dataset folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv.")
    ],
    collections: Annotated[
        list[str],
        typer.Option(
            "--collection",
            "-c",
            help="Collection (repeat to compare several of the same corpus; the first is the baseline).",
        ),
    ],
    model: ModelOpt = "BAAI/bge-m3",
    path: PathOpt = "./qdrant_data",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    store_engine: EngineOpt = "edge",
    split: Annotated[str, typer.Option(help="Qrels split: qrels/<split>.tsv.")] = "test",
    modes: Annotated[
        list[str] | None,
        typer.Option(help="Modes (repeatable or comma-separated; default all): " + ", ".join(EVAL_MODES)),
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
    progress: ProgressOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Retrieval quality of every search mode on a BEIR dataset (nDCG@10, Recall@100, MRR@10, latency,
    bytes per chunk); an empty collection is filled from the corpus first; several -c side by side."""
    _setup_logging(verbose)
    from .chunking import check_sizes
    from .encoder import connect_encoder, load_encoder
    from .evaluation import EvalOptions, ModeSettings, check_corpus, check_modes, evaluate, load_beir
    from .evaluation.metrics import import_pytrec_eval
    from .ingest import IngestOptions
    from .pooling import check_pool_factor
    from .schema import CollectionSchema
    from .stores.open import open_store, resolve_target

    mode_weights = parse_weights(weights)
    import_pytrec_eval()  # a missing eval extra is said before anything loads
    try:
        asked = [m.strip() for arg in modes or [",".join(EVAL_MODES)] for m in arg.split(",")]
        chosen = check_modes([m for m in asked if m])
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
        target = resolve_target(path=path, url=url, api_key=api_key, engine=_engine(store_engine))
    except ValueError as e:
        raise _fail(e) from e
    data = load_beir(dataset, split)
    options = EvalOptions(
        split=split,
        modes=chosen,
        settings=ModeSettings(candidates=candidates, weights=mode_weights, exact=exact),
        ignore_identical_ids=ignore_identical_ids,
        show_progress=progress,
        run_dir=run_dir,
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
            check_inputs(model)  # its files, before the model loads
            encoder = load_encoder(model, precision=precision, device=device)
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


@app.command()
def ui(
    model: ModelOpt = "BAAI/bge-m3",
    path: PathOpt = "./qdrant_data",
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    store_engine: EngineOpt = "edge",
    precision: PrecisionOpt = "auto",
    device: DeviceOpt = "auto",
    encoder_url: EncoderUrlOpt = None,
    encoder_api_key: EncoderKeyOpt = None,
    eval_dir: Annotated[
        Path | None, typer.Option("--eval-dir", help="Folder of `eval --json` files to chart.")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on; not loopback needs --ui-api-key.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port (0: any free one).")] = 8765,
    ui_api_key: Annotated[
        str | None,
        typer.Option(envvar="BGEM3_UI_API_KEY", show_default=False,
                     help="Require this key for the page's API (the page asks for it once)."),
    ] = None,
    insecure_no_auth: Annotated[
        bool, typer.Option("--insecure-no-auth", help="Allow a non-loopback --host without --ui-api-key.")
    ] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Serve a local page: search a store in all four modes side by side, open a hit to see why it came
    back (per-mode scores, sparse terms, ColBERT alignment), chart --eval-dir results (docs/explain.md)."""
    _setup_logging(verbose)
    from .encoder import connect_encoder, load_encoder
    from .stores.open import resolve_target
    from .ui.command import UiOptions, run_ui

    try:
        target = resolve_target(path=path, url=url, api_key=api_key, engine=_engine(store_engine))
    except ValueError as e:
        raise _fail(e) from e
    options = UiOptions(host=host, port=port, api_key=ui_api_key, insecure_no_auth=insecure_no_auth,
                        eval_dir=eval_dir, log_level="info" if verbose else "warning")  # fmt: skip

    def encoder() -> Any:
        if encoder_url:
            return connect_encoder(encoder_url, encoder_api_key)
        return load_encoder(model, precision=precision, device=device)

    run_ui(options, target, encoder)


def _engine(name: str) -> StoreEngine:
    try:
        check_choice("--store-engine", name, STORE_ENGINES)
    except ValueError as e:
        raise _fail(e) from e
    return cast("StoreEngine", name)


def main() -> None:  # pragma: no cover - run as a process by the CLI tests
    from bgem3_embeddings.cli_support import run_cli

    # TensorFlow starts (quietly) only when a command builds an encoder (`bgem3_embeddings.BGEM3Encoder`):
    # after its inputs are checked, and never with --encoder-url or --engine ray (the driver only
    # tokenizes).
    run_cli(app, expected=(BGEM3QdrantError,), start_tensorflow=False)
