"""Numbers on the wire: float lists or base64 of little-endian floats, as the server writes and the client
reads them (numpy only, no web framework).

OpenAI's `encoding_format: "base64"` is the little-endian float32 bytes of one vector; ColBERT rows use the
same layout, row-major, in float32 or float16 (the compact form: half the bytes, float16 rounding).

    >>> decode_floats(encode_floats(np.array([1.0, -2.0], np.float32)), "float32").tolist()
    [1.0, -2.0]
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

DTYPES = {"float32": "<f4", "float16": "<f2"}


def encode_floats(array: np.ndarray, dtype: str = "float32") -> str:
    """base64 of the array's values as little-endian `dtype` (float32 or float16), row-major."""
    return base64.b64encode(np.ascontiguousarray(array, dtype=DTYPES[dtype]).tobytes()).decode("ascii")


def decode_floats(data: str, dtype: str = "float32", shape: tuple[int, ...] | None = None) -> np.ndarray:
    """The float32 array `encode_floats` wrote (float16 data is widened to float32)."""
    values = np.frombuffer(base64.b64decode(data), dtype=DTYPES[dtype]).astype(np.float32)
    return values.reshape(shape) if shape is not None else values


def dense_item(vector: np.ndarray, encoding_format: str) -> Any:
    """One dense vector as a JSON value: a list of floats, or a base64 string."""
    return encode_floats(vector) if encoding_format == "base64" else np.asarray(vector, np.float32).tolist()


def colbert_item(rows: np.ndarray, encoding_format: str, dtype: str) -> dict[str, Any]:
    """ColBERT rows as response fields: `colbert_vecs` (list of rows or base64) and, for base64, the
    `colbert_shape` and `colbert_dtype` a reader needs."""
    if encoding_format != "base64":
        return {"colbert_vecs": np.asarray(rows, np.float32).tolist()}
    return {
        "colbert_vecs": encode_floats(rows, dtype),
        "colbert_shape": list(rows.shape),
        "colbert_dtype": dtype,
    }


def read_colbert(item: dict[str, Any]) -> np.ndarray:
    """The float32 rows of a response item written by `colbert_item`, in either encoding."""
    data = item["colbert_vecs"]
    if isinstance(data, str):
        shape = tuple(int(n) for n in item["colbert_shape"])
        return decode_floats(data, str(item.get("colbert_dtype", "float32")), shape)
    return np.asarray(data, dtype=np.float32)


def read_dense(value: Any) -> np.ndarray:
    """A dense vector written by `dense_item`, in either encoding."""
    return decode_floats(value) if isinstance(value, str) else np.asarray(value, dtype=np.float32)


TRUNCATED_HEADER = "BGEM3-Truncated"
"""Response header naming the texts cut at the max length (`query_text.cut_note`'s words), on every
embedding route: the OpenAI and TEI bodies have no field for it, so the header says it there too."""


def truncation_headers(*notes: str | None) -> dict[str, str]:
    """{TRUNCATED_HEADER: the notes joined} when a text was cut, else {} (no header at all)."""
    said = [n for n in notes if n]
    return {TRUNCATED_HEADER: "; ".join(said)} if said else {}
