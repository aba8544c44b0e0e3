"""What crosses the wire, and the audit record of it.

An adapter travels as one ArrayRecord of float32 arrays named as `bgem3_embeddings.finetune.lora` names
them (`layer_N/<projection>/lora_a` (in, r) and `.../lora_b` (r, out), and the heads' `colbert_linear/...`
and `sparse_linear/...`, of rank min(r, the head's outputs)); `check_adapter` refuses anything else (a
head's kernel or bias too), so no base weight can ride along. `MessageLog` writes every message the
ServerApp sends or receives (each record's keys, array names, dtypes, shapes and values; config and metric
values) into a folder: what an organisation shows its auditors, and what the tests read to check that no
text ever left a node.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

ARRAYS = "arrays"  # FedAvg's arrayrecord_key
CONFIG = "config"  # FedAvg's configrecord_key
METRICS = "metrics"
NUM_EXAMPLES = "num-examples"  # FedAvg's weighted_by_key
# layer_N/<projection>/lora_a|lora_b and <head>/lora_a|lora_b, the names lora.adapter_arrays gives
ADAPTER_NAME = re.compile(
    r"(layer_\d+/(query|key|value|attention_output|intermediate|output_dense)|colbert_linear|sparse_linear)"
    r"/lora_(a|b)"
)


def to_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """An adapter as Flower's ArrayRecord (float32, names kept)."""
    check_adapter({name: np.shape(a) for name, a in arrays.items()})
    return ArrayRecord({name: Array(np.asarray(a, np.float32)) for name, a in arrays.items()})


def adapter_in(content: RecordDict) -> ArrayRecord:
    """The message content's adapter record (FedAvg's "arrays" key)."""
    return content.array_records[ARRAYS]


def from_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    """An ArrayRecord back as {name: array}, refused unless it is an adapter."""
    arrays = {name: array.numpy() for name, array in record.items()}
    check_adapter({name: a.shape for name, a in arrays.items()})
    return arrays


def check_adapter(shapes: Mapping[str, tuple[int, ...]], rank: int | None = None) -> None:
    """ValueError unless every name is a LoRA factor, each A with its B (A (in, r), B (r, out)); with
    `rank`, r is rank, or min(rank, out) on a head (lora.head_rank: the 1-unit sparse head has rank 1)."""
    for name, shape in shapes.items():
        if not ADAPTER_NAME.fullmatch(name) or len(shape) != 2:
            raise ValueError(f"{name} {tuple(shape)} is not a LoRA adapter factor")
        partner = name[:-1] + ("b" if name.endswith("a") else "a")
        if partner not in shapes:
            raise ValueError(f"{name} {tuple(shape)} comes without {partner}")
    for name, shape in shapes.items():
        if not name.endswith("lora_a"):
            continue
        b = shapes[name[:-1] + "b"]
        if shape[1] != b[0]:
            raise ValueError(f"{name} {tuple(shape)} and its lora_b {tuple(b)} differ in rank")
        # a head's rank is lora.head_rank's min(rank, out) (not imported: the ServerApp needs no Keras)
        expected = rank if name.startswith("layer_") or rank is None else min(rank, b[1])
        if expected is not None and shape[1] != expected:
            raise ValueError(f"{name} {tuple(shape)} is not of rank {expected}")


def weighted_mean(adapters: Iterable[tuple[Mapping[str, np.ndarray], int]]) -> dict[str, np.ndarray]:
    """FedAvg by hand: each name's mean over the adapters, weighted by their example counts."""
    pairs = list(adapters)
    total = sum(n for _, n in pairs)
    mean: dict[str, np.ndarray] = {}
    for name in pairs[0][0]:
        mean[name] = np.zeros(np.shape(pairs[0][0][name]), np.float64)
        for adapter, n in pairs:
            mean[name] += adapter[name].astype(np.float64) * (n / total)
    return mean


def _record_json(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, list | tuple):
        return [_record_json(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


class MessageLog:
    """Every message's contents into `folder`: messages.jsonl (one line each) and the arrays as .npz."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._count = 0

    def write(self, direction: str, server_round: int, message: Message, node: int | None = None) -> None:
        """Record one message ("sent", "received" or "aggregate") of `server_round`."""
        with self._lock:
            self._count += 1
            entry: dict[str, Any] = {
                "n": self._count,
                "direction": direction,
                "round": server_round,
                "node": node if node is not None else _node_of(message, direction),
                "type": message.metadata.message_type,
            }
            if message.has_error():
                entry["error"] = message.error.reason
            else:
                entry["records"] = self._records(message, entry["n"])
            with open(self.folder / "messages.jsonl", "a", encoding="utf-8") as out:
                out.write(json.dumps(entry) + "\n")

    def write_arrays(self, direction: str, server_round: int, record: ArrayRecord) -> None:
        """Record arrays that are no message (the aggregate a round computed)."""
        content = {ARRAYS: record}
        with self._lock:
            self._count += 1
            entry = {"n": self._count, "direction": direction, "round": server_round, "node": None}
            entry["records"] = self._records_of(content, self._count)
            with open(self.folder / "messages.jsonl", "a", encoding="utf-8") as out:
                out.write(json.dumps(entry) + "\n")

    def _records(self, message: Message, n: int) -> dict[str, Any]:
        return self._records_of(dict(message.content.items()), n)

    def _records_of(self, content: Mapping[str, Any], n: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, record in content.items():
            if isinstance(record, ArrayRecord):
                arrays = {name: array.numpy() for name, array in record.items()}
                file = f"arrays-{n}-{key}.npz"
                stored: dict[str, Any] = {name.replace("/", "|"): a for name, a in arrays.items()}
                np.savez(self.folder / file, **stored)
                out[key] = {
                    "kind": "arrays",
                    "file": file,
                    "arrays": {
                        name: {"dtype": str(a.dtype), "shape": list(a.shape)} for name, a in arrays.items()
                    },
                }
            elif isinstance(record, ConfigRecord | MetricRecord):
                kind = "config" if isinstance(record, ConfigRecord) else "metrics"
                out[key] = {"kind": kind, "values": {k: _record_json(v) for k, v in record.items()}}
            else:  # a record kind Flower adds later: named, never dropped silently
                out[key] = {"kind": type(record).__name__, "repr": repr(record)}
        return out


def _node_of(message: Message, direction: str) -> int:
    meta = message.metadata
    return int(meta.dst_node_id if direction == "sent" else meta.src_node_id)


def read_arrays(folder: Path, file: str) -> dict[str, np.ndarray]:
    """The arrays a MessageLog entry names, under their adapter names."""
    with np.load(Path(folder) / file) as data:
        return {name.replace("|", "/"): data[name] for name in data.files}
