"""`bgem3-qdrant reindex` and `bgem3-qdrant tune` (issue 57, items 2, 3 and 7) on the tiny checkpoint.

reindex: a collection re-encoded by a tuned model keeps its ids, payloads and storage, holds exactly what
a direct BGEM3Encoder encode of the stored texts gives, continues after an interruption, leaves the old
collection as it was, and refuses bad input in one line with nothing written.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bgem3_qdrant import IngestOptions, Ingestor, open_store, resolve_target
from bgem3_qdrant.identity import stored_identity, stored_pooling
from bgem3_qdrant.payload import MODEL, N_TOKENS, TEXT
from bgem3_qdrant.pooling import pool_rows
from bgem3_qdrant.schema import CollectionSchema
from bgem3_qdrant.tuning.reindex import ReindexError, reindex_collection

from tests.support import assert_clean_failure, run_module

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "finetune_practice_task.py"


def practice_task(folder: Path, documents: int = 200) -> Path:
    """examples/finetune_practice_task.py's task written into `folder`."""
    spec = importlib.util.spec_from_file_location("finetune_practice_task", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.make_task(folder, documents=documents)
    return folder


def qdrant(*args: str) -> Any:
    return run_module("bgem3_qdrant", *args)


def snapshot(store_path: Path, collection: str) -> dict[str, Any]:
    """Every point of `collection`: id -> (payload, vectors)."""
    with open_store(resolve_target(path=str(store_path))) as store:
        return {
            p.id: (p.payload, p.vectors)
            for p in store.iter_points(collection, with_payload=True, with_vectors=True)
        }


def assert_same_points(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for pid, (payload, vectors) in a.items():
        assert b[pid][0] == payload
        for name, v in vectors.items():
            other = b[pid][1][name]
            if isinstance(v, tuple):
                for x, y in zip(v, other, strict=True):
                    np.testing.assert_array_equal(x, y)
            else:
                np.testing.assert_array_equal(v, other)


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path, encoder: Any, long_corpus: Path
) -> dict[str, Any]:
    """A store with collection `base` (the test corpus by the tiny model, ColBERT float32 pooled by 2, so
    that storage choices other than the defaults must be carried over) and a briefly tuned model (LoRA, a
    few steps: other weights, the same tokenizer)."""
    from bgem3_embeddings.finetune.options import FinetuneOptions
    from bgem3_embeddings.finetune.trainer import run_finetune

    root = tmp_path_factory.mktemp("reindex")
    store_path = root / "store"
    with open_store(resolve_target(path=str(store_path))) as store:
        schema = CollectionSchema(size=int(encoder.hidden_size), colbert_dtype="float32")
        opts = IngestOptions(
            chunk_size=24, chunk_overlap=4, batch_size=8, show_progress=False, colbert_pooling=2
        )
        ingestor = Ingestor(store, "base", encoder, schema, opts, model_id=str(tiny_checkpoint))
        ingestor.ingest_paths([long_corpus])
    task = practice_task(root / "task", documents=40)
    tuned = root / "tuned"
    run_finetune(
        FinetuneOptions(
            train_data=(task / "train.jsonl",), model=str(tiny_checkpoint), output_dir=tuned, lora_rank=4,
            max_steps=3, learning_rate=1e-2, train_group_size=4, unified_finetuning=True,
        )
    )  # fmt: skip
    return {"store": store_path, "tuned": tuned, "base": snapshot(store_path, "base")}


@pytest.fixture(scope="module")
def reindexed(world: dict[str, Any]) -> dict[str, Any]:
    """`bgem3-qdrant reindex -c base --model TUNED --into tuned` as a user runs it."""
    done = qdrant(
        "reindex", "-c", "base", "--model", str(world["tuned"]), "--into", "tuned",
        "--path", str(world["store"]), "--batch-size", "4", "--no-progress",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {"stdout": done.stdout, "points": snapshot(world["store"], "tuned")}


def test_reindex_keeps_ids_payloads_and_storage_and_holds_the_tuned_models_vectors(
    world: dict[str, Any], reindexed: dict[str, Any]
) -> None:
    from bgem3_embeddings import BGEM3Encoder

    base, new = world["base"], reindexed["points"]
    assert len(base) > 8 and new.keys() == base.keys()
    assert f"{len(base)} points, {len(base)} encoded" in reindexed["stdout"]
    for pid, (payload, _) in base.items():
        assert new[pid][0] == {**payload, MODEL: str(world["tuned"])}  # only the model's name changes
    with open_store(resolve_target(path=str(world["store"]))) as store:
        assert store.stored_schema("tuned") == store.stored_schema("base")
        assert store.stored_schema("tuned").colbert_dtype == "float32"
        assert stored_pooling(store, "tuned") == stored_pooling(store, "base") == 2
        identity = stored_identity(store, "tuned")
        assert identity is not None and identity.model == str(world["tuned"])
    # The reference: the tuned model encoding the stored texts directly.
    ids = sorted(base)
    texts = [base[i][0][TEXT] for i in ids]
    longest = max(base[i][0][N_TOKENS] for i in ids)
    ref = BGEM3Encoder(str(world["tuned"])).encode_corpus(
        texts, max_length=longest + 10, return_dense=True, return_sparse=True, return_colbert_vecs=True
    )
    moved = 0
    for k, pid in enumerate(ids):
        got = new[pid][1]
        np.testing.assert_allclose(got["dense"], ref["dense_vecs"][k], atol=1e-5)
        np.testing.assert_allclose(got["colbert"], pool_rows(ref["colbert_vecs"][k], 2), atol=1e-5)
        weights = {int(t): float(w) for t, w in zip(*got["sparse"], strict=True)}
        expected = {int(t): float(w) for t, w in ref["lexical_weights"][k].items()}
        assert weights.keys() == expected.keys()
        np.testing.assert_allclose([weights[t] for t in expected], list(expected.values()), atol=1e-5)
        moved += not np.allclose(got["dense"], base[pid][1]["dense"], atol=1e-4)
    assert moved == len(ids)  # the tuned model's vectors, not copies of the old ones
    assert_same_points(snapshot(world["store"], "base"), base)  # the old collection is untouched


def test_reindex_resumes_after_an_interruption(world: dict[str, Any], reindexed: dict[str, Any]) -> None:
    from bgem3_embeddings import BGEM3Encoder

    enc = BGEM3Encoder(str(world["tuned"]))
    real, calls = enc.encode_corpus, []

    def fails_on_the_third_batch(texts: Any, **kw: Any) -> Any:
        calls.append(len(texts))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(texts, **kw)

    store_path = str(world["store"])
    with open_store(resolve_target(path=store_path)) as store:
        enc.encode_corpus = fails_on_the_third_batch  # type: ignore[method-assign]
        with pytest.raises(KeyboardInterrupt):
            reindex_collection(store, "base", enc, "part", model_id=str(world["tuned"]), batch_size=4)
        assert store.count("part") == 8  # two batches written before it stopped
        with pytest.raises(ReindexError, match="exists already .*--resume"):
            reindex_collection(store, "base", enc, "part", model_id=str(world["tuned"]), batch_size=4)
        enc.encode_corpus = real  # type: ignore[method-assign]
        summary = reindex_collection(
            store, "base", enc, "part", model_id=str(world["tuned"]), batch_size=4, resume=True
        )
    assert (summary.skipped, summary.encoded) == (8, len(world["base"]) - 8)
    part = snapshot(world["store"], "part")
    assert part.keys() == reindexed["points"].keys()
    for pid, (payload, vectors) in part.items():
        assert payload == reindexed["points"][pid][0]
        np.testing.assert_allclose(vectors["dense"], reindexed["points"][pid][1]["dense"], atol=1e-5)
    assert_same_points(snapshot(world["store"], "base"), world["base"])


@pytest.fixture
def other_tokenizer(world: dict[str, Any], tmp_path: Path) -> Iterator[Path]:
    """The tuned model with one tokenizer setting changed (its chunks would be cut differently)."""
    folder = tmp_path / "other-tokenizer"
    shutil.copytree(world["tuned"], folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 77}))
    yield folder


@pytest.mark.parametrize(
    "case",
    ["into exists", "into is -c", "missing collection", "other tokenizer", "resume of another source"],
)
def test_reindex_bad_input_is_one_line_and_writes_nothing(
    world: dict[str, Any], reindexed: dict[str, Any], other_tokenizer: Path, case: str
) -> None:
    store = str(world["store"])
    model, source, into, extra = str(world["tuned"]), "base", "fresh", []
    phrases: tuple[str, ...]
    if case == "into exists":
        into, phrases = "tuned", ("collection 'tuned' exists already (--into)", "--resume")
    elif case == "into is -c":
        into, phrases = "base", ("--into 'base' is the collection being re-indexed (-c)",)
    elif case == "missing collection":
        source, phrases = "nope", ("collection 'nope' does not exist", "'base'")
    elif case == "other tokenizer":
        model, phrases = str(other_tokenizer), ("has another tokenizer", "other tokenizer files", "ingest")
    else:  # `base` was ingested, not made from `tuned`: --resume cannot continue anything into it
        source, into, extra = "tuned", "base", ["--resume"]
        phrases = ("collection 'base' (--into) is not made by reindex", "name a new collection")
    before = {name: snapshot(world["store"], name) for name in ("base", "tuned")}
    done = qdrant("reindex", "-c", source, "--model", model, "--into", into, "--path", store, *extra)
    assert_clean_failure(done, 1, *phrases)
    with open_store(resolve_target(path=store)) as st:
        assert "fresh" not in st.list_collections()
    for name, points in before.items():
        assert_same_points(snapshot(world["store"], name), points)


# -- tune: mine -> finetune -> reindex -> eval on the practice task (docs/finetune.md, "The tuning loop")

# LoRA rank 8 (tune's default) at these settings raised every mode beyond chance on the tiny checkpoint;
# the default temperature 0.02 collapses its random sparse head (see test_finetune_cli's learning test).
TUNE_OPTIONS = (
    "--holdout", "0.25", "--learning-rate", "1e-2", "--num-train-epochs", "15", "--temperature", "0.2",
    "--per-device-train-batch-size", "8", "--train-group-size", "4", "--save-steps", "20", "--no-progress",
)  # fmt: skip


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path, encoder: Any) -> dict[str, Any]:
    """`tune` as a user runs it: killed (SIGKILL) once its training has written a checkpoint, run again
    (it continues), then a third time (everything is done)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.support import user_env

    root = tmp_path_factory.mktemp("tune")
    task = practice_task(root / "task")
    queries = root / "queries"  # every query judged: tune holds a quarter out itself
    (queries / "qrels").mkdir(parents=True)
    shutil.copy(task / "queries.jsonl", queries / "queries.jsonl")
    judged = "".join(f"q{i}\td{i}\t1\n" for i in range(200))
    (queries / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + judged)
    store_path, out = root / "store", root / "run"
    with open_store(resolve_target(path=str(store_path))) as store:
        opts = IngestOptions(show_progress=False)
        Ingestor(store, "base", encoder, options=opts, model_id=str(tiny_checkpoint)).ingest_paths(
            [task / "corpus.jsonl"]
        )
    base = snapshot(store_path, "base")
    args = [
        sys.executable, "-m", "bgem3_qdrant", "tune", str(queries), "-c", "base", "-o", str(out),
        "--path", str(store_path), *TUNE_OPTIONS,
    ]  # fmt: skip
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=user_env(None))
    state = out / "model" / "training_state"
    deadline = time.monotonic() + 240
    while not state.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(first.pid, signal.SIGKILL)
    first.communicate()
    killed = sorted(p.name for p in out.iterdir())
    second, third = qdrant(*args[3:]), qdrant(*args[3:])
    return {
        "queries": queries, "store": store_path, "out": out, "base": base, "killed": killed,
        "second": second, "third": third,
    }  # fmt: skip


def test_tune_raises_held_out_ndcg_in_every_mode(loop: dict[str, Any]) -> None:
    from bgem3_qdrant.evaluation.modes import EVAL_MODES
    from bgem3_qdrant.tuning.loop import ndcg_by_mode

    assert loop["second"].returncode == 0, loop["second"].stderr
    figures = json.loads((loop["out"] / "eval.json").read_text())
    assert figures["queries"] == 50 and figures["collection"] == "base"
    assert list(figures["compare"]) == ["base-tuned"]
    rows = list(ndcg_by_mode(figures))
    assert [mode for mode, _, _ in rows] == list(EVAL_MODES)
    for mode, before, after in rows:
        assert after >= before + 0.05, (mode, before, after)
    table = loop["second"].stdout
    assert "d nDCG@10" in table and "base-tuned" in table
    assert table.rstrip().endswith((loop["out"] / "eval.txt").read_text().rstrip())


def test_tune_continues_after_a_kill_and_skips_what_is_complete(loop: dict[str, Any]) -> None:
    out = loop["out"]
    # killed in training: the mined data complete, the model's checkpoint written, no later stage
    assert loop["killed"] == ["mined", "mined.json", "model", "tune.json"]
    second = loop["second"].stdout
    assert "mine: done before: mined 150 of 200 queries" in second
    steps = json.loads((out / "finetune.json").read_text())["steps"]
    assert steps == 285 and "finetune: trained 285 steps" in second and "(resumed)" in second
    assert "reindex: 'base' -> 'base-tuned'" in second and "200 encoded" in second
    third = loop["third"]
    assert third.returncode == 0, third.stderr
    done = [line for line in third.stdout.splitlines() if ": done before: " in line]
    assert [line.split(":")[0] for line in done] == ["mine", "finetune", "reindex", "eval"]
    assert third.stdout.split("\n\n", 1)[1] == second.split("\n\n", 1)[1]  # the same table
    # the base collection is as it was; the tuned one holds the same chunks, by the tuned model
    assert_same_points(snapshot(loop["store"], "base"), loop["base"])
    tuned = snapshot(loop["store"], "base-tuned")
    assert tuned.keys() == loop["base"].keys()
    assert {p[MODEL] for p, _ in tuned.values()} == {str(out / "model")}


@pytest.mark.parametrize("case", ["other settings", "no holdout", "not a tune folder"])
def test_tune_bad_input_is_one_line(loop: dict[str, Any], tmp_path: Path, case: str) -> None:
    args = ["tune", str(loop["queries"]), "-c", "base", "--path", str(loop["store"])]
    listing = sorted(p.name for p in loop["out"].iterdir())
    if case == "other settings":
        options = [o if o != "15" else "3" for o in TUNE_OPTIONS]  # --num-train-epochs 3
        done = qdrant(*args, "-o", str(loop["out"]), *options)
        phrases: tuple[str, ...] = ("holds a tune run with other settings", "finetune.num_train_epochs 15.0")
    elif case == "no holdout":
        done = qdrant(*args, "-o", str(tmp_path / "new"), "--holdout", "0")
        phrases = ("--holdout",)
    else:
        (tmp_path / "notes.txt").write_text("mine")
        done = qdrant(*args, "-o", str(tmp_path), *TUNE_OPTIONS)
        phrases = ("holds something other than a tune run", "nothing was changed")
    assert_clean_failure(done, 1, *phrases)
    assert sorted(p.name for p in loop["out"].iterdir()) == listing
    assert not (tmp_path / "new").exists()


def test_tune_with_reranker_tunes_the_cross_encoder_and_compares_its_mode(
    loop: dict[str, Any], tiny_reranker_checkpoint: Path, tmp_path: Path
) -> None:
    """`--reranker`: the cross-encoder trains on the same mined data (a few steps here), the tuned one
    loads, orders the tuned collection's cross mode in eval, and a second run skips its stage."""
    from bgem3_embeddings import BGEM3Reranker

    out = tmp_path / "run"
    args = [
        "tune", str(loop["queries"]), "-c", "base", "-o", str(out), "--path", str(loop["store"]),
        "--into", "base-rr", "--reranker", str(tiny_reranker_checkpoint), "--holdout", "0.25",
        "--max-steps", "6", "--learning-rate", "1e-2", "--train-group-size", "4", "--modes", "rerank,cross",
        "--no-progress",
    ]  # fmt: skip
    first = qdrant(*args)
    assert first.returncode == 0, first.stderr
    assert "finetune-reranker: trained 6 steps" in first.stdout
    figures = json.loads((out / "eval.json").read_text())
    assert set(figures["modes"]) == set(figures["compare"]["base-rr"]["modes"]) == {"rerank", "cross"}
    pairs = [("query", "passage one"), ("query", "another passage")]
    base = BGEM3Reranker(str(tiny_reranker_checkpoint)).compute_score(pairs)
    tuned = BGEM3Reranker(str(out / "reranker")).compute_score(pairs)
    assert not np.allclose(base, tuned)  # trained, and FlagEmbedding's layout loads
    second = qdrant(*args)
    assert second.returncode == 0, second.stderr
    assert "finetune-reranker: done before: trained 6 steps" in second.stdout
    # Stopped after training, before its marker (and the eval): the next run finds the saved state and
    # resumes it (written in a process that trained the embedder first, read in one that did not).
    for name in ("reranker.json", "eval.json", "eval.txt"):
        (out / name).unlink()
    third = qdrant(*args)
    assert third.returncode == 0, third.stderr
    assert "finetune-reranker: trained 6 steps (resumed)" in third.stdout
    again = json.loads((out / "eval.json").read_text())
    assert again["compare"]["base-rr"]["modes"].keys() == {"rerank", "cross"}
