"""The tuning loop: `bgem3-qdrant tune -c NAME QUERIES --output DIR` = mine -> finetune -> reindex -> eval.

Every stage keeps its output under DIR and a marker once it is complete; a stage whose marker is there is
skipped, so a second run after a crash (or a Ctrl-C) continues where the first stopped:

    DIR/tune.json        the run's settings: a later run with other settings is refused (nothing is mixed)
    DIR/mined/           train.jsonl (FlagEmbedding's JSONL) and holdout/ (BEIR queries + qrels), by mine.py
    DIR/mined.json       marker: what mining found
    DIR/model/           the tuned checkpoint (LoRA merged by default), its training state beside it
    DIR/finetune.json    marker: steps trained (a run stopped half way resumes from its last checkpoint)
    DIR/reranker/        with a cross-encoder (`--reranker`): it tuned on the same mined data, and
    DIR/reranker.json    its marker
    DIR/reindex.json     marker: the new collection is complete (one stopped half way is resumed)
    DIR/eval.json        the base collection against the tuned one on the held-out queries, per mode
    DIR/eval.txt         the same as the table `tune` prints

The base collection is only read; the tuned vectors go into a new collection (`into`), so both stay to
compare and to switch between.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import BGEM3QdrantError

logger = logging.getLogger(__name__)

SETTINGS_FILE = "tune.json"
MINED_DIR, MINED_MARK = "mined", "mined.json"
MODEL_DIR, FINETUNE_MARK = "model", "finetune.json"
REINDEX_MARK = "reindex.json"
RERANKER_DIR, RERANKER_MARK = "reranker", "reranker.json"
EVAL_JSON, EVAL_TEXT = "eval.json", "eval.txt"
HOLDOUT_DIR = "holdout"
# What `tune` trains unless told otherwise: LoRA (a small adapter, merged into the saved checkpoint) over
# all three modes, since the loop compares every mode.
DEFAULT_FINETUNE: dict[str, Any] = {"lora_rank": 8, "unified_finetuning": True}


class TuneError(BGEM3QdrantError):
    """A tuning run that cannot go on (a conflicting DIR, a stage that stopped); what is done is kept."""


@dataclass(frozen=True)
class TuneOptions:
    """One tuning run. `finetune`: FinetuneOptions fields over DEFAULT_FINETUNE (train_data, model and
    output_dir are the loop's); `mine`: mine_collection's keyword arguments over its defaults."""

    collection: str
    queries: Path
    output: Path
    model: str
    into: str | None = None  # default: "<collection>-tuned"
    holdout: float = 0.2
    split: str = "test"  # a BEIR QUERIES folder's qrels split
    mine: dict[str, Any] = field(default_factory=dict)
    finetune: dict[str, Any] = field(default_factory=dict)
    modes: tuple[str, ...] | None = None  # eval's modes (default: all)
    # A cross-encoder to tune too (on the same mined data) and compare in eval's cross mode.
    reranker: str | None = None
    candidates: int = 200
    reindex_batch_size: int = 32
    show_progress: bool | None = None

    @property
    def new_collection(self) -> str:
        return self.into or f"{self.collection}-tuned"

    def settings(self) -> dict[str, Any]:
        """What must stay the same for a later run to continue this one (DIR/tune.json)."""
        return {
            "collection": self.collection,
            "queries": str(Path(self.queries).resolve()),
            "model": self.model,
            "into": self.new_collection,
            "holdout": self.holdout,
            "split": self.split,
            "mine": self.mine,
            "finetune": {**DEFAULT_FINETUNE, **self.finetune},
            "reranker": self.reranker,
        }


@dataclass
class StageReport:
    """One stage: `done` said what it did, `skipped` that its output was complete already."""

    stage: str
    skipped: bool
    line: str


@dataclass
class TuneReport:
    stages: list[StageReport]
    table: str  # the before/after table (EvalReport.format())
    figures: dict[str, Any]  # DIR/eval.json


StoreOpener = Callable[[], AbstractContextManager[Any]]


def run_tune(
    options: TuneOptions,
    open_store: StoreOpener,
    *,
    encoder_kwargs: dict[str, Any] | None = None,
    on_stage: Callable[[StageReport], None] | None = None,
) -> TuneReport:
    """Run (or continue) the loop as the module docstring says. `open_store()` gives the store as a context
    manager, opened only while a stage needs it (training needs none); `encoder_kwargs` go to each
    BGEM3Encoder (precision, device); `on_stage` hears each stage as it ends."""
    out = Path(options.output)
    if not 0 < options.holdout < 1:
        raise TuneError(
            f"--holdout {options.holdout}: tune compares the models on held-out queries, never trained on; "
            "give a share between 0 and 1, e.g. 0.2"
        )
    _check_settings(out, options)
    loop = _Loop(options, open_store, encoder_kwargs or {})
    stages = []
    steps = [loop.mine, loop.finetune, *([loop.finetune_reranker] if options.reranker else [])]
    for stage in (*steps, loop.reindex, loop.evaluate):
        report = stage()
        stages.append(report)
        if on_stage is not None:
            on_stage(report)
    figures = json.loads((out / EVAL_JSON).read_text(encoding="utf-8"))
    return TuneReport(stages, (out / EVAL_TEXT).read_text(encoding="utf-8"), figures)


def _check_settings(out: Path, options: TuneOptions) -> None:
    """DIR/tune.json written on the first run; a later run with other settings is refused in one line."""
    path = out / SETTINGS_FILE
    want = json.loads(json.dumps(options.settings()))  # as read back (tuples are lists)
    if path.is_file():
        have, now = _flat(json.loads(path.read_text(encoding="utf-8"))), _flat(want)
        changed = [k for k in sorted(set(have) | set(now)) if have.get(k) != now.get(k)]
        if changed:
            what = "; ".join(f"{k} {have.get(k, 'unset')} then, {now.get(k, 'unset')} now" for k in changed)
            raise TuneError(
                f"{out} (--output) holds a tune run with other settings ({what}): nothing was changed; "
                "continue it with the same options, or tune into a new --output"
            )
        return
    if out.exists() and any(out.iterdir()):
        raise TuneError(
            f"{out} (--output) holds something other than a tune run: nothing was changed; name a new or "
            "empty folder"
        )
    out.mkdir(parents=True, exist_ok=True)
    _write_json(path, want)


def _flat(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"finetune.learning_rate": 0.003, ...}: each setting by its own name."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _write_json(path: Path, data: Any) -> None:
    """Written whole or not at all (a marker half written would say a stage is done)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class _Loop:
    """The four stages over one DIR; encoders are loaded when a stage first needs one."""

    def __init__(self, options: TuneOptions, open_store: StoreOpener, encoder_kwargs: dict[str, Any]) -> None:
        self.o = options
        self.out = Path(options.output)
        self.open_store = open_store
        self.encoder_kwargs = encoder_kwargs
        self._encoders: dict[str, Any] = {}

    def encoder(self, model: str) -> Any:
        if model not in self._encoders:
            from ..encoder import load_encoder

            self._encoders[model] = load_encoder(model, **self.encoder_kwargs)
        return self._encoders[model]

    def fresh_keras(self) -> None:
        """Before a training stage: Keras' global names start over, so that a training state written in
        this process names its variables as a later run that resumes it will (restore_state compares the
        paths, and a model built before, e.g. the embedder's trainer before the reranker's, shifts them)."""
        import keras

        self._encoders.clear()
        keras.utils.clear_session()

    @property
    def tuned(self) -> str:
        return str(self.out / MODEL_DIR)

    # -- stage 1
    def mine(self) -> StageReport:
        mark = self.out / MINED_MARK
        if mark.is_file():
            return StageReport("mine", True, _mark_line(mark))
        mined = self.out / MINED_DIR
        if mined.exists():  # a mining run that stopped: it is seeded, so it starts over
            shutil.rmtree(mined)
        from .mine import mine_collection

        with self.open_store() as store:
            report = mine_collection(
                store, self.o.collection, Path(self.o.queries), mined, holdout=self.o.holdout,
                encoder=self.encoder(self.o.model), split=self.o.split, show_progress=self.o.show_progress,
                **self.o.mine,
            )  # fmt: skip
        line = report.format()
        _write_json(mark, {"line": line, "report": report.to_json()})
        return StageReport("mine", False, line)

    # -- stage 2
    def finetune(self) -> StageReport:
        mark = self.out / FINETUNE_MARK
        if mark.is_file():
            return StageReport("finetune", True, _mark_line(mark))
        from bgem3_embeddings.finetune.options import FinetuneOptions
        from bgem3_embeddings.finetune.state import STATE_DIR
        from bgem3_embeddings.finetune.trainer import run_finetune

        model_dir = self.out / MODEL_DIR
        resume = (model_dir / STATE_DIR).is_dir()  # a run that stopped after a checkpoint continues
        settings = {**DEFAULT_FINETUNE, **self.o.finetune}
        options = FinetuneOptions(
            train_data=(self.out / MINED_DIR / "train.jsonl",),
            model=self.o.model,
            output_dir=model_dir,
            resume=resume,
            overwrite_output_dir=not resume,  # ours: a folder left before the first checkpoint
            **settings,
        )
        problems = options.problems()
        if problems:
            raise TuneError("; ".join(problems))
        self.fresh_keras()
        result = run_finetune(options)
        if result.interrupted:
            raise TuneError(
                f"training stopped at step {result.steps} (saved in {model_dir}); run the same command "
                "again to continue"
            )
        loss = result.history[-1].get("loss") if result.history else None
        line = f"trained {result.steps} steps" + (f" (last loss {loss:.4f})" if loss is not None else "")
        line += f"{' (resumed)' if resume else ''}: {model_dir}"
        _write_json(mark, {"line": line, "steps": result.steps, "options": settings})
        return StageReport("finetune", False, line)

    # -- stage 2b (--reranker)
    def finetune_reranker(self) -> StageReport:
        mark = self.out / RERANKER_MARK
        if mark.is_file():
            return StageReport("finetune-reranker", True, _mark_line(mark))
        from dataclasses import fields

        from bgem3_embeddings.finetune.reranker.options import RerankerFinetuneOptions
        from bgem3_embeddings.finetune.reranker.trainer import run_reranker_finetune
        from bgem3_embeddings.finetune.state import STATE_DIR

        assert self.o.reranker is not None
        folder = self.out / RERANKER_DIR
        resume = (folder / STATE_DIR).is_dir()
        # The options both trainers share (LoRA, rate, epochs, steps, batch, group, seed, checkpoints).
        shared = {f.name for f in fields(RerankerFinetuneOptions)}
        settings = {k: v for k, v in {**DEFAULT_FINETUNE, **self.o.finetune}.items() if k in shared}
        options = RerankerFinetuneOptions(
            train_data=(self.out / MINED_DIR / "train.jsonl",),
            output_dir=folder,
            model=self.o.reranker,
            resume=resume,
            overwrite_output_dir=not resume,
            **settings,
        )
        problems = options.problems()
        if problems:
            raise TuneError("; ".join(problems))
        self.fresh_keras()
        result = run_reranker_finetune(options)
        if result.interrupted:
            raise TuneError(
                f"the reranker's training stopped at step {result.steps} (saved in {folder}); run the same "
                "command again to continue"
            )
        line = f"trained {result.steps} steps{' (resumed)' if resume else ''}: {folder}"
        _write_json(mark, {"line": line, "steps": result.steps, "options": settings})
        return StageReport("finetune-reranker", False, line)

    def reranker(self, model: str | None) -> Any:
        if model is None:
            return None
        if model not in self._encoders:
            from ..cross_encoder import load_reranker

            self._encoders[model] = load_reranker(model, show_progress=False, **self.encoder_kwargs)
        return self._encoders[model]

    # -- stage 3
    def reindex(self) -> StageReport:
        mark = self.out / REINDEX_MARK
        if mark.is_file():
            return StageReport("reindex", True, _mark_line(mark))
        from .reindex import reindex_collection

        into = self.o.new_collection
        with self.open_store() as store:
            resume = store.collection_exists(into)  # ours, stopped half way (a resume checks its source)
            summary = reindex_collection(
                store, self.o.collection, self.encoder(self.tuned), into, model_id=self.tuned, resume=resume,
                batch_size=self.o.reindex_batch_size, show_progress=self.o.show_progress,
            )  # fmt: skip
        line = summary.format()
        _write_json(mark, {"line": line, **asdict(summary)})
        return StageReport("reindex", False, line)

    # -- stage 4
    def evaluate(self) -> StageReport:
        if (self.out / EVAL_JSON).is_file() and (self.out / EVAL_TEXT).is_file():
            return StageReport("eval", True, f"figures in {self.out / EVAL_JSON}")
        from ..evaluation import EvalOptions, ModeSettings, evaluate, load_beir
        from ..evaluation.cross_mode import CROSS_MODE
        from ..evaluation.modes import EVAL_MODES

        data = load_beir(self.out / MINED_DIR / HOLDOUT_DIR, "test")
        every = (*EVAL_MODES, CROSS_MODE) if self.o.reranker else EVAL_MODES
        options = EvalOptions(
            modes=self.o.modes or every,
            settings=ModeSettings(candidates=self.o.candidates),
            show_progress=self.o.show_progress,
            reranker=self.reranker(self.o.reranker),
        )
        # The tuned collection's cross mode orders its hits by the tuned cross-encoder.
        tuned_reranker = str(self.out / RERANKER_DIR) if self.o.reranker else None
        with self.open_store() as store:
            # Each collection is searched with the model that wrote it (queries encoded by it), then the
            # two are compared query by query as `eval -c A -c B` does.
            before = evaluate(
                store, [self.o.collection], self.encoder(self.o.model), data, options=options,
                model_id=self.o.model,
            )  # fmt: skip
            after = evaluate(
                store, [self.o.new_collection], self.encoder(self.tuned), data,
                options=replace(options, reranker=self.reranker(tuned_reranker)), model_id=self.tuned,
            )  # fmt: skip
        report = replace(
            before,
            model=f"{self.o.model} ({self.o.collection}) and {self.tuned} ({self.o.new_collection})",
            collections=[*before.collections, *after.collections],
            encode_seconds=before.encode_seconds + after.encode_seconds,
            warnings=[*before.warnings, *after.warnings],
        )
        _write_json(self.out / EVAL_JSON, report.to_json())
        (self.out / EVAL_TEXT).write_text(report.format() + "\n", encoding="utf-8")
        return StageReport("eval", False, f"figures in {self.out / EVAL_JSON}")


def _mark_line(mark: Path) -> str:
    return str(json.loads(mark.read_text(encoding="utf-8")).get("line", "done"))


def ndcg_by_mode(figures: dict[str, Any]) -> Iterator[tuple[str, float, float]]:
    """(mode, nDCG@10 before, after) from DIR/eval.json."""
    after = next(iter(figures["compare"].values()))
    for mode, r in figures["modes"].items():
        yield mode, float(r["ndcg@10"]), float(after["modes"][mode]["ndcg@10"])
