"""The Ray engine: encoding runs in a Ray Data actor pool (one encoder per actor), results stream back.

The driver plans exactly as the plain engine does (same tokenizer, `BGEM3Tokenizer`, so the same chunks
and point ids) and imports neither TensorFlow nor torch: it reads the checkpoint's tokenizer and config
only. Each chunk's text travels once to an actor and once back (the payload travels without it).
Embedded stores are written by the driver through the ingestor's writer (only this process may open
them); a server is written by a pool of writer actors, each with the same Writer.

    >>> encoding = RayEncoding("BAAI/bge-m3", concurrency=4)          # doctest: +SKIP
    >>> Ingestor(store, "kb", encoding).ingest_paths(["corpus/"])     # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..encoder import EncodedTexts, EncoderLike, load_encoder
from ..identity import ModelIdentity
from ..payload import TEXT
from ..schema import CollectionSchema
from ..stores.open import StoreTarget, open_store
from .encoding import Destination, EncodedBatch, EncodeResult, Encoding, WrittenBatch, encode_records
from .options import IngestOptions
from .plan import ChunkRecord
from .writer import Writer

logger = logging.getLogger(__name__)
RAY_PIP = "pip install 'bgem3-qdrant[ray]' (or pip install 'ray[data]')"


def import_ray() -> Any:
    """ray, or an ImportError naming the pip install."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"the Ray engine needs Ray Data: {RAY_PIP}") from e
    return ray


# -- rows and columns: variable-length arrays travel as bytes (Arrow binary), which Ray handles everywhere
def to_row(r: ChunkRecord) -> dict[str, Any]:
    """A record as a Ray row: the text once, the payload without it."""
    payload = {k: v for k, v in r.payload.items() if k != TEXT}
    return {
        "id": r.id,
        "text": r.text,
        "payload": json.dumps(payload, ensure_ascii=False),
        "tokens": r.encoded_tokens,
    }


def pack(cols: dict[str, np.ndarray], batch: EncodedBatch) -> dict[str, np.ndarray]:
    """The input columns plus the encoded vectors (what an encoder actor returns)."""
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
    """An EncodedBatch from the columns an encoder actor returned (the text back in its payload)."""
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


class EncodeActor:
    """Ray Data callable class: one encoder per actor, built once in __init__."""

    def __init__(self, model: str, options: IngestOptions, encoder_kwargs: dict[str, Any]) -> None:
        self.encoder: EncoderLike = load_encoder(model, **encoder_kwargs)
        self.options = options

    def __call__(self, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        records = [
            ChunkRecord(str(i), str(t), {}, 0) for i, t in zip(cols["id"], cols["text"], strict=True)
        ]
        return pack(cols, encode_records(self.encoder, records, self.options))


class WriteActor:
    """Ray Data callable class writing encoded batches to a Qdrant server (one Writer per actor)."""

    def __init__(
        self,
        target: StoreTarget,
        collection: str,
        schema: CollectionSchema,
        retries: int,
        colbert_pooling: int = 1,
    ) -> None:
        self.writer = Writer(
            open_store(target), collection, schema, retries=retries, colbert_pooling=colbert_pooling
        )

    def __call__(self, cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch = unpack(cols)
        self.writer.upsert_async(batch).result()
        return {"n": np.asarray([len(batch)]), "tokens": np.asarray([batch.tokens])}


class RayEncoding(Encoding):
    """Encoding in a Ray Data actor pool (`concurrency` actors, each loading `model` once).

    `target` is where the ingestor writes: with a server, `writers` writer actors write in parallel;
    an embedded store is always written by the driver. `ray_address` joins a cluster (default: start or
    attach to a local Ray). `encoder_kwargs` go to each actor's BGEM3Encoder (precision, device).
    """

    def __init__(
        self,
        model: str,
        *,
        concurrency: int = 2,
        writers: int = 2,
        target: StoreTarget | None = None,
        ray_address: str | None = None,
        encoder_kwargs: dict[str, Any] | None = None,
        num_cpus_per_actor: float = 1.0,
        ray_init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        from bgem3_embeddings.checkpoint.files import resolve_checkpoint
        from bgem3_embeddings.tokenizer import BGEM3Tokenizer

        files = resolve_checkpoint(model)
        self.files = files
        config = json.loads(Path(files.config).read_text(encoding="utf-8"))
        self.vocab_size = int(config["vocab_size"])
        # The encoder's own tokenizer class (BGEM3Encoder builds the same from the same files).
        self.tokenizer = BGEM3Tokenizer.from_dir(files.root)
        self.hidden_size = int(config["hidden_size"])
        self.model_id = model
        self.concurrency = concurrency
        self.writers = writers
        self.target = target
        self.ray_address = ray_address
        self.encoder_kwargs = dict(encoder_kwargs or {})
        self.num_cpus_per_actor = num_cpus_per_actor
        self.ray_init_kwargs = dict(ray_init_kwargs or {})
        self._rows: list[dict[str, Any]] = []

    def identity(self) -> ModelIdentity | None:
        from bgem3_embeddings.checkpoint.fingerprint import checkpoint_fingerprint

        precision = self.encoder_kwargs.get("precision")
        return ModelIdentity(
            model=self.model_id,
            fingerprint=checkpoint_fingerprint(self.files),
            precision=None if precision in (None, "auto") else str(precision),
            vocab_size=self.vocab_size,
        )

    def submit(self, todo: list[ChunkRecord], options: IngestOptions) -> Iterator[EncodeResult]:
        # Only collected here: the actor pool is fed once the whole plan is known.
        self._rows.extend(to_row(r) for r in todo)
        return iter(())

    def finish(self, options: IngestOptions, destination: Destination) -> Iterator[EncodeResult]:
        rows, self._rows = self._rows, []
        if not rows:
            return
        ray = import_ray()
        if not ray.is_initialized():
            ray.init(address=self.ray_address, **self.ray_init_kwargs)
        logger.info("encoding %d chunks with %d Ray actors", len(rows), self.concurrency)
        ds = ray.data.from_items(rows).map_batches(
            EncodeActor,
            fn_constructor_kwargs={
                "model": self.model_id,
                "options": options,
                "encoder_kwargs": self.encoder_kwargs,
            },
            batch_size=options.batch_size,
            concurrency=self.concurrency,
            num_cpus=self.num_cpus_per_actor,
            batch_format="numpy",
        )
        if destination.store.in_process or self.target is None or not self.target.is_server:
            # The store lives in this process: the ingestor's writer stores what streams back.
            for cols in ds.iter_batches(batch_size=None, batch_format="numpy"):
                yield unpack(cols)
            return
        ds = ds.map_batches(
            WriteActor,
            fn_constructor_kwargs={
                "target": self.target,
                "collection": destination.collection,
                "schema": destination.schema,
                "retries": options.retries,
                "colbert_pooling": destination.colbert_pooling,
            },
            batch_size=None,
            concurrency=self.writers,
            num_cpus=0.25,
            batch_format="numpy",
        )
        for cols in ds.iter_batches(batch_size=None, batch_format="numpy"):
            yield WrittenBatch(int(np.sum(cols["n"])), int(np.sum(cols["tokens"])))
