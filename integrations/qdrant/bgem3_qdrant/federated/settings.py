"""The federation's two configs as typed settings: the run config every node shares (the App's
`[tool.flwr.app.config]`, sent by the ServerApp in each round's ConfigRecord) and the node config each
SuperNode is started with (`flower-supernode --node-config 'collection="docs" path="./qdrant_data"'`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import BGEM3QdrantError


class NodeConfigError(BGEM3QdrantError):
    """A SuperNode's --node-config cannot work: one line naming the key."""


@dataclass(frozen=True)
class RunSettings:
    """What every node trains with (the run config's keys, `-` for `_`)."""

    num_server_rounds: int = 3
    model: str = "BAAI/bge-m3"
    lora_rank: int = 8
    lora_alpha: float = 0.0
    learning_rate: float = 1e-4
    local_epochs: float = 1.0
    max_steps: int = 0
    batch_size: int = 8
    group_size: int = 8
    temperature: float = 0.02
    negative_number: int = 15
    seed: int = 42
    min_nodes: int = 2
    reindex: bool = True
    round_timeout: float = 0.0
    record_dir: str = ""

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RunSettings:
        """From a run config or ConfigRecord (unknown keys, such as Flower's `server-round`, ignored)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            key = f.name.replace("_", "-")
            if key in config:
                default = getattr(cls, f.name)
                values[f.name] = type(default)(config[key])
        return cls(**values)

    def as_config(self) -> dict[str, Any]:
        """The settings as a ConfigRecord's values (the run config's own keys)."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class NodeSettings:
    """Where one node's data is and where its work goes. Keys of --node-config:

    collection (required), path (a folder store; default ./qdrant_data) or url (a Qdrant server; its key
    from QDRANT_API_KEY), queries (mined into training data from the collection: BEIR folder or
    FlagEmbedding JSONL, as `bgem3-qdrant mine` reads) or train-data (FlagEmbedding JSONL, used as is),
    work-dir (default ./bgem3-federated/<collection>), into (the collection the shared model writes;
    default <collection>-federated), model (this machine's copy of the run's base model).
    """

    collection: str
    path: str = "./qdrant_data"
    url: str | None = None
    queries: Path | None = None
    train_data: Path | None = None
    work_dir: Path | None = None
    into: str | None = None
    model: str | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> NodeSettings:
        known = {f.name.replace("_", "-") for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise NodeConfigError(
                f"--node-config: unknown key {unknown[0]!r}; the keys are {', '.join(sorted(known))}"
            )
        collection = str(config.get("collection", "")).strip()
        if not collection:
            raise NodeConfigError(
                "--node-config: no collection: start the SuperNode with "
                '--node-config \'collection="NAME" path="./qdrant_data" queries="queries.jsonl"\''
            )

        def text(key: str) -> str | None:
            value = str(config.get(key, "")).strip()
            return value or None

        def path(key: str) -> Path | None:
            value = text(key)
            return Path(value).expanduser() if value else None

        return cls(
            collection=collection,
            path=text("path") or "./qdrant_data",
            url=text("url"),
            queries=path("queries"),
            train_data=path("train-data"),
            work_dir=path("work-dir"),
            into=text("into"),
            model=text("model"),
        )

    @property
    def folder(self) -> Path:
        """The node's working folder (mined data, each round's model, the shared model)."""
        return self.work_dir or Path("bgem3-federated") / self.collection

    @property
    def target_collection(self) -> str:
        return self.into or f"{self.collection}-federated"
