"""How chunks and their vectors travel between a distributed engine's driver and its workers (Ray, Spark).

A chunk goes out as a row (`to_row`: the text once, the payload as JSON without it) and comes back with its
vectors (`pack`); the driver turns the returned columns into an EncodedBatch (`unpack`). Variable-length
arrays travel as bytes (Arrow binary), which Ray and Spark both carry as they are.

    >>> from bgem3_qdrant.ingest.plan import ChunkRecord
    >>> to_row(ChunkRecord("id-1", "hello", {"text": "hello", "source": "a.txt"}, n_tokens=3))
    {'id': 'id-1', 'text': 'hello', 'payload': '{"source": "a.txt"}', 'tokens': 5}
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..encoder import EncodedTexts
from ..payload import TEXT
from .encoding import EncodedBatch
from .plan import ChunkRecord

# The columns of a row sent to a worker.
ROW_COLUMNS = ("id", "text", "payload", "tokens")


def to_row(r: ChunkRecord) -> dict[str, Any]:
    """A record as a row: the text once, the payload without it, the tokens the encoder will run on."""
    payload = {k: v for k, v in r.payload.items() if k != TEXT}
    return {
        "id": r.id,
        "text": r.text,
        "payload": json.dumps(payload, ensure_ascii=False),
        "tokens": r.encoded_tokens,
    }


def pack(cols: dict[str, np.ndarray], batch: EncodedBatch) -> dict[str, np.ndarray]:
    """The input columns plus the encoded vectors (what a worker returns)."""
    v = batch.vectors
    return {
        "id": cols["id"],
        "text": cols["text"],
        "payload": cols["payload"],
        "tokens": np.asarray(cols["tokens"], dtype=np.int64),
        "dense": v.dense,
        "sparse_idx": np.asarray([i.astype(np.int64).tobytes() for i, _ in v.sparse], dtype=object),
        "sparse_val": np.asarray([w.astype(np.float32).tobytes() for _, w in v.sparse], dtype=object),
        "colbert": np.asarray([c.astype(np.float32).tobytes() for c in v.colbert], dtype=object),
    }


def unpack(cols: dict[str, np.ndarray]) -> EncodedBatch:
    """An EncodedBatch from the columns a worker returned (the text back in its payload)."""
    dense = np.asarray(np.stack(list(cols["dense"])), dtype=np.float32)
    hidden = dense.shape[1]
    payloads = [{TEXT: str(t), **json.loads(p)} for t, p in zip(cols["text"], cols["payload"], strict=True)]
    return EncodedBatch(
        ids=[str(i) for i in cols["id"]],
        payloads=payloads,
        vectors=EncodedTexts(
            dense=dense,
            sparse=[
                (np.frombuffer(i, dtype=np.int64), np.frombuffer(w, dtype=np.float32))
                for i, w in zip(cols["sparse_idx"], cols["sparse_val"], strict=True)
            ],
            colbert=[np.frombuffer(c, dtype=np.float32).reshape(-1, hidden) for c in cols["colbert"]],
        ),
        tokens=int(np.sum(cols["tokens"])),
    )
