"""One node's work, on its own machine: nothing here talks to Flower (client_app.py does).

- `training_data`: the node's FlagEmbedding JSONL, mined once from its collection (`tuning.mine`'s
  `mine_collection`, with the run's negative count and seed) or, with `train-data`, the file given.
- `train_round`: LoRA training (`run_finetune`, the loop `bgem3 finetune` runs) starting from the adapter
  the server sent (none in the first round: every node then starts from the same seeded factors); returns
  the trained adapter's arrays and the example count FedAvg weighs them by. It is unified fine-tuning
  (dense, sparse and ColBERT terms) with LoRA on the sparse and ColBERT heads too: their factors travel
  and are averaged with the encoder's, so all three modes learn while only adapter factors leave the node.
- `finish`: the base model with the shared adapter merged, saved in the node's folder, and the node's
  collection written again with it into a new one (`tuning.reindex`'s `reindex_collection`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BGEM3QdrantError
from .settings import NodeSettings, RunSettings

logger = logging.getLogger(__name__)

MINED = "mined"  # the node folder's mined training data (kept across rounds)
ROUND_MODEL = "round-model"  # the latest round's trained model (replaced each round)
SHARED_MODEL = "model"  # the base model with the shared adapter merged in, after the last round


class NodeDataError(BGEM3QdrantError):
    """The node has nothing to train on: one line naming what is missing and the --node-config key."""


def _store(node: NodeSettings) -> Any:
    from ..stores.open import open_store, resolve_target

    if node.url is None and not Path(node.path).exists():
        raise NodeDataError(
            f"no store at {node.path} (--node-config path): ingest this node's documents first "
            f"(`bgem3-qdrant ingest DOCS -c {node.collection} --path {node.path}`)"
        )
    return open_store(resolve_target(path=node.path, url=node.url))


def training_data(node: NodeSettings, run: RunSettings) -> Path:
    """The JSONL this node trains on: `train-data` as given, else mined from the collection once."""
    if node.train_data is not None:
        if not node.train_data.is_file():
            raise NodeDataError(f"no training data at {node.train_data} (--node-config train-data)")
        return node.train_data
    if node.queries is None:
        raise NodeDataError(
            f"node of collection {node.collection!r} has no data to train on: set queries "
            "(to mine from the collection) or train-data in --node-config"
        )
    out = node.folder / MINED
    mined = out / "train.jsonl"
    if mined.is_file():
        return mined
    from ..tuning.mine import mine_collection

    # mined into a folder of its own, renamed when complete: a node killed while mining mines again
    partial = node.folder / f"{MINED}.partial"
    with _store(node) as store:
        report = mine_collection(
            store,
            node.collection,
            node.queries,
            partial,
            negative_number=run.negative_number,
            seed=run.seed,
            model=node.model or run.model,
            overwrite=True,
            show_progress=False,
        )
    partial.rename(out)
    logger.info("mined %d training queries from %s", report.mined, node.collection)
    return mined


def count_examples(data: Path, run: RunSettings) -> int:
    """The queries FedAvg weighs this node's adapter by (the lines training reads)."""
    from bgem3_embeddings.finetune.data import read_training_data

    examples = len(read_training_data(data, train_group_size=run.group_size).examples)
    if examples == 0:
        raise NodeDataError(f"{data} holds no training example")
    return examples


def _options(node: NodeSettings, run: RunSettings, data: Path) -> Any:
    from bgem3_embeddings.finetune.options import FinetuneOptions

    options = FinetuneOptions(
        train_data=(data,),
        model=node.model or run.model,
        output_dir=node.folder / ROUND_MODEL,
        train_group_size=run.group_size,
        temperature=run.temperature,
        learning_rate=run.learning_rate,
        num_train_epochs=run.local_epochs,
        per_device_train_batch_size=run.batch_size,
        max_steps=run.max_steps or None,
        lora_rank=run.lora_rank,
        lora_alpha=run.lora_alpha or None,
        unified_finetuning=True,  # all three modes learn ...
        lora_heads=True,  # ... the heads through factors that may travel (their weights may not)
        seed=run.seed,
        save_steps=10**9,  # each round saves once, at its end
        overwrite_output_dir=True,
    )
    problems = options.problems()
    if problems:
        raise BGEM3QdrantError(f"run config: {problems[0]}")
    return options


class _AdapterExchange:
    """A Keras callback: the received adapter into the model before the first step, the trained one out
    after the last (the variables fit() trained, before anything else touches them)."""

    def __init__(self, start: dict[str, np.ndarray] | None) -> None:
        import keras

        class Callback(keras.callbacks.Callback):
            def on_train_begin(inner, logs: Any = None) -> None:  # noqa: N805 - Keras' callback
                if start:
                    from bgem3_embeddings.finetune.lora import load_adapter_arrays

                    load_adapter_arrays(inner.model.encoder, start)

            def on_train_end(inner, logs: Any = None) -> None:  # noqa: N805
                from bgem3_embeddings.finetune.lora import adapter_arrays

                self.trained = adapter_arrays(inner.model.encoder)

        self.callback = Callback()
        self.trained: dict[str, np.ndarray] | None = None


def train_round(
    node: NodeSettings, run: RunSettings, adapter: dict[str, np.ndarray] | None
) -> tuple[dict[str, np.ndarray], int]:
    """One round of local training from `adapter` (None: the seeded start); (trained adapter, examples)."""
    from bgem3_embeddings.finetune.trainer import run_finetune

    data = training_data(node, run)
    examples = count_examples(data, run)
    node.folder.mkdir(parents=True, exist_ok=True)
    exchange = _AdapterExchange(adapter)
    result = run_finetune(_options(node, run, data), callbacks=[exchange.callback])
    if exchange.trained is None:
        raise BGEM3QdrantError("training ran no step: raise the run config's max-steps or local-epochs")
    logger.info("trained %d steps on %d examples", result.steps, examples)
    return exchange.trained, examples


def shared_model(node: NodeSettings, run: RunSettings, adapter: dict[str, np.ndarray]) -> Path:
    """The base model with `adapter` merged into its kernels, saved in BAAI's layout in the node folder."""
    from bgem3_embeddings.checkpoint.files import resolve_checkpoint
    from bgem3_embeddings.finetune.lora import enable_lora, load_adapter_arrays
    from bgem3_embeddings.finetune.save import save_bgem3_checkpoint
    from bgem3_embeddings.loading import build_model

    files = resolve_checkpoint(node.model or run.model)
    model, _ = build_model(files, precision="float32", weights_cache=False)
    enable_lora(model, run.lora_rank, run.lora_alpha or None, run.seed, heads=True)
    load_adapter_arrays(model, adapter)
    out = node.folder / SHARED_MODEL
    save_bgem3_checkpoint(model, files.root, out, overwrite=True)
    return out


def finish(node: NodeSettings, run: RunSettings, adapter: dict[str, np.ndarray]) -> dict[str, Any]:
    """The shared model saved, then (run config `reindex`) the collection re-encoded by it into `into`."""
    folder = shared_model(node, run, adapter)
    summary: dict[str, Any] = {"points": 0}
    if not run.reindex:
        return summary
    from ..encoder import load_encoder
    from ..tuning.reindex import check_model, check_reindex, reindex_collection

    with _store(node) as store:
        check_reindex(store, node.collection, node.target_collection)
        check_model(store, node.collection, str(folder))
        encoder = load_encoder(str(folder))
        done = reindex_collection(
            store, node.collection, encoder, node.target_collection, model_id=str(folder), show_progress=False
        )
    logger.info("%s", done.format())
    return {"points": done.points}
