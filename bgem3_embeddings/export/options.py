"""Argument checks for export, done before any model is loaded (no TensorFlow import here)."""

from __future__ import annotations

from pathlib import Path

FORMATS = ("saved_model", "tflite")
# TFLite weight types: float16 (default: fp32 BGE-M3 exceeds the 2 GB flatbuffer limit), int8 dynamic
# range, or none (fp32 weights; only small checkpoints fit).
TFLITE_QUANTIZE = ("float16", "int8", "none")
DEFAULT_QUANTIZE = {"saved_model": "none", "tflite": "float16"}
SAVED_MODEL_PRECISIONS = ("float32", "bfloat16", "float16")


class ExportError(ValueError):
    """A bad export request (format, quantize, precision or output folder); nothing was written."""


def resolve_options(format: str, quantize: str | None, precision: str = "float32") -> str:
    """Check format/quantize/precision; return the effective quantize value."""
    if format not in FORMATS:
        raise ExportError(f"unknown export format {format!r}: choose one of {', '.join(FORMATS)}")
    if quantize is None:
        quantize = DEFAULT_QUANTIZE[format]
    if format == "saved_model":
        if quantize != "none":
            raise ExportError(
                f"--quantize {quantize!r} applies to tflite only; a SavedModel keeps the model's weights "
                f"(choose its dtype with --precision {'|'.join(SAVED_MODEL_PRECISIONS)})"
            )
        if precision not in SAVED_MODEL_PRECISIONS:
            raise ExportError(
                f"unknown precision {precision!r}: choose one of {', '.join(SAVED_MODEL_PRECISIONS)}"
            )
    else:
        if quantize not in TFLITE_QUANTIZE:
            raise ExportError(
                f"unknown quantize {quantize!r} for tflite: choose one of {', '.join(TFLITE_QUANTIZE)}"
            )
        if precision != "float32":
            # The converter quantizes from fp32 weights; a bf16/fp16 graph would be quantized twice.
            raise ExportError(f"tflite export starts from float32 weights (got --precision {precision!r}); "
                              f"use --quantize float16|int8 to shrink the model")
    return quantize


def check_output_dir(out: str | Path) -> Path:
    """OUT may be missing or an empty folder; anything else is refused (nothing is ever overwritten)."""
    path = Path(out).expanduser()
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            raise ExportError(f"{path} exists and is not a folder: choose a new output path")
        if any(path.iterdir()):
            raise ExportError(f"{path} exists and is not empty: choose a new output folder or empty it first")
    if path.parent.exists() and not path.parent.is_dir():
        raise ExportError(f"{path.parent} is not a folder")
    return path
