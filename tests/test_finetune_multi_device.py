"""`bgem3 finetune` on more than one device: Keras' DataParallel on JAX with negatives_cross_device.

tests/finetune_multi_device_worker.py runs one batch of four queries on two virtual CPU devices (XLA's
--xla_force_host_platform_device_count, set before JAX loads) and on one. On two devices with
negatives_cross_device the loss and every gradient equal the single-device run on the whole batch, and
the loss equals FlagEmbedding's (its `EncoderOnlyEmbedderM3Model` on the same token ids, per process where
its terms are per process: the sparse, ColBERT, ensemble and self-distillation terms, which its
cross-device mode leaves local). A short `bgem3 finetune --data-parallel --negatives-cross-device` runs
on two devices end to end; TensorFlow and PyTorch refuse it in one line naming JAX.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.finetune_multi_device_worker import (
    CASES,
    DEVICES,
    FIT_CASE,
    GROUP_SIZE,
    QUERIES,
    SGD_LEARNING_RATE,
)
from tests.finetune_worker import TEMPERATURE
from tests.optional import require_module
from tests.support import assert_clean_failure, run_module, user_env

torch = require_module("torch", "the reference trainer runs on torch (the dev extra)")

LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-5
TWO_DEVICES = {"KERAS_BACKEND": "jax", "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES}"}


def _rows(side: dict, start: int, end: int) -> dict:
    return {key: value[start:end] for key, value in side.items()}


def _flagembedding(checkpoint: Path, batch: dict, model_kwargs: dict, half: int | None = None) -> Any:
    """FlagEmbedding's model in training mode on the whole batch, or on one device's half of it (the same
    padded token ids: a process of its own would pad its half alike or shorter); returns the model and its
    loss, not yet differentiated."""
    from tests.flagembedding_ref import m3_finetune_model

    defaults = {"unified_finetuning": False, "use_self_distill": False, "kd_loss_type": "kl_div"}
    model = m3_finetune_model(
        checkpoint, temperature=TEMPERATURE, normalize_embeddings=True, **(defaults | model_kwargs)
    )
    queries, passages = batch["queries"], batch["passages"]
    if half is not None:
        rows = len(QUERIES) // DEVICES
        queries = _rows(queries, half * rows, (half + 1) * rows)
        passages = _rows(passages, half * rows * GROUP_SIZE, (half + 1) * rows * GROUP_SIZE)
    return model, model(queries, passages, None, no_in_batch_neg_flag=False).loss


@pytest.fixture(scope="module")
def reference(no_dropout_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """FlagEmbedding's losses (whole batch and per half), its whole-batch dense gradients, and the batch."""
    from tests.flagembedding_ref import m3_collator

    collator = m3_collator(no_dropout_checkpoint, query_max_len=32, passage_max_len=64)
    batch = collator([(q, p, None) for q, p in QUERIES])
    unified = dict(CASES[1][1])
    model, loss = _flagembedding(no_dropout_checkpoint, batch, {})
    loss.backward()
    grads = {n: p.grad.numpy().copy() for n, p in model.model.named_parameters() if p.grad is not None}
    halves = [float(_flagembedding(no_dropout_checkpoint, batch, {}, h)[1].detach()) for h in range(DEVICES)]
    unified_halves = [
        float(_flagembedding(no_dropout_checkpoint, batch, unified, h)[1]) for h in range(DEVICES)
    ]
    path = tmp_path_factory.mktemp("multi_device") / "batch.npz"
    q, p = batch["queries"], batch["passages"]
    arrays = {
        "query_input_ids": q["input_ids"],
        "query_attention_mask": q["attention_mask"],
        "passage_input_ids": p["input_ids"],
        "passage_attention_mask": p["attention_mask"],
    }
    inputs = {k: v.numpy().astype(np.int32) for k, v in arrays.items()}
    inputs["step"] = np.zeros((len(QUERIES),), np.int32)
    np.savez(path, **inputs)
    return {
        "batch": path,
        "dense_whole": float(loss),
        "dense_grads": grads,
        "dense_halves": halves,
        "unified_halves": unified_halves,
    }


@pytest.fixture(scope="module")
def ours(reference: dict, no_dropout_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("multi_device_out") / "out.npz"
    command = [
        sys.executable,
        "-m",
        "tests.finetune_multi_device_worker",
        str(no_dropout_checkpoint),
        str(reference["batch"]),
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    with np.load(out) as data:
        return {key: data[key] for key in data.files}


def _grads(arrays: dict, prefix: str) -> dict[str, np.ndarray]:
    return {k.split("/grad/", 1)[1]: v for k, v in arrays.items() if k.startswith(f"{prefix}/grad/")}


def _assert_close_grads(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    """Every expected gradient within 1e-5 of the gradients' largest (float32 sums in another order)."""
    largest = max(float(np.abs(g).max()) for g in expected.values())
    assert largest > 0
    for name, ref in expected.items():
        error = float(np.abs(got[name] - ref).max())
        assert error <= GRAD_RTOL * largest, (name, error, largest)


def test_the_step_is_split_between_two_devices(ours: dict) -> None:
    """Two devices exist, and every input of the two-device step lies half on each."""
    assert int(ours["device_count"]) == int(ours["parallel_devices"]) == DEVICES
    for name, *_ in CASES:
        shards = ours[f"{name}/shards"]  # per input: (devices it spans, rows per shard)
        assert (shards[:, 0] == DEVICES).all(), shards
        assert sorted(set(shards[:, 1].tolist())) == [
            len(QUERIES) // DEVICES,
            len(QUERIES) * GROUP_SIZE // DEVICES,
        ]


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_two_devices_equal_one_device_on_the_whole_batch(ours: dict, case: str) -> None:
    """Loss, every term and every gradient of the two-device step equal the single-device run's."""
    one, two = f"{case}/one", f"{case}/two"
    terms = [k.split("/term/", 1)[1] for k in ours if k.startswith(f"{one}/term/")]
    assert "loss" in terms
    for term in terms:
        assert float(ours[f"{two}/term/{term}"]) == pytest.approx(
            float(ours[f"{one}/term/{term}"]), rel=LOSS_RTOL
        )
    _assert_close_grads(_grads(ours, two), _grads(ours, one))


def test_cross_device_dense_loss_and_gradients_equal_flagembedding_on_the_whole_batch(
    ours: dict, reference: dict
) -> None:
    """Every query against all four queries' passages: FlagEmbedding's loss on the whole batch (its
    cross-device loss: the same gathered scores and targets) and torch's gradients of it."""
    two = "dense_cross_device/two"
    assert float(ours[f"{two}/term/loss"]) == pytest.approx(reference["dense_whole"], rel=LOSS_RTOL)
    _assert_close_grads(_grads(ours, two), reference["dense_grads"])
    # not what each device's own batch gives: the negatives did cross the devices
    assert abs(float(ours[f"{two}/term/loss"]) - np.mean(reference["dense_halves"])) > 1e-3


def test_per_device_loss_is_flagembeddings_per_process_mean(ours: dict, reference: dict) -> None:
    """Without negatives_cross_device each device ranks its own queries' passages, as each of
    FlagEmbedding's processes does; the loss is their mean (what DDP's averaged gradient descends)."""
    got = float(ours["dense_per_device/two/term/loss"])
    assert got == pytest.approx(float(np.mean(reference["dense_halves"])), rel=LOSS_RTOL)


def test_unified_cross_device_loss_equals_flagembedding(ours: dict, reference: dict) -> None:
    """Unified fine-tuning with self-distillation across devices: FlagEmbedding's process loss is its own
    half's, with the dense term the whole batch's instead of the half's; that term counts 1/4 in the
    unified loss and that loss 1/2 once self-distillation joins (step 0 > -1): 1/8 in all."""
    two = "unified_cross_device/two"
    own = float(np.mean(reference["unified_halves"]))
    expected = own + (reference["dense_whole"] - float(np.mean(reference["dense_halves"]))) / 8
    assert float(ours[f"{two}/term/loss"]) == pytest.approx(expected, rel=LOSS_RTOL)
    assert float(ours[f"{two}/term/dense"]) == pytest.approx(reference["dense_whole"], rel=LOSS_RTOL)
    assert float(ours[f"{two}/term/self_distill"]) > 0


def test_one_fit_step_on_two_devices_equals_one_device(ours: dict) -> None:
    """`fit()`'s own step on two devices: the same loss, and SGD moves every weight as on one device."""
    one, two = f"{FIT_CASE}/one", f"{FIT_CASE}/two"
    assert float(ours[f"{two}/fit_loss"]) == pytest.approx(float(ours[f"{one}/fit_loss"]), rel=LOSS_RTOL)
    grads = _grads(ours, one)
    largest = max(float(np.abs(g).max()) for g in grads.values())
    moved = 0.0
    for key in (k for k in ours if k.startswith(f"{one}/after_sgd/")):
        name = key.split("/after_sgd/", 1)[1]
        error = float(np.abs(ours[f"{two}/after_sgd/{name}"] - ours[key]).max())
        assert error <= SGD_LEARNING_RATE * GRAD_RTOL * largest + 1e-6 * float(np.abs(ours[key]).max()), name
        if name in grads:
            moved = max(moved, SGD_LEARNING_RATE * float(np.abs(grads[name]).max()))
    assert moved > 1e-3  # the step moved the weights: equality is not the untouched weights'


# --- the command ---------------------------------------------------------------------------------------


def _train_file(path: Path) -> Path:
    # 9 examples, 4 a step: the last step's one query cannot be split between two devices and is left out
    lines = [{"query": q, "pos": [p[0]], "neg": [p[1], "an unrelated text"]} for q, p in QUERIES * 2]
    lines.append(lines[0])
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


# `bgem3 finetune`'s options for the runs below: 2 queries per device, so 4 a step on two devices
COMMAND_OPTIONS = (
    "--data-parallel",
    "--negatives-cross-device",
    "--unified-finetuning",
    "--per-device-train-batch-size",
    "2",
    "--train-group-size",
    "2",
    "--num-train-epochs",
    "1",
    "--learning-rate",
    "1e-3",
)


def _command(train: Path, checkpoint: Path, out: Path, log: Path, *more: str) -> list[str]:
    return ["finetune", str(train), "--model", str(checkpoint), "-o", str(out), "--log-json", str(log)] + [
        *COMMAND_OPTIONS,
        *more,
    ]


@pytest.fixture(scope="module")
def two_device_run(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One `bgem3 finetune` on two virtual devices of one process."""
    folder = tmp_path_factory.mktemp("two_devices")
    train, out, log = _train_file(folder / "train.jsonl"), folder / "tuned", folder / "log.jsonl"
    done = run_module("bgem3_embeddings.cli", *_command(train, tiny_checkpoint, out, log), env=TWO_DEVICES)
    return {"done": done, "train": train, "out": out, "log": log}


def _steps(log: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_finetune_on_two_devices_end_to_end(two_device_run: dict, tiny_checkpoint: Path) -> None:
    """`bgem3 finetune --data-parallel --negatives-cross-device` on two virtual devices: 4 queries a step
    (the ninth example's step, too short to split, left out); it trains, logs every step and saves a model
    that differs from the start."""
    from safetensors.numpy import load_file

    done = two_device_run["done"]
    assert done.returncode == 0, done.stderr[-4000:]
    assert "trained 2 steps" in done.stderr and f"on {DEVICES} devices" in done.stderr, done.stderr
    steps = _steps(two_device_run["log"])
    assert [s["step"] for s in steps] == [1, 2]
    assert all(np.isfinite(s["loss"]) and s["loss"] > 0 for s in steps)
    before = load_file(tiny_checkpoint / "model.safetensors")
    after = load_file(two_device_run["out"] / "model.safetensors")
    assert max(float(np.abs(after[k] - before[k]).max()) for k in before) > 1e-4


def test_two_hosts_on_loopback_train_as_two_devices_of_one(
    two_device_run: dict, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """Two processes of one device each, joined by jax.distributed on loopback (--coordinator-address,
    --num-processes, --process-id), each feeding its own rows: the same losses and the same tuned weights as
    the two devices of one process; the first process alone writes the output folder."""
    from safetensors.numpy import load_file

    from tests.spark_cluster import free_port

    coordinator = f"127.0.0.1:{free_port()}"
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bgem3_embeddings.cli",
                *_command(
                    two_device_run["train"],
                    tiny_checkpoint,
                    tmp_path / f"tuned{i}",
                    tmp_path / f"log{i}.jsonl",
                ),
                *("--coordinator-address", coordinator, "--num-processes", "2", "--process-id", str(i)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=user_env({"KERAS_BACKEND": "jax"}),
        )
        for i in range(2)
    ]
    results = [p.communicate(timeout=600) for p in processes]
    for process, (_, err) in zip(processes, results, strict=True):
        assert process.returncode == 0, err[-4000:]
        assert "trained 2 steps on 2 devices" in err, err
    expected = _steps(two_device_run["log"])
    for i in range(2):
        got = _steps(tmp_path / f"log{i}.jsonl")
        assert [s["loss"] for s in got] == pytest.approx([s["loss"] for s in expected], rel=LOSS_RTOL)
    reference = load_file(two_device_run["out"] / "model.safetensors")
    assert not (tmp_path / "tuned1").exists()  # the second host wrote nothing
    tuned = load_file(tmp_path / "tuned0" / "model.safetensors")
    assert set(tuned) == set(reference)
    for name, value in reference.items():
        assert float(np.abs(tuned[name] - value).max()) <= 1e-5 * max(1.0, float(np.abs(value).max())), name


@pytest.mark.parametrize(
    ("backend", "options"),
    [
        ("tensorflow", ("--data-parallel",)),
        ("torch", ("--data-parallel", "--negatives-cross-device")),
        ("tensorflow", ("--negatives-cross-device",)),
    ],
)
def test_other_backends_refuse_in_one_line_naming_jax(
    tiny_checkpoint: Path, tmp_path: Path, backend: str, options: tuple[str, ...]
) -> None:
    out = tmp_path / "tuned"
    done = run_module(
        "bgem3_embeddings.cli",
        "finetune",
        str(_train_file(tmp_path / "train.jsonl")),
        "--model",
        str(tiny_checkpoint),
        "-o",
        str(out),
        *options,
        env={"KERAS_BACKEND": backend},
    )
    assert_clean_failure(done, 1, options[-1], "JAX")
    assert not out.exists()
