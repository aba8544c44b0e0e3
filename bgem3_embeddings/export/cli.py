"""`bgem3 export`: the CLI face of export_model. Imports nothing heavy at module level (fast --help)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bgem3_embeddings.backends.keras_backend import require_tensorflow
from bgem3_embeddings.checkpoint.files import DEFAULT_MODEL_ID, CheckpointNotFoundError
from bgem3_embeddings.export.options import (
    FORMATS,
    TFLITE_QUANTIZE,
    ExportError,
    check_output_dir,
    resolve_options,
)

QUANTIZE_HELP = f"tflite weights: {' | '.join(TFLITE_QUANTIZE)} (default float16; int8 = dynamic range)"
PRECISION_HELP = "SavedModel weights: float32 | bfloat16 | float16"


def export_command(
    out: Annotated[Path, typer.Argument(help="Output folder: must not exist yet or be empty.")],
    format: Annotated[str, typer.Option("--format", help=" | ".join(FORMATS))] = "saved_model",
    quantize: Annotated[str | None, typer.Option(help=QUANTIZE_HELP)] = None,
    model: Annotated[str, typer.Option("--model", "-m", help="Hub id or local checkpoint folder.",
                                       envvar="BGEM3_MODEL")] = DEFAULT_MODEL_ID,
    precision: Annotated[str, typer.Option(help=PRECISION_HELP)] = "float32",
    revision: Annotated[str | None, typer.Option(help="Hub revision (branch, tag or commit).")] = None,
) -> None:
    """Export the model as a SavedModel (TF Serving, TF Java) or a TFLite model, with its tokenizer."""
    require_tensorflow("bgem3 export")  # before anything loads: one line on Keras' JAX or PyTorch backend
    try:
        quantize_value = resolve_options(format, quantize, precision)
        out = check_output_dir(out)
    except ExportError as err:
        raise typer.BadParameter(str(err)) from err
    from bgem3_embeddings.encoder import BGEM3Encoder

    try:
        # The graph computes in its weight dtype (portable to GPUs): docs/precision-and-devices.md.
        encoder = BGEM3Encoder(model, precision=precision, compute_dtype=precision, device="cpu",
                               revision=revision)
    except CheckpointNotFoundError:
        raise  # names the folder or hub id and the fix; run_cli shows it in one line
    except (ValueError, FileNotFoundError, TypeError) as err:
        raise typer.BadParameter(str(err), param_hint="--model/--revision") from err
    try:
        if format == "saved_model":
            from bgem3_embeddings.export.saved_model import export_saved_model

            export_saved_model(encoder, out, revision=revision)
        else:
            from bgem3_embeddings.export.tflite import export_tflite

            export_tflite(encoder, out, quantize=quantize_value, revision=revision)
    except ExportError as err:  # OUT appeared or filled up while the model was loading
        raise typer.BadParameter(str(err)) from err
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    typer.echo(f"wrote {format} export of {model} to {out} ({size / 1e6:.1f} MB)", err=True)
