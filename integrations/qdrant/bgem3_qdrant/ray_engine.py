"""Ray Data engine: the encoder runs in an actor pool (loaded once per actor), results stream to Qdrant.

The driver reads, chunks and checks what is already stored (cheap); Ray spreads the encoding (nearly
all of the work). Writes go through the driver for the embedded store (one process may open it) and
through a pool of writer actors for a server.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from .client import StoreTarget
from .errors import SourceError
from .schema import CollectionSchema
from .store import EncodedBatch, Store, encode_batch

logger = logging.getLogger(__name__)


def import_ray() -> Any:
    """ray, or an ImportError naming the pip install."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the Ray engine needs Ray Data: pip install 'bgem3-qdrant[ray]' (or pip install 'ray[data]')"
        ) from e
    return ray


@dataclass
class DriverEncoderInfo:
    """What the driver needs from a checkpoint without loading the model: tokenizer and sizes."""

    tokenizer: Any
    hidden_size: int
    model_id: str


def driver_tokenizer_encoder(model: str, **resolve_kwargs: Any) -> DriverEncoderInfo:
    """The checkpoint's tokenizer and hidden size, for chunking on the driver (no weights loaded)."""
    from transformers import AutoTokenizer

    from bgem3_embeddings.checkpoint.files import resolve_checkpoint

    files = resolve_checkpoint(model, **resolve_kwargs)
    config = json.loads(files.config.read_text(encoding="utf-8"))
    return DriverEncoderInfo(
        tokenizer=AutoTokenizer.from_pretrained(str(files.root)),
        hidden_size=int(config["hidden_size"]),
        model_id=model,
    )


# -- column codec: variable-length arrays travel as bytes (Arrow binary), which Ray handles everywhere
def _pack(batch: EncodedBatch, n_tokens: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "id": np.asarray(batch.ids, dtype=object),
        "payload": np.asarray([json.dumps(p, ensure_ascii=False) for p in batch.payloads], dtype=object),
        "n_tokens": n_tokens,
        "dense": batch.dense,
        "sparse_idx": np.asarray([i.astype(np.int64).tobytes() for i, _ in batch.sparse], dtype=object),
        "sparse_val": np.asarray([v.astype(np.float32).tobytes() for _, v in batch.sparse], dtype=object),
        "colbert": np.asarray([c.astype(np.float32).tobytes() for c in batch.colbert], dtype=object),
    }


def unpack(cols: dict[str, np.ndarray]) -> EncodedBatch:
    """An EncodedBatch from the columns an encoder actor returned."""
    dense = np.asarray(np.stack(list(cols["dense"])), dtype=np.float32)
    hidden = dense.shape[1]
    return EncodedBatch(
        ids=[str(i) for i in cols["id"]],
        payloads=[json.loads(p) for p in cols["payload"]],
        dense=dense,
        sparse=[
            (np.frombuffer(i, dtype=np.int64), np.frombuffer(v, dtype=np.float32))
            for i, v in zip(cols["sparse_idx"], cols["sparse_val"], strict=True)
        ],
        colbert=[np.frombuffer(c, dtype=np.float32).reshape(-1, hidden) for c in cols["colbert"]],
    )


class EncodeActor:
    """Ray Data callable class: one encoder per actor, built once in __init__."""

    def __init__(
        self, model: str, max_length: int, batch_size: int, encoder_kwargs: dict[str, Any] | None = None
    ) -> None:
        from .encoder import load_encoder

        self.encoder = load_encoder(model, **(encoder_kwargs or {}))
        self.max_length = max_length
        self.batch_size = batch_size

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        payloads = [json.loads(p) for p in batch["payload"]]
        enc = encode_batch(
            self.encoder,
            [str(t) for t in batch["text"]],
            [str(i) for i in batch["id"]],
            payloads,
            self.max_length,
            self.batch_size,
        )
        return _pack(enc, np.asarray(batch["n_tokens"], dtype=np.int64))


class WriteActor:
    """Ray Data callable class writing encoded batches to a Qdrant server (one client per actor)."""

    def __init__(
        self, target: StoreTarget, collection: str, schema: CollectionSchema, retries: int = 5
    ) -> None:
        from .client import open_client

        self.store = Store(open_client(target), collection, schema, retries=retries)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        eb = unpack(batch)
        self.store.upsert_async(eb).result()
        return {"n": np.asarray([len(eb)]), "tokens": np.asarray([int(np.sum(batch["n_tokens"]))])}


def run_ray(
    ingestor: Any,
    records: Any,
    store: Store,
    summary: Any,
    bar: Any,
    *,
    model: str | None = None,
    concurrency: int = 2,
    writers: int = 2,
    ray_address: str | None = None,
    target: StoreTarget | None = None,
    encoder_kwargs: dict[str, Any] | None = None,
    num_cpus_per_actor: float = 1.0,
    ray_init_kwargs: dict[str, Any] | None = None,
) -> None:
    """Ingest `records` with encoding in a Ray Data actor pool (see Ingestor.ingest_paths(engine="ray")).

    `model` is what each actor loads (default: the ingestor's model id); `target` is needed for
    parallel writes to a server (an embedded store is always written by the driver).
    """
    from .ingest import SPECIAL_TOKENS, batches_flushing_on_error, split_batch

    ray = import_ray()
    if not ray.is_initialized():
        ray.init(address=ray_address, **(ray_init_kwargs or {}))
    opts = ingestor.options
    model = model or ingestor.model_id

    # 1. Plan on the driver: chunk and drop what is already stored, so a resumed run encodes only the rest.
    todo_rows: list[dict[str, Any]] = []
    pending_error: SourceError | None = None
    batches = batches_flushing_on_error(records, opts.batch_size)
    while True:
        try:
            batch = next(batches, None)
        except SourceError as e:
            pending_error = e
            break
        if batch is None:
            break
        todo, relabel, unchanged = split_batch(
            batch, store.existing_async([r.id for r in batch]).result(), ingestor.model_id
        )
        ingestor._account(summary, batch, todo, relabel, unchanged, store, bar)
        bar.update(len(batch) - len(todo))
        todo_rows.extend(
            {
                "id": r.id,
                "text": r.text,
                "payload": json.dumps(r.payload, ensure_ascii=False),
                "n_tokens": r.n_tokens + SPECIAL_TOKENS,
            }
            for r in todo
        )

    # 2. Encode in the actor pool; results stream back as they are ready.
    if todo_rows:
        logger.info("encoding %d chunks with %d Ray actors", len(todo_rows), concurrency)
        ds = ray.data.from_items(todo_rows)
        ds = ds.map_batches(
            EncodeActor,
            fn_constructor_kwargs={
                "model": model,
                "max_length": opts.max_length,
                "batch_size": opts.encode_batch_size or opts.batch_size,
                "encoder_kwargs": encoder_kwargs or {},
            },
            batch_size=opts.batch_size,
            concurrency=concurrency,
            num_cpus=num_cpus_per_actor,
            batch_format="numpy",
        )
        if store.local or target is None or target.is_local:
            # The embedded store lives in this process: write from the driver, overlapping with Ray.
            for cols in ds.iter_batches(batch_size=None, batch_format="numpy"):
                eb = unpack(cols)
                store.upsert_async(eb)
                summary.encoded += len(eb)
                summary.tokens += int(np.sum(cols["n_tokens"]))
                bar.update(len(eb))
        else:
            ds = ds.map_batches(
                WriteActor,
                fn_constructor_kwargs={
                    "target": target,
                    "collection": store.collection,
                    "schema": store.schema,
                    "retries": opts.retries,
                },
                batch_size=None,
                concurrency=writers,
                num_cpus=0.25,
                batch_format="numpy",
            )
            for cols in ds.iter_batches(batch_size=None, batch_format="numpy"):
                n = int(np.sum(cols["n"]))
                summary.encoded += n
                summary.tokens += int(np.sum(cols["tokens"]))
                bar.update(n)
    if pending_error is not None:
        raise pending_error
