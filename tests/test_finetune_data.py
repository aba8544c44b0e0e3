"""Fine-tuning data (bgem3_embeddings.finetune.data / .batches) against FlagEmbedding 1.4.2's own classes.

Reading and refusing bad lines (one line naming file:line), sampling each group draw for draw as
FlagEmbedding's `AbsEmbedderTrainDataset.__getitem__` (its real constructor, reading the same files with
`datasets`), batches token for token as its `AbsEmbedderCollator` with transformers' tokenizer, and the
seeded, resumable epoch order that keeps `no_in_batch_neg` data in batches of its own.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bgem3_embeddings.finetune.batches import tokenize_batch
from bgem3_embeddings.finetune.data import (
    SampledGroup,
    TrainExample,
    TrainingData,
    TrainingDataError,
    epoch_batches,
    read_training_data,
    sample_group,
    sampling_rng,
)
from bgem3_embeddings.tokenizer import BGEM3Tokenizer
from tests.optional import require_module

GOOD = {"query": "what is bge m3", "pos": ["a model"], "neg": ["a fruit", "a car"]}
GOOD_KD = {**GOOD, "pos_scores": [0.9], "neg_scores": [0.1, 0.2]}
LONG = "The quick brown fox jumps over the lazy dog near the river bank. " * 12  # over 128 tokens


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), "utf-8")
    return path


@pytest.fixture(scope="module")
def flag_dataset() -> Any:
    """FlagEmbedding's data module (its package __init__ cannot import on transformers 5; see
    tests/flagembedding_ref.py)."""
    require_module("datasets", "FlagEmbedding's dataset reads with datasets (the dev extra)")
    from tests.flagembedding_ref import _stand_in_packages

    _stand_in_packages()
    from FlagEmbedding.abc.finetune.embedder import AbsArguments, AbsDataset

    return AbsDataset, AbsArguments


def flag_train_dataset(flag_dataset: Any, path: Path, cache: Path, **data_args: Any) -> Any:
    AbsDataset, AbsArguments = flag_dataset
    args = AbsArguments.AbsEmbedderDataArguments(train_data=[str(path)], cache_path=str(cache), **data_args)
    return AbsDataset.AbsEmbedderTrainDataset(args, tokenizer=None)


# ------------------------------------------------------------------------------------------ reading
BAD_LINES = [  # (line as written, knowledge_distillation, what the message must say)
    ('{"query": "q", "pos": ["p"], "neg": [', False, "not valid JSON"),
    ('["q", "p"]', False, "not a JSON object (got list)"),
    ({"pos": ["p"], "neg": ["n"]}, False, 'no "query"'),
    ({**GOOD, "query": 3}, False, '"query" must be a string, got int'),
    ({**GOOD, "query": " \t"}, False, '"query" is empty'),
    ({"query": "q", "neg": ["n"]}, False, 'no "pos"'),
    ({**GOOD, "pos": "a model"}, False, '"pos" must be a list of strings, got str'),
    ({**GOOD, "pos": []}, False, '"pos" is empty'),
    ({**GOOD, "pos": ["p", 7]}, False, '"pos"[1] must be a string, got int'),
    ({**GOOD, "pos": ["p", "  "]}, False, '"pos"[1] is an empty passage'),
    ({"query": "q", "pos": ["p"]}, False, 'no "neg"'),
    ({**GOOD, "neg": None}, False, '"neg" must be a list of strings, got null'),
    ({**GOOD, "neg": ["n", ""]}, False, '"neg"[1] is an empty passage'),
    ({**GOOD, "neg": []}, False, '"neg" is empty: a group of 8 needs negatives'),
    ({**GOOD, "prompt": 5}, False, '"prompt" must be a string, got int'),
    (GOOD, True, 'no "pos_scores"'),
    ({**GOOD_KD, "neg_scores": 0.3}, True, '"neg_scores" must be a list of numbers, got float'),
    ({**GOOD_KD, "pos_scores": [True]}, True, '"pos_scores"[0] must be a finite number, got true'),
    ({**GOOD_KD, "neg_scores": [0.1, "0.2"]}, True, '"neg_scores"[1] must be a finite number, got "0.2"'),
    ('{"query": "q", "pos": ["p"], "neg": ["n"], "pos_scores": [NaN], "neg_scores": [1]}', True,
     '"pos_scores"[0] must be a finite number, got NaN'),
    ({**GOOD_KD, "neg_scores": [0.1]}, True, '"neg_scores" has 1 scores for 2 "neg" passages'),
]


@pytest.mark.parametrize(("line", "kd", "message"), BAD_LINES, ids=[m for _, _, m in BAD_LINES])
def test_a_bad_line_is_one_line_naming_file_and_line(
    tmp_path: Path, line: Any, kd: bool, message: str
) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [GOOD_KD, "", line, GOOD_KD])  # the bad one on line 3
    with pytest.raises(TrainingDataError) as caught:
        read_training_data(path, knowledge_distillation=kd, train_group_size=8)
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith(f"{path}:3: {message}")
    assert "--skip-invalid" in text

    data = read_training_data(path, knowledge_distillation=kd, train_group_size=8, skip_invalid=True)
    assert [e.origin for e in data.examples] == [f"{path}:1", f"{path}:4"]
    assert data.n_skipped == 1
    assert data.skipped[0].origin == f"{path}:3"
    assert data.skipped[0].reason.startswith(message)


def test_a_line_not_in_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b'\n{"query": "caf\xe9", "pos": ["p"], "neg": []}\n')
    with pytest.raises(TrainingDataError, match=rf"^{path}:2: not UTF-8 text; .*--skip-invalid"):
        read_training_data(path)
    assert len(read_training_data(path, skip_invalid=True)) == 1
    bom = tmp_path / "bom.jsonl"  # as Windows editors save UTF-8
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD).encode() + b"\r\n")
    assert read_training_data(bom).examples[0].query == GOOD["query"]


def test_a_broken_json_array_names_the_line_of_the_fault(tmp_path: Path) -> None:
    path = tmp_path / "train.json"
    path.write_text(f"[\n{json.dumps(GOOD)},\n{{\"query\": \"q\", \"pos\": [\"p\"]\n]\n", "utf-8")
    fault = rf"^{re.escape(str(path))}:4: not valid JSON .*one JSON array"
    with pytest.raises(TrainingDataError, match=fault):
        read_training_data(path, skip_invalid=True)
    # A .json file of JSON lines whose first line is a list is JSON lines, judged line by line.
    lines = write_jsonl(tmp_path / "lines.json", ['["a"]', GOOD])
    assert read_training_data(lines, skip_invalid=True).skipped[0].origin == f"{lines}:1"


def test_empty_negatives_pass_without_a_group_size_and_sampling_refuses_them(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [{**GOOD, "neg": []}])
    example = read_training_data(path).examples[0]  # a group of 1 needs no negative
    assert sample_group(example, 1, random.Random(0), knowledge_distillation=False).passages == ["a model"]
    with pytest.raises(TrainingDataError, match=rf'^{path}:1: "neg" is empty: a group of 2 needs negatives'):
        sample_group(example, 2, random.Random(0), knowledge_distillation=False)


def test_scores_are_ignored_without_knowledge_distillation(tmp_path: Path) -> None:
    # FlagEmbedding drops the score columns when it does not distil, so their form does not matter then.
    path = write_jsonl(tmp_path / "train.jsonl", [{**GOOD, "pos_scores": "junk", "neg_scores": [True]}])
    example = read_training_data(path).examples[0]
    assert (example.pos_scores, example.neg_scores) == (None, None)
    kd = read_training_data(write_jsonl(tmp_path / "kd.jsonl", [{**GOOD_KD, "pos_scores": [1]}]),
                            knowledge_distillation=True).examples[0]
    assert (kd.pos_scores, kd.neg_scores) == ((1.0,), (0.1, 0.2))


def test_paths_that_hold_no_training_data_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "notes.txt").write_text(json.dumps(GOOD))
    cases = {
        tmp_path / "missing.jsonl": "no such file or folder",
        folder: "the folder holds no .json or .jsonl file",
        folder / "notes.txt": "not a .json or .jsonl file",
        write_jsonl(tmp_path / "blank.jsonl", ["", "  "]): "no training example in it",
    }
    for path, message in cases.items():
        with pytest.raises(TrainingDataError, match=f"^{re.escape(str(path))}: {re.escape(message)}"):
            read_training_data(path)
    all_bad = write_jsonl(tmp_path / "bad.jsonl", ["{", "[]"])
    with pytest.raises(TrainingDataError, match=r"no training example in it \(2 invalid lines skipped\)$"):
        read_training_data(all_bad, skip_invalid=True)


def test_a_folder_reads_its_json_and_jsonl_files_in_name_order(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    write_jsonl(folder / "b.jsonl", [{**GOOD, "query": "b1"}, "", {**GOOD, "query": "b3"}])
    # A .json file may be one JSON array; each item's origin is the line it starts on.
    (folder / "a.json").write_text('[\n  {"query": "a1", "pos": ["p"], "neg": []},\n\n'
                                   '  {"query": "a2", "pos": ["p"], "neg": ["n"]}\n]\n', "utf-8")
    write_jsonl(folder / "c.json", [{**GOOD, "query": "c1"}])  # JSON lines in a .json file
    (folder / "d.txt").write_text(json.dumps({**GOOD, "query": "ignored"}))
    (folder / "sub").mkdir()
    write_jsonl(folder / "sub" / "e.jsonl", [{**GOOD, "query": "ignored too"}])  # not recursive
    data = read_training_data(folder)
    assert [(e.query, e.origin) for e in data.examples] == [
        ("a1", f"{folder}/a.json:2"), ("a2", f"{folder}/a.json:4"), ("b1", f"{folder}/b.jsonl:1"),
        ("b3", f"{folder}/b.jsonl:3"), ("c1", f"{folder}/c.json:1"),
    ]
    assert data.files == (folder / "a.json", folder / "b.jsonl", folder / "c.json")
    assert not any(e.no_in_batch_neg for e in data.examples)


def test_the_no_in_batch_neg_suffix_follows_flagembeddings_rule(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    flagged = tmp_path / "web_no_in_batch_neg"
    plain.mkdir()
    flagged.mkdir()
    # Inside a folder only the folder's name counts; a file given itself is flagged by its own name.
    write_jsonl(plain / "x_no_in_batch_neg.jsonl", [{**GOOD, "query": "in plain folder"}])
    write_jsonl(flagged / "y.jsonl", [{**GOOD, "query": "in flagged folder"}])
    file = write_jsonl(tmp_path / "z.no_in_batch_neg.jsonl", [{**GOOD, "query": "flagged file"}])
    data = read_training_data([plain, flagged, file])
    assert {e.query: e.no_in_batch_neg for e in data.examples} == {
        "in plain folder": False, "in flagged folder": True, "flagged file": True
    }


def test_reading_keeps_what_flagembeddings_datasets_reading_keeps(flag_dataset: Any, tmp_path: Path) -> None:
    records = [
        {"query": "q1", "pos": ["p1", "p2"], "neg": ["n1"], "pos_scores": [1, 0.5], "neg_scores": [0.25],
         "extra": "ignored"},
        {"query": "q2 \u2028 emoji 🤗", "pos": ["p3"], "neg": ["n2", "n3"], "pos_scores": [2],
         "neg_scores": [0.5, 0.75], "extra": "x"},
    ]
    for name in ("train.jsonl", "train.json"):
        path = write_jsonl(tmp_path / name, records)
        theirs = flag_train_dataset(flag_dataset, path, tmp_path / "cache", knowledge_distillation=True)
        ours = read_training_data(path, knowledge_distillation=True).examples
        assert [(e.query, list(e.pos), list(e.neg), list(e.pos_scores or ()), list(e.neg_scores or ()))
                for e in ours] == [(r["query"], r["pos"], r["neg"], r["pos_scores"], r["neg_scores"])
                                   for r in theirs.dataset]


# ----------------------------------------------------------------------------------------- sampling
SAMPLING_LINES = [  # several positives, too few negatives (repeated), exactly enough, more than enough
    {"query": "q0", "pos": ["p0a", "p0b", "p0c"], "neg": ["n0a"], "pos_scores": [3, 2.5, 2],
     "neg_scores": [0.5]},
    {"query": "q1", "pos": ["p1a"], "neg": ["n1a", "n1b", "n1c"], "pos_scores": [1.5],
     "neg_scores": [0.1, 0.2, 0.3]},
    {"query": "q2", "pos": ["p2a", "p2b"], "neg": [f"n2{c}" for c in "abcdefg"], "pos_scores": [1, 0],
     "neg_scores": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]},
    {"query": "q3", "pos": [LONG, LONG[::-1]], "neg": [f"n3{c}" for c in "abcdefghijkl"],
     "pos_scores": [4, 3], "neg_scores": [i / 12 for i in range(12)]},
]


@pytest.mark.parametrize(
    ("train_group_size", "kd", "extra"),
    [
        (8, True, {}),
        (8, False, {"query_instruction_for_retrieval": "Represent this: "}),
        (2, True, {"query_instruction_for_retrieval": "Q", "query_instruction_format": "<{}> {}"}),
        (1, False, {}),
        (5, True, {"shuffle_ratio": 0.7, "passage_instruction_for_retrieval": "P: "}),
    ],
)
def test_sampling_draws_what_flagembedding_draws(
    flag_dataset: Any, tmp_path: Path, train_group_size: int, kd: bool, extra: dict[str, Any]
) -> None:
    no_prompt = write_jsonl(tmp_path / "train.jsonl", SAMPLING_LINES)
    # Their prompt rule reads a "prompt" column; a file where every line has one tests it apart.
    prompted = write_jsonl(tmp_path / "prompted.jsonl", [{**r, "prompt": f"P{i}: "}
                                                         for i, r in enumerate(SAMPLING_LINES)])
    options = {"knowledge_distillation": kd, **extra}
    for path in (no_prompt, prompted):
        theirs = flag_train_dataset(flag_dataset, path, tmp_path / "cache", train_group_size=train_group_size,
                                    **options)
        ours = read_training_data(path, knowledge_distillation=kd).examples
        for seed in range(6):
            random.seed(seed)  # FlagEmbedding draws from the module's random stream, line after line
            want = [theirs[i] for i in range(len(ours))]
            rng = random.Random(seed)
            got = [sample_group(e, train_group_size, rng, **options) for e in ours]
            assert [(g.query, g.passages, g.teacher_scores) for g in got] == [tuple(w) for w in want]
    if train_group_size > 2:  # the lines with too few negatives repeated them
        assert len(set(got[0].passages[1:])) == 1 and len(got[0].passages) == train_group_size


def test_shuffle_ratio_shuffles_long_positives_sometimes(tmp_path: Path) -> None:
    example = read_training_data(write_jsonl(tmp_path / "t.jsonl", [SAMPLING_LINES[3]])).examples[0]
    firsts = {sample_group(example, 2, random.Random(s), knowledge_distillation=False,
                           shuffle_ratio=0.5).passages[0] for s in range(40)}
    assert {LONG, LONG[::-1]} < firsts  # unshuffled and shuffled positives both occur


def test_the_same_rng_state_gives_the_same_group_and_others_differ(tmp_path: Path) -> None:
    example = read_training_data(write_jsonl(tmp_path / "t.jsonl", [SAMPLING_LINES[3]])).examples[0]
    def draw(seed: int, epoch: int, index: int) -> SampledGroup:
        return sample_group(example, 8, sampling_rng(seed, epoch, index), knowledge_distillation=False)

    assert draw(1, 2, 3) == draw(1, 2, 3)
    assert len({tuple(draw(*key).passages) for key in [(1, 2, 3), (1, 2, 4), (1, 3, 3), (2, 2, 3)]}) == 4


# ------------------------------------------------------------------------------------------ batches
BATCH_TEXTS = [
    "Emoji 🤗 👍🏽 🇫🇷 and a family 👨‍👩‍👧 too",
    "敏捷的棕色狐狸跳过了懒狗。素早い茶色の狐。빠른 갈색 여우가 게으른 개를 뛰어넘는다.",
    "Combining marks: e\u0301 a\u0308 n\u0303 and ﬁ ① Ｆｕｌｌ ｗｉｄｔｈ",
    "short",
    LONG,
    "Быстрая коричневая лиса прыгает через ленивую собаку. " * 20,
]


@pytest.mark.filterwarnings("ignore:`max_length` is ignored when `padding`")  # their collator's pad call
@pytest.mark.parametrize(("query_max_len", "passage_max_len"), [(32, 128), (8, 16)])
def test_batches_equal_flagembeddings_collator(
    flag_dataset: Any, tiny_checkpoint: Path, query_max_len: int, passage_max_len: int
) -> None:
    from transformers import AutoTokenizer

    n = len(BATCH_TEXTS)
    groups = [
        SampledGroup(BATCH_TEXTS[i], [BATCH_TEXTS[(i + k) % n] for k in range(3)], [i, 0.5, -1.0])
        for i in range(n)
    ]
    ours = tokenize_batch(BGEM3Tokenizer.from_dir(tiny_checkpoint), groups,
                          query_max_len=query_max_len, passage_max_len=passage_max_len)
    collator = flag_dataset[0].AbsEmbedderCollator(
        tokenizer=AutoTokenizer.from_pretrained(str(tiny_checkpoint)), query_max_len=query_max_len,
        passage_max_len=passage_max_len, padding=True, return_tensors="pt",  # as FlagEmbedding's runner
    )
    theirs = collator([(g.query, g.passages, g.teacher_scores) for g in groups])
    for kind, ids, mask in [("queries", ours.query_input_ids, ours.query_attention_mask),
                            ("passages", ours.passage_input_ids, ours.passage_attention_mask)]:
        assert ids.dtype == mask.dtype == np.int32
        np.testing.assert_array_equal(ids, theirs[kind]["input_ids"].numpy())
        np.testing.assert_array_equal(mask, theirs[kind]["attention_mask"].numpy())
    assert ours.query_input_ids.shape[1] == query_max_len  # the long texts were truncated
    assert ours.passage_input_ids.shape[1] == passage_max_len
    assert ours.query_attention_mask.sum() < ours.query_attention_mask.size  # and the short ones padded
    assert ours.teacher_scores is not None and ours.teacher_scores.dtype == np.float32
    assert ours.teacher_scores.ravel().tolist() == theirs["teacher_scores"]
    assert (ours.batch_size, ours.group_size, ours.no_in_batch_neg) == (n, 3, False)
    real = theirs["queries"]["attention_mask"].sum() + theirs["passages"]["attention_mask"].sum()
    assert ours.tokens == int(real)


def test_a_batch_refuses_mixed_groups(tiny_checkpoint: Path) -> None:
    tokenizer = BGEM3Tokenizer.from_dir(tiny_checkpoint)
    a = SampledGroup("q", ["p", "n"], None)
    for other, message in [(SampledGroup("q", ["p"], None), "every group must hold 2 passages"),
                           (SampledGroup("q", ["p", "n"], None, True), "mixes no_in_batch_neg"),
                           (SampledGroup("q", ["p", "n"], [1.0, 0.0]), "teacher scores")]:
        with pytest.raises(ValueError, match=message):
            tokenize_batch(tokenizer, [a, other])
    assert tokenize_batch(tokenizer, [a, a]).teacher_scores is None


# -------------------------------------------------------------------------------------- epoch order
def examples(flags: list[bool]) -> TrainingData:
    made = tuple(TrainExample(f"q{i}", ("p",), ("n",), None, None, None, f"t.jsonl:{i + 1}", flag)
                 for i, flag in enumerate(flags))
    return TrainingData(made, (), ())


def test_each_epoch_is_a_seeded_shuffle_in_batches_with_the_short_one_kept() -> None:
    data = examples([False] * 23)
    first = epoch_batches(data, batch_size=4, seed=7, epoch=0)
    assert [len(b) for b in first] == [4, 4, 4, 4, 4, 3]
    assert sorted(i for b in first for i in b) == list(range(23))
    assert first != [list(range(i, min(i + 4, 23))) for i in range(0, 23, 4)]  # shuffled
    assert epoch_batches(data, 4, seed=7, epoch=0) == first  # deterministic
    assert epoch_batches(data, 4, seed=7, epoch=1) != first  # a new order each epoch
    assert epoch_batches(data, 4, seed=8, epoch=0) != first
    assert epoch_batches(data, 4, seed=1, epoch=7) != epoch_batches(data, 4, seed=7, epoch=1)


def test_a_resumed_run_sees_the_order_and_groups_of_an_unbroken_one(tmp_path: Path) -> None:
    data = read_training_data(write_jsonl(tmp_path / "t.jsonl", SAMPLING_LINES * 5))

    def run(seed: int, start: tuple[int, int] = (0, 0)) -> list[tuple[int, int, list[SampledGroup]]]:
        steps = []
        for epoch in range(start[0], 3):
            batches = epoch_batches(data, batch_size=3, seed=seed, epoch=epoch)
            for b, batch in enumerate(batches):
                if (epoch, b) >= start:
                    groups = [sample_group(data.examples[i], 4, sampling_rng(seed, epoch, i),
                                           knowledge_distillation=False) for i in batch]
                    steps.append((epoch, b, groups))
        return steps

    unbroken = run(seed=3)
    resumed = run(seed=3, start=(1, 2))  # as after a kill during epoch 1's third batch
    assert resumed == unbroken[len(unbroken) - len(resumed):]
    assert resumed[0][:2] == (1, 2) and len(resumed) == 7 + 7 - 2


def test_no_in_batch_neg_examples_never_share_a_batch_with_others() -> None:
    flags = [i % 3 == 0 for i in range(40)]  # 14 flagged, 26 not
    data = examples(flags)
    interleaved = 0
    for seed in range(10):
        batches = epoch_batches(data, batch_size=4, seed=seed, epoch=0)
        assert all(len({flags[i] for i in b}) == 1 for b in batches)  # homogeneous
        assert sorted(i for b in batches for i in b) == list(range(40))
        assert sorted(len(b) for b in batches) == [2, 2] + [4] * 9  # each kind's short batch kept
        kinds = [flags[b[0]] for b in batches]
        interleaved += kinds != sorted(kinds)  # the flagged batches are not all at the end
    assert interleaved == 10
