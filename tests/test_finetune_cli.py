"""`bgem3 finetune` as a user runs it: it learns, it saves what FlagEmbedding loads, it resumes after a kill,
Ctrl-C saves, and bad input gets one line with nothing lost.

The learning test runs the README's path on examples/finetune_practice_task.py: `bgem3-qdrant eval` on the
held-out queries with the tiny checkpoint, `bgem3 finetune` on the training queries, `eval` again with the
tuned model; every mode's nDCG@10 must rise clearly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.support import assert_clean_failure, run_module, user_env

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "finetune_practice_task.py"
# The practice task's settings that raise every mode on the tiny checkpoint (docs/finetune.md): its random
# sparse head starts with scores that the default temperature 0.02 blows up into a collapse.
LEARNING_OPTIONS = (
    "--unified-finetuning",
    "--learning-rate",
    "3e-3",
    "--num-train-epochs",
    "15",
    "--temperature",
    "0.2",
    "--per-device-train-batch-size",
    "8",
    "--train-group-size",
    "4",
)
MODES = ("dense", "sparse", "hybrid", "rerank", "colbert", "all")


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("practice") / "task"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), str(folder)], capture_output=True, text=True, check=True
    )
    assert "150 train queries, 50 held out queries" in done.stdout
    return folder


def finetune(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_module("bgem3_embeddings.cli", "finetune", *args, env=env)


def _eval(task: Path, store: Path, collection: str, model: Path, out: Path) -> dict[str, float]:
    done = run_module(
        "bgem3_qdrant",
        "eval",
        str(task),
        "-c",
        collection,
        "--model",
        str(model),
        "--path",
        str(store),
        "--json",
        str(out),
        "--no-progress",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    return {mode: report["modes"][mode]["ndcg@10"] for mode in MODES}


def test_finetune_raises_every_mode_and_flagembedding_loads_the_result(
    task: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    before = _eval(task, store, "before", tiny_checkpoint, tmp_path / "before.json")
    tuned = tmp_path / "tuned"
    log = tmp_path / "log.jsonl"
    done = finetune(
        str(task / "train.jsonl"),
        "--model",
        str(tiny_checkpoint),
        "-o",
        str(tuned),
        *LEARNING_OPTIONS,
        "--log-json",
        str(log),
    )
    assert done.returncode == 0, done.stderr
    assert f"trained 285 steps: the tuned model is in {tuned}" in done.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 286))
    for key in (
        "loss",
        "dense",
        "sparse",
        "colbert",
        "ensemble",
        "learning_rate",
        "tokens_per_s",
        "sparse_zero_share",
    ):
        assert all(np.isfinite(r[key]) for r in records), key
    assert records[-1]["loss"] < records[0]["loss"]
    after = _eval(task, store, "after", tuned, tmp_path / "after.json")
    for mode in MODES:
        assert after[mode] >= before[mode] + 0.1, (mode, before[mode], after[mode])
    # the folder is BAAI's layout: FlagEmbedding's BGEM3FlagModel loads it and gives our outputs
    from bgem3_embeddings import BGEM3Encoder
    from tests.flagembedding_ref import flagembedding_m3
    from tests.tolerances import SCALED, UNIT_VECTORS

    texts = ["document retrieval is relevant", "東京 😀 e\u0301"]
    kwargs = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    ours = BGEM3Encoder(tuned, precision="float32", device="cpu").encode(texts, **kwargs)
    reference = flagembedding_m3(tuned).encode(texts, **kwargs)
    np.testing.assert_allclose(ours["dense_vecs"], reference["dense_vecs"], **UNIT_VECTORS)
    for mine, theirs in zip(ours["colbert_vecs"], reference["colbert_vecs"], strict=True):
        np.testing.assert_allclose(mine, theirs, **UNIT_VECTORS)
    for mine, theirs in zip(ours["lexical_weights"], reference["lexical_weights"], strict=True):
        assert mine.keys() == theirs.keys()
        np.testing.assert_allclose([mine[k] for k in mine], [theirs[k] for k in mine], **SCALED)


def _weights(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))


def _position(folder: Path) -> int:
    try:
        return int(json.loads((folder / "training_state" / "position.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


RESUME_OPTIONS = (
    "--unified-finetuning",
    "--use-self-distill",
    "--learning-rate",
    "1e-3",
    "--max-steps",
    "40",
    "--save-steps",
    "4",
    "--per-device-train-batch-size",
    "8",
    "--train-group-size",
    "8",
    "--passage-max-len",
    "64",
)


def test_a_run_killed_and_resumed_ends_with_the_weights_of_a_run_never_stopped(
    task: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    train, model = str(task / "train.jsonl"), str(tiny_checkpoint)
    whole = tmp_path / "whole"
    done = finetune(train, "--model", model, "-o", str(whole), *RESUME_OPTIONS)
    assert done.returncode == 0, done.stderr
    killed = tmp_path / "killed"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bgem3_embeddings.cli",
            "finetune",
            train,
            "--model",
            model,
            "-o",
            str(killed),
            *RESUME_OPTIONS,
        ],
        env=user_env(None),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    while _position(killed) < 8 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL  # killed mid-run, not finished
    stopped_at = _position(killed)
    assert 8 <= stopped_at < 40
    done = finetune(train, "--model", model, "-o", str(killed), *RESUME_OPTIONS, "--resume")
    assert done.returncode == 0, done.stderr
    assert "trained 40 steps" in done.stderr
    expected, got = _weights(whole), _weights(killed)
    assert expected.keys() == got.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    first = _weights(tiny_checkpoint)
    assert any(not np.array_equal(first[n], expected[n]) for n in expected if n in first)


def test_ctrl_c_saves_and_says_how_to_resume(task: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "tuned"
    args = [
        str(task / "train.jsonl"),
        "--model",
        str(tiny_checkpoint),
        "-o",
        str(out),
        "--max-steps",
        "400",
        "--save-steps",
        "2",
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "bgem3_embeddings.cli", "finetune", *args],
        env=user_env(None),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 240
    while _position(out) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    saved = _position(out)
    assert 2 <= saved < 400
    assert f"interrupted after step {saved}: saved to {out}; run the same command with --resume" in stderr
    assert "Traceback" not in stderr
    assert (out / "model.safetensors").is_file()


def _write(path: Path, lines: list[object]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_bad_input_is_one_line_and_nothing_is_lost(task: Path, tiny_checkpoint: Path, tmp_path: Path) -> None:
    good = {"query": "document text", "pos": ["document retrieval"], "neg": ["user pass", "token model"]}
    bad = _write(tmp_path / "bad.jsonl", [good, {"query": "no positives", "neg": ["a"]}, good])
    out = tmp_path / "out"
    done = finetune(str(bad), "--model", str(tiny_checkpoint), "-o", str(out), "--max-steps", "1")
    assert_clean_failure(done, 1, f"{bad}:2", "--skip-invalid")
    assert not out.exists()
    done = finetune(
        str(bad),
        "--model",
        str(tiny_checkpoint),
        "-o",
        str(out),
        "--max-steps",
        "1",
        "--skip-invalid",
        "--train-group-size",
        "2",
    )
    assert done.returncode == 0, done.stderr
    assert "skipped 1 invalid training lines" in done.stderr
    # an output folder holding something else is refused, its files untouched
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep me")
    done = finetune(str(bad), "--model", str(tiny_checkpoint), "-o", str(other), "--skip-invalid")
    assert_clean_failure(done, 1, str(other), "holds something other than a model checkpoint")
    assert (other / "mine.txt").read_text() == "keep me"
    # a model without heads
    headless = tmp_path / "headless"
    shutil.copytree(tiny_checkpoint, headless)
    (headless / "sparse_linear.pt").unlink()
    done = finetune(str(bad), "--model", str(headless), "-o", str(tmp_path / "h"), "--skip-invalid")
    assert_clean_failure(done, 1, "sparse_linear.pt", "colbert_linear.pt and sparse_linear.pt")


def test_option_mistakes_are_one_line_before_anything_loads(tiny_checkpoint: Path, tmp_path: Path) -> None:
    train = _write(tmp_path / "t.jsonl", [{"query": "q", "pos": ["p"], "neg": ["n"]}])
    done = finetune(
        str(train),
        "--model",
        str(tiny_checkpoint),
        "-o",
        str(tmp_path / "o"),
        "--use-self-distill",
        "--lora-alpha",
        "8",
        "--temperature",
        "0",
    )
    assert_clean_failure(
        done,
        1,
        "--use-self-distill",
        "add --unified-finetuning",
        "--lora-alpha: needs --lora-rank",
        "--temperature: must be positive",
    )
    done = finetune(str(train), "--model", str(tiny_checkpoint), "-o", str(tmp_path / "none"), "--resume")
    assert_clean_failure(done, 1, "holds no training state to resume from", "start without --resume")
    assert sorted(os.listdir(tmp_path)) == ["t.jsonl"]  # nothing was written for either


def test_lora_trains_adapters_and_heads_only_and_saves_them_apart(
    task: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    from safetensors.numpy import load_file

    tuned = tmp_path / "lora"
    done = finetune(
        str(task / "train.jsonl"), "--model", str(tiny_checkpoint), "-o", str(tuned), "--unified-finetuning",
        "--lora-rank", "4", "--save-adapter", "--max-steps", "6", "--learning-rate", "1e-2",
        "--train-group-size", "4",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    base, merged = _weights(tiny_checkpoint), _weights(tuned)
    adapted = (".query.", ".key.", ".value.", "intermediate.dense.", "output.dense.")  # attention's too
    for name, value in base.items():
        is_kernel = name.endswith(".weight") and "LayerNorm" not in name
        if is_kernel and any(part in name for part in adapted):
            assert not np.array_equal(merged[name], value), name  # kernel + B A, merged
        else:
            # frozen: embeddings, biases, norms
            np.testing.assert_array_equal(merged[name], value, err_msg=name)
    adapter = load_file(str(tuned / "adapter_model.safetensors"))
    assert len(adapter) == 2 * 6 * 2  # A and B for six projections in each of the tiny model's two layers
    assert adapter["layer_0/query/lora_a"].shape == (32, 4)
    assert json.loads((tuned / "adapter_config.json").read_text())["rank"] == 4
    # the heads train whole in unified fine-tuning
    import torch

    head = torch.load(tuned / "sparse_linear.pt", weights_only=True)["weight"].numpy()
    original = torch.load(tiny_checkpoint / "sparse_linear.pt", weights_only=True)["weight"].numpy()
    assert not np.array_equal(head, original)


def test_lora_on_the_heads_trains_factors_that_merge_and_round_trip(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    """--lora-heads (lora.enable_lora(heads=True)): the heads get trainable factors (the 1-unit sparse head of
    rank 1, at the same scale alpha / rank), their kernels and biases frozen; the kernel the model computes
    with (and saves) is kernel + scale * A B; the factors go out and into another model unchanged."""
    from safetensors.numpy import load_file

    from bgem3_embeddings.checkpoint.files import resolve_checkpoint
    from bgem3_embeddings.finetune.lora import adapter_arrays, enable_lora, load_adapter_arrays, write_adapter
    from bgem3_embeddings.finetune.options import FinetuneOptions
    from bgem3_embeddings.finetune.trainer import build_finetuner
    from bgem3_embeddings.loading import build_model

    files = resolve_checkpoint(str(tiny_checkpoint))
    options = FinetuneOptions(
        train_data=(tmp_path / "t.jsonl",), model=str(tiny_checkpoint), output_dir=tmp_path / "o",
        unified_finetuning=True, lora_rank=4, lora_alpha=8.0, lora_heads=True,
    )  # fmt: skip
    assert options.problems() == []
    finetuner, _ = build_finetuner(files, options, total_steps=1)
    model = finetuner.encoder
    trainable = {v.path for v in finetuner.trainable_variables}
    rng = np.random.default_rng(3)
    for head, rank in (("colbert_linear", 4), ("sparse_linear", 1)):
        layer = getattr(model, head)
        a, b = layer.lora_kernel_a, layer.lora_kernel_b
        assert (tuple(a.shape), tuple(b.shape)) == ((32, rank), (rank, layer.units)), head
        assert {a.path, b.path} <= trainable and not {layer._kernel.path, layer.bias.path} & trainable, head
        b.assign(rng.normal(0.0, 0.5, tuple(b.shape)).astype(np.float32))
        expected = layer._kernel.numpy() + 2.0 * (a.numpy() @ b.numpy())  # alpha / rank = 8 / 4 on both
        np.testing.assert_allclose(np.asarray(layer.kernel), expected, rtol=1e-6, atol=1e-6, err_msg=head)
        assert np.abs(expected - layer._kernel.numpy()).max() > 1e-2  # the factors do change the kernel
    sent = adapter_arrays(model)
    assert len(sent) == 2 * 6 * 2 + 2 * 2  # the projections' A and B, then each head's
    other, _ = build_model(files, precision="float32", weights_cache=False)
    enable_lora(other, 4, 8.0, seed=1, heads=True)
    load_adapter_arrays(other, sent)
    for name, value in adapter_arrays(other).items():
        np.testing.assert_array_equal(value, sent[name], err_msg=name)
    for head in ("colbert_linear", "sparse_linear"):
        np.testing.assert_allclose(
            np.asarray(getattr(other, head).kernel), np.asarray(getattr(model, head).kernel), rtol=1e-6
        )
    write_adapter(model, tmp_path, options)
    written = load_file(str(tmp_path / "adapter_model.safetensors"))
    assert written.keys() == sent.keys() and written["sparse_linear/lora_b"].shape == (1, 1)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["targets"][-2:] == ["colbert_linear", "sparse_linear"]
    assert config["head_ranks"] == {"colbert_linear": 4, "sparse_linear": 1}
    # the default (bgem3 finetune --lora-rank): no factors on the heads, which train whole
    plain, _ = build_finetuner(files, replace(options, lora_heads=False), total_steps=1)
    assert not plain.encoder.sparse_linear.lora_enabled
    assert plain.encoder.sparse_linear.kernel.path in {v.path for v in plain.trainable_variables}
    assert replace(options, unified_finetuning=False).problems() == [
        "--lora-heads: the heads learn from the sparse and ColBERT terms; add --unified-finetuning"
    ]
