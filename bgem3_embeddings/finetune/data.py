"""FlagEmbedding's training data: reading it, sampling each query's group of passages, the epoch order.

A training file holds one JSON object per line (FlagEmbedding's format):

    {"query": str, "pos": [str, ...], "neg": [str, ...], "pos_scores": [float]?, "neg_scores": [float]?,
     "prompt": str?}

    data = read_training_data("train.jsonl", train_group_size=8)
    for batch in epoch_batches(data, batch_size=16, seed=42, epoch=0):
        groups = [sample_group(data.examples[i], 8, sampling_rng(42, 0, i), knowledge_distillation=False)
                  for i in batch]

What follows FlagEmbedding 1.4.2 (`abc/finetune/embedder/AbsDataset.py`) exactly: which files a path names,
the `no_in_batch_neg` name suffix, and `AbsEmbedderTrainDataset.__getitem__`'s sampling (one positive, the
negatives with repetition when a line has too few, the teacher scores, the query instruction and
`shuffle_ratio`), draw for draw from the same `random` stream. What differs, on purpose:
- Bad lines are refused up front with one line naming file:line (FlagEmbedding fails mid-training with an
  AssertionError, a ZeroDivisionError for a line without negatives, or trains on "None" as a prompt), or
  skipped and counted with `skip_invalid`.
- No `datasets` package: lines are parsed with `json`. Both .json and .jsonl hold JSON lines (datasets'
  json loader reads both so); a .json file may also hold one JSON array of objects.
- The epoch order (`epoch_batches`) is our own seeded shuffle, resumable at any batch; FlagEmbedding's
  default shuffles with the Trainer's sampler and honours `no_in_batch_neg` only with
  `--same_dataset_within_batch`, where it also drops each dataset's last short batch. We always keep the
  flag's batches apart and keep the last short batch.
- Not implemented: `max_example_num_per_dataset` (FlagEmbedding's default, 10**8, never cuts), the
  same-dataset mode's per-file `type` / `batch_size` / `train_group_size` columns (ignored like any other
  extra key), `small_threshold` / `drop_threshold`.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

NO_IN_BATCH_NEG_SUFFIX = "no_in_batch_neg"  # FlagEmbedding: a file stem or folder name ending so
TRAINING_FILE_SUFFIXES = (".json", ".jsonl")  # the only files FlagEmbedding reads
SKIP_HINT = "fix the line, or pass --skip-invalid to skip such lines"
FORMAT_HINT = 'training data is JSON lines, one {"query", "pos", "neg"} object a line'


class TrainingDataError(ValueError):
    """Training data that cannot be used; the message is one line naming the file (and line) and the fix."""


@dataclass(frozen=True)
class TrainExample:
    """One training line: a query, its positive and negative passages, optional teacher scores and prompt.

    `pos_scores` / `neg_scores` are read only with knowledge distillation (None otherwise, as FlagEmbedding
    drops those columns); `origin` is "path/to/file.jsonl:LINE"; `no_in_batch_neg`: the line's file or
    folder name ends with "no_in_batch_neg", so its queries are scored only against their own group.
    """

    query: str
    pos: tuple[str, ...]
    neg: tuple[str, ...]
    pos_scores: tuple[float, ...] | None
    neg_scores: tuple[float, ...] | None
    prompt: str | None
    origin: str
    no_in_batch_neg: bool = False


@dataclass(frozen=True)
class SkippedLine:
    """A line `read_training_data(..., skip_invalid=True)` left out: where, and why."""

    origin: str
    reason: str


@dataclass(frozen=True)
class TrainingData:
    """The examples read from a file or folder, in file then line order, and the lines skipped."""

    examples: tuple[TrainExample, ...]
    skipped: tuple[SkippedLine, ...]
    files: tuple[Path, ...]

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def n_skipped(self) -> int:
        return len(self.skipped)


@dataclass(frozen=True)
class SampledGroup:
    """A query (instruction applied) and its passages: the sampled positive first, then train_group_size - 1
    negatives; `teacher_scores` the matching scores with knowledge distillation, else None."""

    query: str
    passages: list[str]
    teacher_scores: list[float] | None
    no_in_batch_neg: bool = False


class _LineError(Exception):
    """A line that breaks the format; read_training_data names its file:line or skips it."""


# ------------------------------------------------------------------------------------------ reading
def _is_training_file(path: Path) -> bool:
    return path.name.endswith(TRAINING_FILE_SUFFIXES)


def _training_files(path: Path) -> list[tuple[Path, bool]]:
    """The files `path` names, each with its no_in_batch_neg flag, by FlagEmbedding's rules: a file is
    flagged by its own name (before the extension), a folder's .json/.jsonl files (not its subfolders) by
    the folder's name. Folder entries are sorted so every run reads them in the same order."""
    if path.is_dir():
        flag = path.name.endswith(NO_IN_BATCH_NEG_SUFFIX)
        files = sorted(p for p in path.iterdir() if p.is_file() and _is_training_file(p))
        if not files:
            raise TrainingDataError(f"{path}: the folder holds no .json or .jsonl file ({FORMAT_HINT})")
        return [(f, flag) for f in files]
    if not path.exists():
        raise TrainingDataError(f"{path}: no such file or folder")
    if not _is_training_file(path):
        raise TrainingDataError(f"{path}: not a .json or .jsonl file ({FORMAT_HINT})")
    return [(path, path.name.rsplit(".", 1)[0].endswith(NO_IN_BATCH_NEG_SUFFIX))]


def _json_array_items(path: Path, text: str) -> Iterator[tuple[int, Any]] | None:
    """(line, item) of a file that is one JSON array, or None when it is not one (then JSON lines)."""
    if not text.lstrip().startswith("["):
        return None
    try:
        items = json.loads(text)
    except json.JSONDecodeError as err:
        first = text.lstrip().split("\n", 1)[0]
        try:
            json.loads(first)
        except ValueError:
            # An array spread over lines that is broken somewhere: no line can be skipped on its own.
            raise TrainingDataError(
                f"{path}:{err.lineno}: not valid JSON ({err.msg}); the file is one JSON array, so fix it "
                "(--skip-invalid skips lines of JSON-lines files only)"
            ) from None
        return None  # JSON lines whose first line is a list: reported line by line
    if not isinstance(items, list):
        return None
    return _array_lines(text, len(items))


def _array_lines(text: str, count: int) -> Iterator[tuple[int, Any]]:
    # The text is a valid array (json.loads said so): walk it again to learn each item's line number.
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    line, counted_to = 1, 0
    for _ in range(count):
        while text[pos] in " \t\r\n,":
            pos += 1
        line += text.count("\n", counted_to, pos)
        counted_to = pos
        item, pos = decoder.raw_decode(text, pos)
        yield line, item


def _file_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON or an _LineError) for each non-blank item of a training file."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise TrainingDataError(f"{path}: cannot read it ({err.strerror or err})") from err
    raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte order mark, as Windows editors write
    if path.suffix == ".json":
        try:
            array = _json_array_items(path, raw.decode("utf-8"))
        except UnicodeDecodeError:
            array = None  # not UTF-8 as a whole: the line-by-line pass says which line
        if array is not None:
            yield from array
            return
    # Split on b"\n" only: a JSON string may hold U+2028 and other characters str.splitlines breaks on.
    for number, line_bytes in enumerate(raw.split(b"\n"), start=1):
        if not line_bytes.strip():
            continue  # blank lines, as datasets' json loader skips them
        try:
            yield number, json.loads(line_bytes.decode("utf-8"))
        except UnicodeDecodeError:
            yield number, _LineError("not UTF-8 text")
        except ValueError as err:
            yield number, _LineError(f"not valid JSON ({err})")


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _passages(record: dict[str, Any], key: str, required_hint: str) -> tuple[str, ...]:
    if key not in record:
        raise _LineError(f'no "{key}" ({required_hint})')
    value = record[key]
    if not isinstance(value, list):
        raise _LineError(f'"{key}" must be a list of strings, got {_type_name(value)}')
    for i, text in enumerate(value):
        if not isinstance(text, str):
            raise _LineError(f'"{key}"[{i}] must be a string, got {_type_name(text)}')
        if not text.strip():
            raise _LineError(f'"{key}"[{i}] is an empty passage')
    return tuple(value)


def _scores(record: dict[str, Any], key: str, passages: tuple[str, ...], of: str) -> tuple[float, ...]:
    if key not in record:
        raise _LineError(f'no "{key}" (knowledge distillation needs a teacher score per "{of}" passage)')
    value = record[key]
    if not isinstance(value, list):
        raise _LineError(f'"{key}" must be a list of numbers, got {_type_name(value)}')
    for i, score in enumerate(value):
        # bool is an int to Python, never a score; NaN or infinity would make the loss NaN.
        if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
            raise _LineError(f'"{key}"[{i}] must be a finite number, got {json.dumps(score)}')
    if len(value) != len(passages):
        raise _LineError(f'"{key}" has {len(value)} scores for {len(passages)} "{of}" passages')
    return tuple(float(s) for s in value)


def _example(
    record: Any,
    origin: str,
    flag: bool,
    knowledge_distillation: bool,
    train_group_size: int | None,
    prompt_key: str = "prompt",
) -> TrainExample:
    """The TrainExample of one parsed line, or _LineError saying what is wrong with it."""
    if isinstance(record, _LineError):
        raise record
    if not isinstance(record, dict):
        raise _LineError(f"not a JSON object (got {_type_name(record)})")
    if "query" not in record:
        raise _LineError('no "query"')
    query = record["query"]
    if not isinstance(query, str):
        raise _LineError(f'"query" must be a string, got {_type_name(query)}')
    if not query.strip():
        raise _LineError('"query" is empty')
    pos = _passages(record, "pos", "a list of positive passages")
    if not pos:
        raise _LineError('"pos" is empty: a line needs at least one positive passage')
    neg = _passages(record, "neg", "a list of negative passages, [] for none")
    if not neg and train_group_size is not None and train_group_size > 1:
        raise _LineError(f'"neg" is empty: a group of {train_group_size} needs negatives '
                           "(or --train-group-size 1)")
    pos_scores = neg_scores = None
    if knowledge_distillation:
        pos_scores = _scores(record, "pos_scores", pos, "pos")
        neg_scores = _scores(record, "neg_scores", neg, "neg")
    prompt = record.get(prompt_key)
    if prompt is not None and not isinstance(prompt, str):
        raise _LineError(f'"{prompt_key}" must be a string, got {_type_name(prompt)}')
    return TrainExample(query, pos, neg, pos_scores, neg_scores, prompt, origin, flag)


def read_training_data(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    knowledge_distillation: bool = False,
    skip_invalid: bool = False,
    train_group_size: int | None = None,
    prompt_key: str = "prompt",
) -> TrainingData:
    """Read FlagEmbedding training data from a .json/.jsonl file, a folder of them, or several such paths.

    Every line is checked: a JSON object with a non-empty string "query", a non-empty list "pos" and a list
    "neg" of non-empty strings (with `train_group_size` > 1, "neg" must not be empty either: the group needs
    negatives), an optional string "prompt", and with `knowledge_distillation` "pos_scores" / "neg_scores"
    of finite numbers, one per passage. The line's own query instruction is read from `prompt_key` ("prompt"
    for the embedder, "query_prompt" for the reranker, as FlagEmbedding reads them). A bad line raises
    TrainingDataError naming file:line, or with
    `skip_invalid` is left out and recorded in `.skipped`. No example at all is an error too.

    Example: `read_training_data("data/", train_group_size=8).examples[0].origin` -> "data/a.jsonl:1".
    """
    paths = [path] if isinstance(path, str | os.PathLike) else list(path)
    if not paths:
        raise TrainingDataError("no training data path given")
    files = [entry for p in paths for entry in _training_files(Path(p))]
    examples: list[TrainExample] = []
    skipped: list[SkippedLine] = []
    for file, flag in files:
        for number, record in _file_lines(file):
            origin = f"{file}:{number}"
            try:
                examples.append(
                    _example(record, origin, flag, knowledge_distillation, train_group_size, prompt_key)
                )
            except _LineError as err:
                if not skip_invalid:
                    raise TrainingDataError(f"{origin}: {err}; {SKIP_HINT}") from None
                skipped.append(SkippedLine(origin, str(err)))
    if not examples:
        where = ", ".join(str(p) for p in paths)
        why = f" ({len(skipped)} invalid lines skipped)" if skipped else ""
        raise TrainingDataError(f"{where}: no training example in it{why}")
    return TrainingData(tuple(examples), tuple(skipped), tuple(f for f, _ in files))


# ----------------------------------------------------------------------------------------- sampling
def _shuffle_text(text: str, shuffle_ratio: float, rng: random.Random) -> str:
    """FlagEmbedding's `_shuffle_text`: with probability shuffle_ratio, a text over 100 characters is cut
    in three and put back in random order, joined by spaces. Draws nothing when shuffle_ratio is 0."""
    if shuffle_ratio > 0 and len(text) > 100 and rng.random() < shuffle_ratio:
        chunk = len(text) // 3 + 1
        pieces = [text[i : i + chunk] for i in range(0, len(text), chunk)]
        rng.shuffle(pieces)
        return " ".join(pieces)
    return text


def sample_group(
    example: TrainExample,
    train_group_size: int,
    rng: random.Random,
    *,
    knowledge_distillation: bool,
    query_instruction_for_retrieval: str | None = None,
    query_instruction_format: str = "{}{}",
    passage_instruction_for_retrieval: str | None = None,
    passage_instruction_format: str = "{}{}",
    shuffle_ratio: float = 0.0,
) -> SampledGroup:
    """One positive and train_group_size - 1 negatives, as FlagEmbedding's `__getitem__` samples them.

    The positive is `rng.choice` of the positives' indices; the negatives `rng.sample` of theirs, repeated
    ceil((n - 1) / len(neg)) times first when a line has fewer than n - 1. The draws are the same calls in
    the same order as FlagEmbedding's on the module `random`, so `random.Random(s)` here gives what
    `random.seed(s)` gives there. The query becomes `query_instruction_format.format(prompt or
    instruction, query)` only when an instruction is set (a line's "prompt" is ignored otherwise, as there).
    `shuffle_ratio` (default 0, FlagEmbedding's too) shuffles pieces of the positive only, as there.

    Example: `sample_group(ex, 2, random.Random(0), knowledge_distillation=False).passages` -> [pos, neg].
    """
    if train_group_size < 1:
        raise ValueError(f"train_group_size must be >= 1, got {train_group_size}")
    query = example.query
    if query_instruction_for_retrieval is not None:
        instruction = example.prompt if example.prompt is not None else query_instruction_for_retrieval
        query = query_instruction_format.format(instruction, query)
    pos_idx = rng.choice(list(range(len(example.pos))))
    passages = [_shuffle_text(example.pos[pos_idx], shuffle_ratio, rng)]
    wanted = train_group_size - 1
    neg_all = list(range(len(example.neg)))
    if len(example.neg) < wanted:
        if not example.neg:
            raise TrainingDataError(f'{example.origin}: "neg" is empty: a group of {train_group_size} '
                                    "needs negatives (or --train-group-size 1)")
        neg_idxs = rng.sample(neg_all * math.ceil(wanted / len(example.neg)), wanted)
    else:
        neg_idxs = rng.sample(neg_all, wanted)
    passages += [example.neg[i] for i in neg_idxs]
    teacher_scores = None
    if knowledge_distillation:
        if example.pos_scores is None or example.neg_scores is None:
            raise TrainingDataError(f"{example.origin}: no teacher scores (read the data with "
                                    "knowledge_distillation=True)")
        teacher_scores = [example.pos_scores[pos_idx], *(example.neg_scores[i] for i in neg_idxs)]
    if passage_instruction_for_retrieval is not None:
        passages = [passage_instruction_format.format(passage_instruction_for_retrieval, p) for p in passages]
    return SampledGroup(query, passages, teacher_scores, example.no_in_batch_neg)


def sampling_rng(seed: int, epoch: int, index: int) -> random.Random:
    """The random stream for example `index` in `epoch`: a function of the three alone, so a run resumed
    at any batch samples what an unbroken run samples (a string seed is hashed with SHA-512 by `random`,
    the same in every process, unlike hash())."""
    return random.Random(f"bgem3-finetune:{seed}:{epoch}:{index}")


# ------------------------------------------------------------------------------------ epoch order
def epoch_batches(
    data: TrainingData | Sequence[TrainExample], batch_size: int, seed: int, epoch: int
) -> list[list[int]]:
    """Example indices of each batch of `epoch`, a function of (seed, epoch) alone, so a run resumed at
    (epoch, batch i) reads `epoch_batches(...)[i:]` exactly as the unbroken run would.

    The indices are shuffled by numpy's default_rng((seed, epoch)); examples flagged `no_in_batch_neg` and
    the others are cut into batches separately (a batch never mixes them, as FlagEmbedding's same-dataset
    batches), each kind's last batch kept even when short, and when both kinds exist the batches are
    shuffled together.

    Example: `epoch_batches(data_of_5, batch_size=2, seed=0, epoch=0)` -> e.g. [[3, 0], [4, 1], [2]].
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if seed < 0 or epoch < 0:
        raise ValueError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
    examples = data.examples if isinstance(data, TrainingData) else data
    rng = np.random.default_rng((seed, epoch))
    order = rng.permutation(len(examples)).tolist()
    kinds = [[i for i in order if examples[i].no_in_batch_neg == flag] for flag in (False, True)]
    batches = [kind[i : i + batch_size] for kind in kinds for i in range(0, len(kind), batch_size)]
    if all(kinds):  # both kinds: interleave their batches, else the flagged ones would all come last
        batches = [batches[i] for i in rng.permutation(len(batches)).tolist()]
    return batches
