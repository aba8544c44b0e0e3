"""`bgem3-qdrant`: ingest documents into Qdrant with BGE-M3 vectors, search them, measure throughput.

The app and its entry point only: each command is a function in its own module under `commands/`
(options shared by several commands in `commands/common.py`), registered below in `--help` order.
"""

from __future__ import annotations

import typer

from .commands import (
    bench,
    bench_store,
    check,
    collections,
    drop,
    evaluate,
    federate,
    ingest,
    load_parquet,
    mcp,
    migrate,
    mine,
    reindex,
    search,
    tune,
    ui,
)
from .errors import BGEM3QdrantError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="BGE-M3 (dense + sparse + ColBERT) ingestion and hybrid search for Qdrant.",
    epilog="Any command: --debug (anywhere on the line) shows the traceback and logs behind an error; "
    "-v logs what it does. One process at a time opens an embedded store (--path).",
)

# One line per command: app.command("name")(module.function); a new command is a new module under
# commands/ (imported above) and one line here.
app.command("ingest")(ingest.ingest)
app.command("load-parquet")(load_parquet.load_parquet)
app.command("search")(search.search)
app.command("collections")(collections.collections)
app.command("drop")(drop.drop)
app.command("check")(check.check)
app.command("bench")(bench.bench)
app.command("migrate")(migrate.migrate)
app.command("bench-store")(bench_store.bench_store)
app.command("eval")(evaluate.eval_command)
app.command("ui")(ui.ui)
app.command("mcp")(mcp.mcp)
app.command("federate")(federate.federate)
app.command("mine")(mine.mine)
app.command("reindex")(reindex.reindex)
app.command("tune")(tune.tune)


def main() -> None:  # pragma: no cover - run as a process by the CLI tests
    from bgem3_embeddings.cli_support import run_cli

    # TensorFlow starts (quietly) only when a command builds an encoder (`bgem3_embeddings.BGEM3Encoder`):
    # after its inputs are checked, and never with --encoder-url or --engine ray (the driver only
    # tokenizes).
    run_cli(app, expected=(BGEM3QdrantError,), start_tensorflow=False)
