"""The `bgem3` command: encode texts, verify an install against the published numbers, and more.

Each command lives in its own function; heavy imports (TensorFlow) happen inside them so `--help` is fast.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from bgem3_embeddings.checkpoint.files import DEFAULT_MODEL_ID
from bgem3_embeddings.cli_options import DeviceOpt, PrecisionOpt
from bgem3_embeddings.cli_support import CommandError, check_inputs, load_encoder, refuse_empty_texts, run_cli
from bgem3_embeddings.explain.cli import ENCODER_URL_ENV
from bgem3_embeddings.query_text import empty_text, is_blank, texts_cut_note, token_counts_if_cut

app = typer.Typer(
    help="BGE-M3 embeddings (dense, sparse, ColBERT) with Keras / TensorFlow.\n\n"
    "To store documents in Qdrant and search them (ingest, search, eval, a search page, MCP): the "
    "`bgem3-qdrant` command (integrations/qdrant).\n\n"
    "--debug (anywhere on the command line, or BGEM3_DEBUG=1) shows the traceback behind an error and "
    "TensorFlow's start-up lines.",
    no_args_is_help=True,
)

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="Hub id or local checkpoint folder.", envvar="BGEM3_MODEL")
]
INT8_TOLERANCE = 2e-2


def read_texts(texts: list[str], file: Path | None) -> list[str]:
    """Texts from arguments, or a file: .jsonl lines with a "text" field, otherwise one text per line."""
    if file is None:
        return texts
    try:
        content = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise typer.BadParameter(f"cannot read {file}: {err}", param_hint="--file") from err
    if file.suffix != ".jsonl":
        return texts + [line for line in content.splitlines() if line.strip()]
    result = list(texts)
    for n, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise typer.BadParameter(f"{file}:{n}: not valid JSON: {err}", param_hint="--file") from err
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise typer.BadParameter(
                f"{file}:{n}: expected an object with a string 'text' field", param_hint="--file"
            )
        if is_blank(record["text"]):
            raise typer.BadParameter(f"{file}:{n}: {empty_text('its text')}", param_hint="--file")
        result.append(record["text"])
    return result


@app.command()
def encode(
    texts: Annotated[list[str] | None, typer.Argument(help="Texts to encode.")] = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help=".txt (one text per line) or .jsonl")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="JSONL output (default: stdout)")
    ] = None,
    model: ModelOpt = DEFAULT_MODEL_ID,
    dense: Annotated[bool, typer.Option("--dense/--no-dense")] = True,
    sparse: Annotated[bool, typer.Option("--sparse/--no-sparse")] = False,
    colbert: Annotated[bool, typer.Option("--colbert/--no-colbert")] = False,
    max_length: Annotated[int, typer.Option(help="Truncation length in tokens.")] = 8192,
    batch_size: Annotated[int, typer.Option(min=1)] = 256,
    precision: PrecisionOpt = "auto",
    compute_dtype: Annotated[
        str,
        typer.Option(help="auto | float32 | precision: the matmuls' dtype (docs/precision-and-devices.md)"),
    ] = "auto",
    device: DeviceOpt = "auto",
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress")] = None,
) -> None:
    """Encode texts to JSONL: one line per text with the chosen outputs."""
    refuse_empty_texts(texts or [], "TEXTS")  # as every text a user sends (query_text.is_blank)
    check_inputs(model, [file] if file is not None else [], "--file")  # all that is missing, at once
    all_texts = read_texts(texts or [], file)
    if not all_texts:
        raise typer.BadParameter("no texts given: pass texts as arguments or --file", param_hint="TEXTS")
    if output is not None and output.exists() and output.is_dir():
        raise typer.BadParameter(f"{output} is a directory", param_hint="--output")
    encoder = load_encoder(
        model, precision, device, compute_dtype=compute_dtype, batch_size=batch_size, show_progress=progress
    )
    kept = min(max_length, encoder.config.max_sequence_length)  # what encode() cuts at
    cut = token_counts_if_cut(encoder.tokenizer, all_texts, kept)
    if cut:  # said once, before the model runs
        typer.echo(f"warning: {texts_cut_note(cut, len(all_texts), kept)} (--max-length)", err=True)
    out = encoder.encode(
        all_texts,
        max_length=max_length,
        return_dense=dense,
        return_sparse=sparse,
        return_colbert_vecs=colbert,
    )
    sink = output.open("w", encoding="utf-8") if output else sys.stdout
    try:
        for i, text in enumerate(all_texts):
            record: dict[str, Any] = {"index": i, "text": text}
            if dense:
                record["dense"] = out["dense_vecs"][i].tolist()
            if sparse:
                record["sparse"] = out["lexical_weights"][i]
            if colbert:
                record["colbert"] = out["colbert_vecs"][i].tolist()
            sink.write(json.dumps(record, ensure_ascii=False) + "\n")
    finally:
        if output:
            sink.close()
    if output:
        typer.echo(f"wrote {len(all_texts)} records to {output}", err=True)


@app.command()
def verify(
    model: ModelOpt = DEFAULT_MODEL_ID,
    tolerance: Annotated[
        float | None,
        typer.Option(
            help="Largest allowed difference (the reference is fp16); default 2e-3, or 2e-2 with int8."
        ),
    ] = None,
    precision: PrecisionOpt = "float32",
    device: DeviceOpt = "auto",
) -> None:
    """Reproduce the numbers BAAI published for BGE-M3 and report each difference (needs BAAI's weights:
    another checkpoint is named by its fingerprint and exits 1)."""
    from bgem3_embeddings.checkpoint.files import resolve_checkpoint
    from bgem3_embeddings.checkpoint.fingerprint import checkpoint_fingerprint
    from bgem3_embeddings.config import BGEM3Config
    from bgem3_embeddings.verify import (
        foreign_outputs_message,
        format_report,
        not_baai_message,
        run_checks,
        shape_differences,
    )

    check_inputs(model)
    files = resolve_checkpoint(model)
    # Other sizes cannot be BAAI's weights: one message, before any weights load, not a table of failures.
    differences = shape_differences(BGEM3Config.from_json_file(files.config))
    if differences:
        raise CommandError(not_baai_message(model, checkpoint_fingerprint(files), differences))
    encoder = load_encoder(model, precision, device)
    if tolerance is None:
        # int8 weights and activations carry about two significant digits per product.
        tolerance = INT8_TOLERANCE if encoder.precision == "int8" else 2e-3
    checks = run_checks(encoder, tolerance=tolerance)
    foreign = foreign_outputs_message(checks, encoder.fingerprint())
    if foreign:
        typer.echo(foreign)  # first: which weights these are, then the table that shows it
    typer.echo(format_report(checks))
    if not all(c.ok for c in checks):
        raise typer.Exit(code=1)


# Commands from other modules register here, one line each: app.command("name")(function).
app.command("export")(__import__("bgem3_embeddings.export.cli", fromlist=["export_command"]).export_command)
app.command("bench")(__import__("bgem3_embeddings.bench.cli", fromlist=["bench"]).bench)
app.command("doctor")(__import__("bgem3_embeddings.doctor", fromlist=["doctor"]).doctor)
app.command("serve")(__import__("bgem3_embeddings.serve.cli", fromlist=["serve"]).serve)
app.command("bench-serve")(__import__("bgem3_embeddings.serve.bench", fromlist=["bench_serve"]).bench_serve)
app.command("explain")(__import__("bgem3_embeddings.explain.cli", fromlist=["cli"]).explain_command)
app.command("rerank")(__import__("bgem3_embeddings.reranker.cli", fromlist=["cli"]).rerank_command)
app.command("finetune")(__import__("bgem3_embeddings.finetune.cli", fromlist=["cli"]).finetune_command)
app.command("finetune-reranker")(
    __import__("bgem3_embeddings.finetune.reranker.cli", fromlist=["cli"]).finetune_reranker_command
)


def main() -> None:
    """The `bgem3` entry point: one-line errors (tracebacks with --debug), quiet TensorFlow start-up."""
    args = sys.argv[1:]
    # `serve` starts TensorFlow itself, after its checks and the port: a refused --host or a port in use
    # answers at once, and the parent of `--workers N` never loads it (each worker does). `explain` through
    # a server (--encoder-url or its variable) runs no model here.
    remote = "--encoder-url" in args or bool(os.environ.get(ENCODER_URL_ENV))
    soak = any(a == "--soak" or a.startswith("--soak=") for a in args)  # bench-serve's clients only
    no_model = bool(args) and (
        args[0] == "serve" or (args[0] == "explain" and remote) or (args[0] == "bench-serve" and soak)
    )
    run_cli(app, prog_name="bgem3", start_tensorflow=not no_model)


if __name__ == "__main__":
    main()
