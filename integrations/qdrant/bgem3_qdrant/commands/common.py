"""What the `bgem3-qdrant` commands share: each option (and its environment variable) defined once,
logging set-up, expected failures as one line, the store engine checked."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

# --device and --precision read as in every `bgem3` command: defined once, re-exported for commands/.
from bgem3_embeddings.cli_options import DeviceOpt as DeviceOpt
from bgem3_embeddings.cli_options import PrecisionOpt as PrecisionOpt

from ..errors import BGEM3QdrantError
from ..schema import check_choice
from ..stores.open import STORE_ENGINES

if TYPE_CHECKING:
    from ..stores.open import StoreEngine, StoreTarget

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", envvar="BGEM3_MODEL", help="Hub id or local checkpoint directory.")
]
# Commands that read a collection: without --model, the model the collection records.
ReadModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        envvar="BGEM3_MODEL",
        show_default=False,
        help="Hub id, local checkpoint directory or `tiny` [default: the model the collection records, "
        "else BAAI/bge-m3].",
    ),
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
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO level.")]
# mine and tune: which qrels a BEIR QUERIES folder is read with
SplitOpt = Annotated[str, typer.Option(help="BEIR QUERIES: the qrels split, qrels/<split>.tsv.")]
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
RerankerOpt = Annotated[
    str | None,
    typer.Option(
        "--reranker",
        metavar="MODEL",
        envvar="BGEM3_RERANKER_MODEL",
        show_default=False,
        help="Order the mode's top candidates by this cross-encoder (BAAI/bge-reranker-v2-m3, or a folder).",
    ),
]
RerankCandidatesOpt = Annotated[
    int | None,
    typer.Option(
        "--rerank-candidates",
        min=1,
        metavar="N",
        show_default=False,
        help="With --reranker: how many of the mode's hits it reads (default 20, at least --limit).",
    ),
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


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")  # a no-op under run_cli
    if verbose:
        logging.getLogger().setLevel(logging.INFO)


def fail(e: Exception) -> BGEM3QdrantError:
    """An expected failure for run_cli to print as one line (exit 1)."""
    return e if isinstance(e, BGEM3QdrantError) else BGEM3QdrantError(str(e))



def collection_model(store: Any, collection: str, model: str | None) -> str:
    """The model to encode queries of `collection` with: --model when given, else the one the collection
    records (a hub id, a folder, `tiny`), else BAAI/bge-m3 (a collection without a record). A recorded
    folder that is not here is one line saying so, before anything loads."""
    from bgem3_embeddings.checkpoint.files import DEFAULT_MODEL_ID

    from ..identity import stored_identity

    if model is not None:
        return model
    identity = stored_identity(store, collection)
    if identity is None:
        return DEFAULT_MODEL_ID
    return _usable_record(collection, identity.model)


def _usable_record(collection: str, recorded: str) -> str:
    """`recorded` (the model `collection` records) when it can load here, else one line naming it."""
    from bgem3_embeddings.cli_support import checkpoint_problem

    problem = checkpoint_problem(recorded)
    if problem:
        raise fail(
            BGEM3QdrantError(
                f"collection {collection!r} records the model that wrote it, {recorded}, which is not "
                f"found here ({problem}); pass that checkpoint with --model"
            )
        )
    return recorded


def served_model(target: StoreTarget, model: str | None, collection: str | None = None) -> str:
    """The model of a command that opens its store lazily (mcp, ui), decided before the encoder is built:
    --model when given, else the model `collection` records (mcp's default collection) or, for None, the
    one every collection of the store records (ui: the page searches them all, so they must agree), read
    from a store opened and closed here; BAAI/bge-m3 when none records one or there is no store yet (the
    command's own check says so), or when the store is held by another process (the command's own opening
    of it then fails in one line)."""
    from bgem3_embeddings.checkpoint.files import DEFAULT_MODEL_ID

    from ..errors import StoreUnavailableError
    from ..identity import stored_identity
    from ..stores.open import open_store

    if model is not None:
        return model
    if not target.is_server and not Path(target.path).exists():
        return DEFAULT_MODEL_ID
    try:
        with open_store(target) as store:
            names = [collection] if collection is not None else store.list_collections()
            records = {n: stored_identity(store, n) for n in names if store.collection_exists(n)}
    except StoreUnavailableError:
        # Held by another process: the command's own checks (options, port, extras) come first, and its own
        # opening of the store then says what is wrong in one line, before any model is built.
        return DEFAULT_MODEL_ID
    recorded = {name: identity.model for name, identity in records.items() if identity is not None}
    models = sorted(set(recorded.values()))
    if not models:
        return DEFAULT_MODEL_ID
    if len(models) > 1:
        which = "; ".join(f"{name}: {m}" for name, m in sorted(recorded.items()))
        raise fail(
            BGEM3QdrantError(
                f"the store's collections record {len(models)} models ({which}): pass the one to search "
                "with as --model (a collection of another model is listed, not searched)"
            )
        )
    return _usable_record(min(recorded), models[0])


def check_reranker_option(reranker: str | None) -> None:
    """A --reranker folder that is missing or lacks files: one line, before anything loads."""
    from bgem3_embeddings.cli_support import checkpoint_problem

    problem = checkpoint_problem(reranker, "reranker") if reranker is not None else None
    if problem:
        raise fail(BGEM3QdrantError(f"{problem} (--reranker)"))


def load_reranker_option(reranker: str | None, precision: str, device: str) -> Any:
    """The --reranker model (None without one); a missing folder is one line before TensorFlow starts."""
    if reranker is None:
        return None
    from ..cross_encoder import load_reranker

    check_reranker_option(reranker)
    try:
        return load_reranker(reranker, precision=precision, device=device, show_progress=False)
    except ValueError as e:  # a checkpoint that is not a one-label sequence classifier, a precision
        raise fail(BGEM3QdrantError(f"{e} (--reranker)")) from e


def store_target(path: str, url: str | None, api_key: str | None, store_engine: str) -> StoreTarget:
    """Where the store options point; a folder store must exist already (a command that only reads, or
    drops, creates no empty store): one line naming the ingest that creates it."""
    from ..stores.open import resolve_target

    try:
        target = resolve_target(path=path, url=url, api_key=api_key, engine=checked_engine(store_engine))
    except ValueError as e:
        raise fail(e) from e
    if not target.is_server and target.engine == "edge" and not Path(path).exists():
        raise fail(
            BGEM3QdrantError(f"no store at {path}; create it with `bgem3-qdrant ingest PATH --path {path}`")
        )
    return target


def checked_engine(name: str) -> StoreEngine:
    """The --store-engine value, refused in one line unless it names an engine."""
    try:
        check_choice("--store-engine", name, STORE_ENGINES)
    except ValueError as e:
        raise fail(e) from e
    return cast("StoreEngine", name)
