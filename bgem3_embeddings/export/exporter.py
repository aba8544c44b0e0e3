"""export_model: check the request, load the checkpoint on CPU, write the chosen format."""

from __future__ import annotations

from pathlib import Path

from bgem3_embeddings.export.options import check_output_dir, resolve_options


def export_model(
    model_name_or_path: str | Path,
    out: str | Path,
    *,
    format: str = "saved_model",
    quantize: str | None = None,
    precision: str = "float32",
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
) -> Path:
    """Export a checkpoint (hub id or folder) to `out`, a new or empty folder.

    format: "saved_model" (quantize must be None/"none"; precision float32|bfloat16|float16) or
    "tflite" (quantize float16 (default) | int8 | none; precision float32).
    Raises ExportError (a ValueError) for a bad request before loading anything.
    """
    quantize = resolve_options(format, quantize, precision)
    out = check_output_dir(out)
    from bgem3_embeddings.encoder import BGEM3Encoder

    # Export on CPU: the SavedModel then carries no device placement and the converter sees plain ops.
    # The graph computes in its weight dtype (compute_dtype=precision), whatever this CPU supports, so a
    # bf16/fp16 SavedModel runs half-precision matmuls where it is served (a GPU, an AMX server).
    encoder = BGEM3Encoder(model_name_or_path, precision=precision, compute_dtype=precision, device="cpu",
                           revision=revision, cache_dir=cache_dir, local_files_only=local_files_only)
    if format == "saved_model":
        from bgem3_embeddings.export.saved_model import export_saved_model

        return export_saved_model(encoder, out, revision=revision)
    from bgem3_embeddings.export.tflite import export_tflite

    return export_tflite(encoder, out, quantize=quantize, revision=revision)
