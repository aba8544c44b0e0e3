"""Export BGE-M3 for other runtimes: a self-contained SavedModel (TF Serving, TF Java) and TFLite models.

    >>> from bgem3_embeddings.export import export_model
    >>> export_model("BAAI/bge-m3", "out/bge-m3-savedmodel", format="saved_model")   # doctest: +SKIP
    >>> export_model("BAAI/bge-m3", "out/bge-m3-tflite", format="tflite", quantize="int8")   # doctest: +SKIP

Names are imported lazily: the CLI imports this package to register its command without TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ExportError", "export_model", "export_saved_model", "export_tflite", "load_tflite"]

_WHERE = {
    "ExportError": "options",
    "export_model": "exporter",
    "export_saved_model": "saved_model",
    "export_tflite": "tflite",
    "load_tflite": "tflite",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"bgem3_embeddings.export.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'bgem3_embeddings.export' has no attribute {name!r}")
