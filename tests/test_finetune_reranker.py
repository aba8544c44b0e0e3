"""`bgem3 finetune-reranker` against FlagEmbedding's reranker trainer, FlagReranker, and a user's mistakes.

The reference is FlagEmbedding 1.4.2's own `finetune.reranker.encoder_only.base`: its dataset
(`AbsRerankerTrainDataset`, reading the same JSONL file) and collator make the batch, its `CrossEncoderModel`
on `AutoModelForSequenceClassification` (as its runner builds it) computes the loss in training mode on the
tiny reranker with dropout 0, and torch differentiates it. Our sampling and pairs must give the very same
token ids; tests/reranker_finetune_worker.py computes our loss and gradients from them on TensorFlow, JAX
and PyTorch, each in a process of its own: the loss within 1e-5 relative, every parameter's gradient within
1e-5 of the gradients' scale, one clipped SGD step of `fit()` within float32 rounding of torch's.

Then as a user runs it: a short run on the generated practice task (examples/finetune_practice_task.py)
raises the held-out queries' ranking of their document among its negatives; FlagReranker loads the output
folder and scores pairs as our BGEM3Reranker does; bad input is one line with nothing written.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.finetune_exactness import GRAD_RTOL, assert_one_sgd_step, gradients_of, reference_step, run_worker
from tests.optional import require_module
from tests.reranker_finetune_worker import CASES, GROUP_SIZE, LINES, SGD_CASE
from tests.support import assert_clean_failure, run_module, user_env
from tests.test_finetune_cli import _position, _weights

torch = require_module("torch", "the reference trainer runs on torch (the dev extra)")

BACKENDS = ("tensorflow", "jax", "torch")
LOSS_RTOL = 1e-5
SEED = 7  # each line's draws: random.seed(SEED + i) there, random.Random(SEED + i) here
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "finetune_practice_task.py"


@pytest.fixture(scope="module")
def no_dropout_reranker(tiny_reranker_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny reranker with every dropout 0 (encoder and classification head): both sides then compute
    the same function."""
    folder = tmp_path_factory.mktemp("reranker_finetune") / "tiny-reranker-no-dropout"
    shutil.copytree(tiny_reranker_checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    config |= {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "classifier_dropout": 0.0}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def train_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("reranker_lines") / "train.jsonl"
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in LINES), encoding="utf-8")
    return path


def _flag_dataset(checkpoint: Path, train: Path, kd: bool, lengths: tuple[int, int]) -> tuple[Any, Any]:
    """FlagEmbedding's reranker dataset and collator, built as its runner builds them."""
    require_module("datasets", "FlagEmbedding's dataset reads with datasets (the dev extra)")
    from tests.flagembedding_ref import _stand_in_packages

    _stand_in_packages()
    from FlagEmbedding.abc.finetune.reranker.AbsArguments import AbsRerankerDataArguments
    from FlagEmbedding.abc.finetune.reranker.AbsDataset import AbsRerankerCollator, AbsRerankerTrainDataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    args = AbsRerankerDataArguments(
        train_data=[str(train)],
        train_group_size=GROUP_SIZE,
        query_max_len=lengths[0],
        passage_max_len=lengths[1],
        knowledge_distillation=kd,
    )
    collator = AbsRerankerCollator(
        tokenizer=tokenizer, query_max_len=lengths[0], passage_max_len=lengths[1], return_tensors="pt"
    )
    return AbsRerankerTrainDataset(args, tokenizer), collator


def _flag_model(checkpoint: Path) -> Any:
    """CrossEncoderModel as EncoderOnlyRerankerRunner.load_tokenizer_and_model builds it, in training mode."""
    from tests.flagembedding_ref import _stand_in_packages

    _stand_in_packages()
    from FlagEmbedding.finetune.reranker.encoder_only.base.modeling import CrossEncoderModel
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    config = AutoConfig.from_pretrained(str(checkpoint), num_labels=1)
    base = AutoModelForSequenceClassification.from_pretrained(str(checkpoint), config=config)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    return CrossEncoderModel(base, tokenizer=tokenizer, train_batch_size=len(LINES)).train()


def _reference_case(checkpoint: Path, train: Path, kd: bool, lengths: tuple[int, int]) -> tuple[dict, dict]:
    dataset, collator = _flag_dataset(checkpoint, train, kd, lengths)
    items = []
    for i in range(len(LINES)):
        random.seed(SEED + i)  # FlagEmbedding draws from the module's stream
        items.append(dataset[i])
    batch = collator(items)
    model = _flag_model(checkpoint)
    loss = model(batch["pair"], batch["teacher_scores"]).loss
    result = reference_step(loss, dict(model.model.named_parameters()))
    arrays = {
        "input_ids": batch["pair"]["input_ids"].numpy().astype(np.int32),
        "attention_mask": batch["pair"]["attention_mask"].numpy().astype(np.int32),
    }
    if kd:
        arrays["teacher_scores"] = np.asarray(batch["teacher_scores"], np.float32).reshape(len(LINES), -1)
    return result, arrays


@pytest.fixture(scope="module")
def reference(
    no_dropout_reranker: Path, train_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    cases: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    for name, kd, lengths in CASES:
        cases[name], batch = _reference_case(no_dropout_reranker, train_file, kd, lengths)
        arrays |= {f"{name}/{key}": value for key, value in batch.items()}
    batches = tmp_path_factory.mktemp("reranker_batches") / "batches.npz"
    np.savez(batches, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle
    return {"cases": cases, "batches": batches, "arrays": arrays}


@pytest.fixture(scope="module", params=BACKENDS)
def ours(
    request: pytest.FixtureRequest,
    reference: dict,
    no_dropout_reranker: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, np.ndarray]:
    out = tmp_path_factory.mktemp(f"reranker_{request.param}") / "out.npz"
    return run_worker(
        "tests.reranker_finetune_worker", request.param, no_dropout_reranker, reference["batches"], out
    )


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_our_pairs_are_flagembeddings_token_for_token(
    reference: dict, no_dropout_reranker: Path, train_file: Path, case: str
) -> None:
    """Sampling (one positive, negatives drawn with repetition when too few), the query/passage cuts, the
    join and the padding: the batch equals its dataset + collator's, teacher scores in group order."""
    from bgem3_embeddings.finetune.data import read_training_data, sample_group
    from bgem3_embeddings.finetune.reranker.batches import tokenize_pairs
    from bgem3_embeddings.tokenizer import BGEM3Tokenizer

    kd, (query_max_len, passage_max_len) = next((k, lengths) for n, k, lengths in CASES if n == case)
    data = read_training_data(train_file, knowledge_distillation=kd, train_group_size=GROUP_SIZE)
    groups = [
        sample_group(e, GROUP_SIZE, random.Random(SEED + i), knowledge_distillation=kd)
        for i, e in enumerate(data.examples)
    ]
    tokenizer = BGEM3Tokenizer.from_dir(no_dropout_reranker)
    batch = tokenize_pairs(tokenizer, groups, query_max_len=query_max_len, passage_max_len=passage_max_len)
    theirs = reference["arrays"]
    np.testing.assert_array_equal(batch.input_ids, theirs[f"{case}/input_ids"])
    np.testing.assert_array_equal(batch.attention_mask, theirs[f"{case}/attention_mask"])
    if kd:
        np.testing.assert_array_equal(batch.teacher_scores, theirs[f"{case}/teacher_scores"])
    else:
        assert batch.teacher_scores is None
    if case == "truncated":  # the pair is cut at query_max_len + passage_max_len
        assert batch.input_ids.shape[1] == query_max_len + passage_max_len


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_loss_equals_flagembedding(ours: dict, reference: dict, case: str) -> None:
    expected = reference["cases"][case]["loss"]
    assert expected > 0.1  # a loss that means something (three candidates: log 3 at chance)
    assert float(ours[f"{case}/term/loss"]) == pytest.approx(expected, rel=LOSS_RTOL)


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_every_gradient_equals_torch_autograd(ours: dict, reference: dict, case: str) -> None:
    expected = reference["cases"][case]["grads"]
    got = gradients_of(ours, case)
    assert set(expected) == set(got)  # every parameter of theirs, and nothing else, is trained here
    largest = max(float(np.abs(g).max()) for g in expected.values())
    assert largest > 0
    for name, ref in expected.items():
        error = float(np.abs(got[name] - ref).max())
        assert error <= GRAD_RTOL * largest, (name, error, largest)


def test_one_sgd_step_of_fit_equals_torch(ours: dict, reference: dict) -> None:
    """One SGD step clipped at norm 1 as Hugging Face's Trainer clips (TensorFlow's embedding rows summed)."""
    case = reference["cases"][SGD_CASE]
    largest = max(float(np.abs(g).max()) for g in case["grads"].values())
    # A constant added to a group's logits changes no softmax: the output bias' gradient is 0 in exact
    # arithmetic and float32 noise on both sides, so it is held to the model's gradient scale.
    assert_one_sgd_step(ours, SGD_CASE, case, gradient_scale={"classifier.out_proj.bias": largest})


# --- as a user runs it --------------------------------------------------------------------------------
# The practice task's settings that raise the held-out ranking on the dropout-free tiny reranker. With the
# tiny checkpoint's dropout 0.1 neither ours nor FlagEmbedding's torch trainer moves the training loss off
# chance (log 4) in 400-570 steps on this task: a 32-wide, 2-layer random model.
LEARNING_OPTIONS = (
    "--learning-rate", "1e-3", "--num-train-epochs", "30", "--train-group-size", "4",
    "--per-device-train-batch-size", "8",
)  # fmt: skip


def finetune_reranker(*args: str) -> subprocess.CompletedProcess[str]:
    return run_module("bgem3_embeddings.cli", "finetune-reranker", *args)


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("reranker_practice") / "task"
    subprocess.run([sys.executable, str(EXAMPLE), str(folder)], capture_output=True, text=True, check=True)
    return folder


def held_out_ranks(task: Path, model: Path) -> np.ndarray:
    """The rank (1 = first) of each held-out query's document among all 50 held-out documents, as our
    BGEM3Reranker scores them. Held-out queries are never trained on; their documents appear in training
    only as other queries' negatives."""
    from bgem3_embeddings.reranker.reranker import BGEM3Reranker

    def rows(name: str) -> dict[str, str]:
        return {r["_id"]: r["text"] for r in map(json.loads, (task / name).read_text().splitlines())}

    docs, queries = rows("corpus.jsonl"), rows("queries.jsonl")
    qrels = [line.split("\t")[:2] for line in (task / "qrels" / "test.tsv").read_text().splitlines()[1:]]
    held = [d for _, d in qrels]
    reranker = BGEM3Reranker(str(model), precision="float32", device="cpu")
    scores = np.array([reranker.compute_score([(queries[q], docs[d]) for d in held]) for q, _ in qrels])
    return 1 + (scores > np.diag(scores)[:, None]).sum(axis=1)


@pytest.fixture(scope="module")
def tuned(task: Path, no_dropout_reranker: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reranker_tuned") / "tuned"
    done = finetune_reranker(
        str(task / "train.jsonl"), "--model", str(no_dropout_reranker), "-o", str(out), *LEARNING_OPTIONS
    )
    assert done.returncode == 0, done.stderr
    assert f"trained 570 steps: the tuned reranker is in {out}" in done.stderr
    return out


def test_a_short_run_raises_the_held_out_ranking(task: Path, no_dropout_reranker: Path, tuned: Path) -> None:
    before, after = held_out_ranks(task, no_dropout_reranker), held_out_ranks(task, tuned)
    mrr_before, mrr_after = float((1 / before).mean()), float((1 / after).mean())
    # measured: MRR 0.089 -> 0.12-0.15 and mean rank 25.5 -> 19.9-21.6 of 50 over seeds 1, 2 and 42
    assert mrr_after >= mrr_before + 0.02, (mrr_before, mrr_after)
    assert after.mean() <= before.mean() - 3, (before.mean(), after.mean())


def test_flagreranker_loads_the_output_and_scores_as_we_do(no_dropout_reranker: Path, tuned: Path) -> None:
    from bgem3_embeddings.reranker.reranker import BGEM3Reranker
    from tests.flagembedding_ref import flag_reranker

    pairs = [(str(line["query"]), str(p)) for line in LINES for p in (*line["pos"], *line["neg"])]
    theirs = np.asarray(flag_reranker(tuned).compute_score(pairs), np.float64)
    ours = np.asarray(BGEM3Reranker(str(tuned), precision="float32", device="cpu").compute_score(pairs))
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5 * float(np.abs(theirs).max()))
    base = np.asarray(flag_reranker(no_dropout_reranker).compute_score(pairs), np.float64)
    assert float(np.abs(theirs - base).max()) > 1e-2  # the folder holds the tuned weights, not the base's


def _write(path: Path, lines: list[object]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_bad_input_is_one_line_and_nothing_is_lost(
    tiny_reranker_checkpoint: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    good = {"query": "document text", "pos": ["document retrieval"], "neg": ["user pass", "token model"]}
    bad = _write(tmp_path / "bad.jsonl", [good, {"query": "no positives", "neg": ["a"]}, good])
    model = ("--model", str(tiny_reranker_checkpoint))
    out = tmp_path / "out"
    done = finetune_reranker(str(bad), *model, "-o", str(out), "--max-steps", "1")
    assert_clean_failure(done, 1, f"{bad}:2", "--skip-invalid")
    assert not out.exists()
    # a line whose own instruction (FlagEmbedding's reranker key) is not text
    prompt = _write(tmp_path / "prompt.jsonl", [good | {"query_prompt": 3}])
    done = finetune_reranker(str(prompt), *model, "-o", str(out), "--query-instruction-for-rerank", "q: ")
    assert_clean_failure(done, 1, f"{prompt}:1", '"query_prompt" must be a string')
    # an embedding model is no cross-encoder
    done = finetune_reranker(str(bad), "--model", str(tiny_checkpoint), "-o", str(out), "--skip-invalid")
    assert_clean_failure(done, 1, "is not a cross-encoder reranker")
    assert not out.exists()
    # an output folder holding something else is refused, its files untouched
    other = tmp_path / "notes"
    other.mkdir()
    (other / "mine.txt").write_text("keep me")
    done = finetune_reranker(str(bad), *model, "-o", str(other), "--skip-invalid")
    assert_clean_failure(done, 1, str(other), "holds something other than a model checkpoint")
    assert (other / "mine.txt").read_text() == "keep me"
    # --skip-invalid trains on the rest, and the saved run refuses a second start without --resume
    done = finetune_reranker(str(bad), *model, "-o", str(out), "--skip-invalid", "--max-steps", "1")
    assert done.returncode == 0, done.stderr
    assert "skipped 1 invalid training lines" in done.stderr
    done = finetune_reranker(str(bad), *model, "-o", str(out), "--skip-invalid", "--max-steps", "1")
    assert_clean_failure(done, 1, "holds a training run already", "--resume")


def test_option_mistakes_are_one_line_before_anything_loads(
    tiny_reranker_checkpoint: Path, tmp_path: Path
) -> None:
    train = _write(tmp_path / "t.jsonl", [{"query": "q", "pos": ["p"], "neg": ["n"]}])
    model = ("--model", str(tiny_reranker_checkpoint))
    done = finetune_reranker(
        str(train), *model, "-o", str(tmp_path / "o"), "--train-group-size", "1", "--lora-alpha", "8",
        "--passage-max-len", "5", "--optimizer", "lion",
    )  # fmt: skip
    assert_clean_failure(
        done,
        1,
        "--train-group-size: a group needs negatives",
        "--lora-alpha: needs --lora-rank",
        "--passage-max-len: at least 6",
        "--optimizer: one of adamw, sgd",
    )
    done = finetune_reranker(str(train), *model, "-o", str(tmp_path / "none"), "--resume")
    assert_clean_failure(done, 1, "holds no training state to resume from", "start without --resume")
    done = finetune_reranker(str(tmp_path / "missing.jsonl"), *model, "-o", str(tmp_path / "o"))
    assert_clean_failure(done, 1, "missing.jsonl", "TRAIN")
    assert sorted(os.listdir(tmp_path)) == ["t.jsonl"]  # nothing was written


RESUME_OPTIONS = (
    "--learning-rate", "1e-3", "--max-steps", "30", "--save-steps", "3", "--train-group-size", "4",
)  # fmt: skip


def test_a_run_killed_and_resumed_ends_with_the_weights_of_a_run_never_stopped(
    task: Path, tiny_reranker_checkpoint: Path, tmp_path: Path
) -> None:
    """With dropout on (the tiny reranker's 0.1): the data, the dropout seed and the optimizer's state all
    continue where the saved step left them."""
    train, model = str(task / "train.jsonl"), str(tiny_reranker_checkpoint)
    whole = tmp_path / "whole"
    done = finetune_reranker(train, "--model", model, "-o", str(whole), *RESUME_OPTIONS)
    assert done.returncode == 0, done.stderr
    killed = tmp_path / "killed"
    command = [sys.executable, "-m", "bgem3_embeddings.cli", "finetune-reranker", train, "--model", model,
               "-o", str(killed), *RESUME_OPTIONS]  # fmt: skip
    process = subprocess.Popen(
        command, env=user_env(None), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 240
    while _position(killed) < 6 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL  # killed mid-run, not finished
    stopped_at = _position(killed)
    assert 6 <= stopped_at < 30
    done = finetune_reranker(train, "--model", model, "-o", str(killed), *RESUME_OPTIONS, "--resume")
    assert done.returncode == 0, done.stderr
    assert "trained 30 steps" in done.stderr
    expected, got = _weights(whole), _weights(killed)
    assert expected.keys() == got.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    first = _weights(tiny_reranker_checkpoint)
    assert any(not np.array_equal(first[n], expected[n]) for n in expected)


def test_lora_trains_adapters_and_the_head_only_and_saves_them_merged(
    task: Path, tiny_reranker_checkpoint: Path, tmp_path: Path
) -> None:
    from safetensors.numpy import load_file

    tuned = tmp_path / "lora"
    done = finetune_reranker(
        str(task / "train.jsonl"), "--model", str(tiny_reranker_checkpoint), "-o", str(tuned),
        "--lora-rank", "4", "--save-adapter", "--max-steps", "4", "--learning-rate", "1e-2",
        "--train-group-size", "4",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    base, merged = _weights(tiny_reranker_checkpoint), _weights(tuned)
    assert base.keys() == merged.keys()
    adapted = (".query.", ".key.", ".value.", "intermediate.dense.", "output.dense.")  # attention's too
    for name, value in base.items():
        is_kernel = name.endswith(".weight") and "LayerNorm" not in name
        if name.startswith("classifier."):
            assert not np.array_equal(merged[name], value), name  # the head trains whole
        elif is_kernel and any(part in name for part in adapted):
            assert not np.array_equal(merged[name], value), name  # kernel + B A, merged
        else:
            np.testing.assert_array_equal(merged[name], value, err_msg=name)  # embeddings, biases, norms
    adapter = load_file(str(tuned / "adapter_model.safetensors"))
    assert len(adapter) == 2 * 6 * 2  # A and B for six projections in each of the tiny model's two layers
    assert json.loads((tuned / "adapter_config.json").read_text())["rank"] == 4
