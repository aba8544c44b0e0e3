"""Federated tuning on Flower's Deployment Runtime: a SuperLink and two SuperNodes, each a real process on
loopback (insecure mode: loopback only), started once for the module (tests/flower_cluster.py).

Each node holds its own collection (a practice task of examples/finetune_practice_task.py, ingested by
`bgem3-qdrant eval`, which also measures the base model on the node's held-out queries). `bgem3-qdrant
federate` runs two rounds on the tiny checkpoint with --record, so the ServerApp writes every message it
sent and received and each round's aggregate: the tests read those. In round 1 SuperNode b is killed (with
its ClientApp) while training and restarted at once; round 1 must finish with node a alone and round 2 must
train on both. After the last round each node saves the shared model and reindexes its collection.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bgem3_qdrant.federated import APP_DIR
from bgem3_qdrant.federated.records import ADAPTER_NAME, read_arrays, weighted_mean

from tests.flower_cluster import local_federation
from tests.support import run_module

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "finetune_practice_task.py"
TASKS = {"a": (100, 1), "b": (140, 2)}  # documents, seed: two collections, two example counts
RANK = 8
# Settings under which 2 rounds of unified LoRA (the heads' factors travel too) raise each node's nDCG@10 in
# every mode on the tiny checkpoint (docs/federated.md has the figures); at 1e-2 the sparse vectors collapse.
OPTIONS = ("--rounds", "2", "--learning-rate", "3e-3", "--local-epochs", "12", "--lora-rank", str(RANK))
RUN_CONFIG = "lora-alpha=16.0 group-size=4 temperature=0.2 negative-number=7"
MODES = ("dense", "sparse", "hybrid", "colbert", "rerank", "all")
HEAD_FACTORS = {f"{head}/lora_{f}" for head in ("colbert_linear", "sparse_linear") for f in "ab"}
COLLECTION, INTO = "docs", "docs-federated"


def _task(root: Path, name: str) -> Path:
    documents, seed = TASKS[name]
    folder = root / f"task-{name}"
    subprocess.run(
        [sys.executable, str(EXAMPLE), str(folder), "--documents", str(documents), "--seed", str(seed)],
        check=True,
        capture_output=True,
    )
    return folder


def ndcg(task: Path, store: Path, collection: str, model: Path, out: Path) -> dict[str, float]:
    """`bgem3-qdrant eval` of the held-out queries, nDCG@10 per mode (it ingests the corpus into a
    collection that is new)."""
    done = run_module(
        "bgem3_qdrant", "eval", str(task), "-c", collection, "--model", str(model), "--path", str(store),
        "--json", str(out), "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    modes = json.loads(out.read_text())["modes"]
    return {mode: float(modes[mode]["ndcg@10"]) for mode in MODES}


@dataclass
class Federation:
    root: Path
    record: Path
    run: subprocess.CompletedProcess[str]
    tasks: dict[str, Path]
    stores: dict[str, Path]
    work: dict[str, Path]
    base: dict[str, dict[str, float]]
    ids: dict[str, int]  # a, b (killed in round 1), b2 (b restarted)
    model: Path

    def entries(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.record / "messages.jsonl").read_text().splitlines()]

    def arrays(self, entry: dict[str, Any]) -> dict[str, np.ndarray]:
        return read_arrays(self.record, entry["records"]["arrays"]["file"])


@pytest.fixture(scope="module")
def federation(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Federation:
    root = tmp_path_factory.mktemp("federation")
    tasks = {name: _task(root, name) for name in TASKS}
    stores = {name: root / f"store-{name}" for name in TASKS}
    work = {name: root / f"work-{name}" for name in TASKS}
    base = {
        name: ndcg(tasks[name], stores[name], COLLECTION, tiny_checkpoint, root / f"base-{name}.json")
        for name in TASKS
    }
    record = root / "record"
    with local_federation(root / "flower") as fed:
        for name in TASKS:
            fed.start_node(
                name,
                f'collection="{COLLECTION}" path="{stores[name]}" queries="{tasks[name] / "train.jsonl"}" '
                f'work-dir="{work[name]}" model="{tiny_checkpoint}"',
            )
        ids = {name: fed.nodes[name].node_id for name in TASKS}
        log = root / "federate.log"
        command = [
            sys.executable, "-m", "bgem3_qdrant", "federate", "--superlink", fed.address, "--insecure",
            "--model", str(tiny_checkpoint), "--min-nodes", "2", "--record", str(record), *OPTIONS,
            "--run-config", RUN_CONFIG,
        ]  # fmt: skip
        with open(log, "w") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
        try:
            # b dies in round 1 while its ClientApp works (SIGKILL: no goodbye to the SuperLink) ...
            fed.wait_for_log("b", "round 1: training", timeout=300)
            fed.kill_node("b")
            # ... and comes back at once, as a new node the next round samples
            ids["b2"] = fed.start_node("b").node_id
            proc.wait(timeout=700)
        finally:
            if proc.poll() is None:
                proc.kill()
    run = subprocess.CompletedProcess(command, proc.returncode, log.read_text(errors="replace"), "")
    return Federation(root, record, run, tasks, stores, work, base, ids, tiny_checkpoint)


def _train_entries(f: Federation, server_round: int, direction: str) -> list[dict[str, Any]]:
    return [
        e for e in f.entries() if e["round"] == server_round and e["direction"] == direction
        and (e.get("type") or "train") == "train"
    ]  # fmt: skip


def test_a_killed_supernode_leaves_the_round_to_the_others_and_rejoins_the_next(
    federation: Federation,
) -> None:
    f = federation
    assert f.run.returncode == 0, f.run.stdout[-3000:]
    ids = f.ids
    assert len({ids["a"], ids["b"], ids["b2"]}) == 3
    sent1 = {e["node"] for e in _train_entries(f, 1, "sent")}
    assert sent1 == {ids["a"], ids["b"]}
    replies1 = {e["node"]: e for e in _train_entries(f, 1, "received")}
    assert set(replies1) == {ids["a"], ids["b"]}
    assert "records" in replies1[ids["a"]]
    assert "error" in replies1[ids["b"]]  # the SuperLink's reply for a node gone offline
    assert "Node Unavailable" in replies1[ids["b"]]["error"]
    assert f"node {ids['b']}: left out of round 1: Error: Node Unavailable" in f.run.stdout
    # round 1's aggregate is node a's adapter alone
    [aggregate1] = [e for e in f.entries() if e["round"] == 1 and e["direction"] == "aggregate"]
    a1 = f.arrays(replies1[ids["a"]])
    for name, value in f.arrays(aggregate1).items():
        np.testing.assert_allclose(value, a1[name], rtol=1e-6)
    # round 2: the restarted b trains beside a, starting from round 1's aggregate
    sent2 = _train_entries(f, 2, "sent")
    assert {e["node"] for e in sent2} == {ids["a"], ids["b2"]}
    for entry in sent2:
        for name, value in f.arrays(entry).items():
            np.testing.assert_array_equal(value, f.arrays(aggregate1)[name])
    replies2 = _train_entries(f, 2, "received")
    assert {e["node"] for e in replies2} == {ids["a"], ids["b2"]}
    assert all("records" in e for e in replies2)
    # after the last round both nodes reindexed with the shared model
    assert "reindexed 100 points with the shared model" in f.run.stdout
    assert "reindexed 140 points with the shared model" in f.run.stdout


def test_the_aggregate_is_the_example_weighted_mean_of_what_the_nodes_sent(federation: Federation) -> None:
    f = federation
    for server_round in (1, 2):
        replies = [e for e in _train_entries(f, server_round, "received") if "records" in e]
        sent = [(f.arrays(e), int(e["records"]["metrics"]["values"]["num-examples"])) for e in replies]
        [aggregate] = [e for e in f.entries() if e["round"] == server_round and e["direction"] == "aggregate"]
        expected, got = weighted_mean(sent), f.arrays(aggregate)
        assert got.keys() == expected.keys()
        for name in expected:
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-7)
    # round 2 tells weighted from plain means apart: two different counts, two different adapters
    replies = [e for e in _train_entries(f, 2, "received") if "records" in e]
    counts = [int(e["records"]["metrics"]["values"]["num-examples"]) for e in replies]
    assert len(set(counts)) == 2, counts
    plain = {n: (f.arrays(replies[0])[n] + f.arrays(replies[1])[n]) / 2 for n in f.arrays(replies[0])}
    [aggregate] = [e for e in f.entries() if e["round"] == 2 and e["direction"] == "aggregate"]
    assert any(not np.allclose(f.arrays(aggregate)[n], plain[n], rtol=1e-5, atol=1e-7) for n in plain)
    # the reindex message carries the last aggregate
    final = [e for e in f.entries() if e["direction"] == "sent" and e["type"] == "train.reindex"]
    assert {e["node"] for e in final} == {f.ids["a"], f.ids["b2"]}
    for entry in final:
        for name, value in f.arrays(entry).items():
            np.testing.assert_array_equal(value, f.arrays(aggregate)[name])


def _texts(task: Path) -> list[str]:
    texts = []
    for file in ("corpus.jsonl", "queries.jsonl"):
        texts += [json.loads(line)["text"] for line in (task / file).read_text().splitlines()]
    return texts


def test_no_message_carries_a_base_weight_or_any_text(federation: Federation) -> None:
    f = federation
    entries = f.entries()
    assert len(entries) >= 12
    for entry in entries:
        for key, record in entry.get("records", {}).items():
            assert record["kind"] in ("arrays", "config", "metrics"), (key, record)
            if record["kind"] == "arrays":
                for name, spec in record["arrays"].items():
                    assert ADAPTER_NAME.fullmatch(name), name
                    assert spec["dtype"] == "float32"
                    a, b = spec["shape"]
                    rank = 1 if name.startswith("sparse_linear/") else RANK  # a 1-unit head: rank 1
                    assert (b if name.endswith("lora_a") else a) == rank, (name, spec)
            if record["kind"] == "metrics":
                assert set(record["values"]) <= {"num-examples", "points"}, record
            if record["kind"] == "config":
                for value in record["values"].values():
                    assert isinstance(value, int | float | bool) or value in (str(f.record), str(f.model)), (
                        value
                    )
    replies = [e for e in entries if e["direction"] == "received" and "records" in e]
    sent = [set(e["records"]["arrays"]["arrays"]) for e in replies if "arrays" in e["records"]]
    assert {len(names) for names in sent} == {28}  # 2 layers x 6 projections x (A, B), and the heads' A, B
    assert all(names >= HEAD_FACTORS for names in sent)  # the heads learn through factors that travel
    # no text of either node's corpus or queries, as UTF-8, anywhere in what was recorded
    recorded = b"".join(p.read_bytes() for p in sorted(f.record.iterdir()))
    texts = _texts(f.tasks["a"]) + _texts(f.tasks["b"])
    assert len(texts) > 400
    leaked = [t for t in texts if t.encode() in recorded]
    assert leaked == []


def test_each_node_beats_the_base_model_on_its_held_out_queries_in_every_mode(federation: Federation) -> None:
    f = federation
    for file in ("model.safetensors", "colbert_linear.pt", "sparse_linear.pt"):
        shared = {name: (f.work[name] / "model" / file).read_bytes() for name in TASKS}
        assert shared["a"] == shared["b"], file  # one model for both, from the shared adapter
    for name in TASKS:
        tuned = ndcg(
            f.tasks[name], f.stores[name], INTO, f.work[name] / "model", f.root / f"tuned-{name}.json"
        )
        for mode in MODES:
            assert tuned[mode] > f.base[name][mode] + 0.01, (name, mode, f.base[name], tuned)


def test_a_supernode_with_no_data_says_so_in_one_line(tiny_checkpoint: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-store"
    with local_federation(tmp_path / "flower") as fed:
        fed.start_node(
            "empty", f'collection="{COLLECTION}" path="{missing}" queries="{tmp_path / "q.jsonl"}"'
        )
        proc = fed.submit(
            APP_DIR,
            {"num-server-rounds": 1, "min-nodes": 1, "model": str(tiny_checkpoint), "reindex": False},
            tmp_path / "run.log",
        )
        assert proc.wait(timeout=300) == 0
        run_log = (tmp_path / "run.log").read_text(errors="replace")
        node_log = fed.nodes["empty"].log.read_text(errors="replace")
    reason = f"no store at {missing} (--node-config path): ingest this node's documents first"
    assert [line for line in run_log.splitlines() if reason in line] != []
    assert len([line for line in run_log.splitlines() if "no store at" in line]) == 1, run_log[-3000:]
    assert len([line for line in node_log.splitlines() if "no store at" in line]) == 1, node_log[-3000:]
    assert "no node trained in any round" in run_log
    assert "Traceback" not in run_log and "Traceback" not in node_log
