"""The federated App's parts without a federation (test_qdrant_federated.py runs one): what may travel,
FedAvg's arithmetic, the adapter in and out of a model, and each bad setting's one line."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from bgem3_qdrant.federated.node import NodeDataError, training_data
from bgem3_qdrant.federated.records import check_adapter, from_record, to_record, weighted_mean
from bgem3_qdrant.federated.settings import NodeConfigError, NodeSettings, RunSettings

from tests.support import assert_clean_failure, run_module

ADAPTER = {
    "layer_0/query/lora_a": np.arange(8, dtype=np.float32).reshape(4, 2),
    "layer_0/query/lora_b": np.ones((2, 4), np.float32),
    "colbert_linear/lora_a": np.ones((4, 2), np.float32),
    "colbert_linear/lora_b": np.ones((2, 4), np.float32),
    "sparse_linear/lora_a": np.ones((4, 1), np.float32),  # a 1-unit head: rank 1 whatever the run's rank
    "sparse_linear/lora_b": np.ones((1, 1), np.float32),
}


def test_an_adapter_travels_as_itself_and_nothing_else_passes() -> None:
    back = from_record(to_record(ADAPTER))
    assert back.keys() == ADAPTER.keys()
    for name in ADAPTER:
        np.testing.assert_array_equal(back[name], ADAPTER[name])
    check_adapter({name: a.shape for name, a in ADAPTER.items()}, rank=2)
    for name, shape in (
        ("layer_0/query/kernel", (4, 4)),  # a base weight
        ("embeddings/word_embeddings", (512, 4)),
        ("layer_0/query/lora_a", (4, 2, 1)),
        ("colbert_linear/kernel", (4, 4)),  # the heads' own weights never travel
        ("sparse_linear/kernel", (4, 1)),
        ("sparse_linear/bias", (1, 1)),
    ):
        with pytest.raises(ValueError, match="not a LoRA adapter factor"):
            check_adapter({name: shape})
    shapes = {name: a.shape for name, a in ADAPTER.items()}
    with pytest.raises(ValueError, match="not of rank 8"):
        check_adapter(shapes, rank=8)
    with pytest.raises(ValueError, match=re.escape("sparse_linear/lora_a (4, 2) is not of rank 1")):
        check_adapter({**shapes, "sparse_linear/lora_a": (4, 2), "sparse_linear/lora_b": (2, 1)}, rank=2)
    with pytest.raises(ValueError, match="comes without sparse_linear/lora_b"):
        check_adapter({k: v for k, v in shapes.items() if k != "sparse_linear/lora_b"})


def test_weighted_mean_weighs_by_examples() -> None:
    other = {name: a * 3 + 1 for name, a in ADAPTER.items()}
    mean = weighted_mean([(ADAPTER, 1), (other, 3)])
    for name in ADAPTER:
        np.testing.assert_allclose(mean[name], 0.25 * ADAPTER[name] + 0.75 * other[name])


def test_the_adapter_goes_into_a_model_and_comes_out_unchanged(tiny_checkpoint: Path) -> None:
    from bgem3_embeddings.checkpoint.files import resolve_checkpoint
    from bgem3_embeddings.finetune.lora import adapter_arrays, enable_lora, load_adapter_arrays
    from bgem3_embeddings.loading import build_model

    model, _ = build_model(resolve_checkpoint(str(tiny_checkpoint)), weights_cache=False)
    enable_lora(model, rank=4, seed=0, heads=True)  # as every node trains
    start = adapter_arrays(model)
    assert len(start) == 28  # 2 layers x 6 projections x (A, B), then both heads' A and B
    check_adapter({name: a.shape for name, a in start.items()}, rank=4)  # what a node sends passes
    assert all(not a.any() for name, a in start.items() if name.endswith("lora_b"))  # B starts at zero
    rng = np.random.default_rng(0)
    sent = {name: rng.standard_normal(a.shape).astype(np.float32) for name, a in start.items()}
    load_adapter_arrays(model, sent)
    for name, value in adapter_arrays(model).items():
        np.testing.assert_array_equal(value, sent[name])
    with pytest.raises(ValueError, match="do not match the model"):
        load_adapter_arrays(model, {**sent, "layer_0/query/kernel": np.zeros((32, 32), np.float32)})
    with pytest.raises(ValueError, match="shape"):
        load_adapter_arrays(model, {**sent, "layer_0/query/lora_a": np.zeros((32, 8), np.float32)})


def test_node_and_run_configs() -> None:
    run = RunSettings.from_config({"num-server-rounds": 2, "learning-rate": 0.01, "server-round": 1})
    assert (run.num_server_rounds, run.learning_rate, run.lora_rank) == (2, 0.01, 8)
    assert RunSettings.from_config(run.as_config()) == run
    node = NodeSettings.from_config({"collection": "docs", "queries": "q.jsonl"})
    assert (node.folder, node.target_collection, node.queries) == (
        Path("bgem3-federated/docs"),
        "docs-federated",
        Path("q.jsonl"),
    )
    with pytest.raises(NodeConfigError, match="no collection: start the SuperNode with --node-config"):
        NodeSettings.from_config({"path": "./qdrant_data"})
    with pytest.raises(NodeConfigError, match="unknown key 'colection'"):
        NodeSettings.from_config({"colection": "docs"})


def test_a_node_without_data_is_one_line(tmp_path: Path) -> None:
    run = RunSettings()
    cases = {
        "has no data to train on: set queries (to mine from the collection) or train-data": {},
        "no training data at": {"train-data": str(tmp_path / "none.jsonl")},
        "no store at": {"queries": str(tmp_path / "q.jsonl"), "path": str(tmp_path / "no-store")},
    }
    for phrase, extra in cases.items():
        node = NodeSettings.from_config({"collection": "docs", **extra})
        with pytest.raises(NodeDataError, match=re.escape(phrase)) as err:
            training_data(node, run)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--superlink", "10.1.2.3:9093", "--insecure"], "--insecure: 10.1.2.3:9093 is not this machine"),
        (["--superlink", "superlink"], "--superlink: HOST:PORT expected"),
        (["--superlink", "127.0.0.1:9093", "--root-certificates", "/no/ca.pem"], "no file at /no/ca.pem"),
    ],
)
def test_federate_refuses_bad_connections_in_one_line(args: list[str], phrase: str) -> None:
    done = run_module("bgem3_qdrant", "federate", *args)
    assert_clean_failure(done, 1, phrase)
