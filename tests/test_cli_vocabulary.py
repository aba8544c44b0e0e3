"""One vocabulary for both CLIs (issue 58, item 11): every `--device` and `--precision` of `bgem3` and
`bgem3-qdrant` reads the same (bgem3_embeddings/cli_options.py), `bgem3 --help` names `bgem3-qdrant`, and
each `bench` says what it measures and names the other. The commands are read from the apps, so a command
registered later is held to it too."""

from __future__ import annotations

import re

import pytest
import typer

from bgem3_embeddings.cli_options import DEVICE_HELP, PRECISION_HELP
from bgem3_embeddings.cli_support import run_cli
from bgem3_embeddings.devices import DEVICE_KINDS, PRECISIONS
from tests.test_cli_help import CLIS, _app

SHARED = {"--device": DEVICE_HELP, "--precision": PRECISION_HELP}
# Options that share a name but not a meaning, each with why; any other must read as SHARED says.
OWN_MEANING = {
    ("bgem3", "bench", "--precision"): "repeatable, WEIGHTS:COMPUTE pairs, one row each",
    ("bgem3", "bench", "--device"): "the Keras engines only (the other engines run on the CPU), default cpu",
    ("bgem3", "export", "--precision"): "the dtype the SavedModel stores: no auto, no int8 (--quantize)",
    ("bgem3", "finetune", "--precision"): "training's mixed precision: float32 or bfloat16",
}


def _rendered_help(cli: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The help a user sees (run_cli's layout), with its line breaks folded to single spaces."""
    with pytest.raises(SystemExit) as done:
        run_cli(_app(cli), argv=[*argv, "--help"], prog_name=cli)
    assert done.value.code == 0
    return re.sub(r"\s+", " ", capsys.readouterr().out)


def test_shared_help_names_every_value_the_parser_takes() -> None:
    for kind in DEVICE_KINDS:
        assert re.search(rf"\b{kind}\b", DEVICE_HELP), kind
    assert "/GPU:N" in DEVICE_HELP
    for precision in PRECISIONS:
        assert re.search(rf"\b{precision}\b", PRECISION_HELP), precision


def test_device_and_precision_read_the_same_in_every_command() -> None:
    seen: dict[tuple[str, str, str], str] = {}
    for cli in sorted(CLIS):
        group = typer.main.get_command(_app(cli))
        for name, command in getattr(group, "commands", {}).items():
            for param in command.params:
                for opt in set(param.opts) & set(SHARED):
                    seen[(cli, name, opt)] = param.help or ""
    # both CLIs were read: the model-loading commands of each
    for key in [("bgem3", "encode", "--device"), ("bgem3", "rerank", "--precision"),
                ("bgem3-qdrant", "search", "--device"), ("bgem3-qdrant", "ingest", "--precision")]:
        assert key in seen, sorted(seen)
    different = {key: help_ for key, help_ in seen.items() if help_ != SHARED[key[2]]}
    unexplained = {key: help_ for key, help_ in different.items() if key not in OWN_MEANING}
    assert not unexplained, f"use bgem3_embeddings.cli_options' DeviceOpt/PrecisionOpt: {unexplained}"
    # an option listed as its own that now reads as the shared one leaves the list
    assert set(different) == set(OWN_MEANING), set(OWN_MEANING) - set(different)


def test_bgem3_help_names_bgem3_qdrant(capsys: pytest.CaptureFixture[str]) -> None:
    assert "`bgem3-qdrant`" in _rendered_help("bgem3", [], capsys)


def test_each_bench_says_what_it_measures_and_names_the_other(capsys: pytest.CaptureFixture[str]) -> None:
    ours = _rendered_help("bgem3", ["bench"], capsys)
    theirs = _rendered_help("bgem3-qdrant", ["bench"], capsys)
    assert "Throughput, memory and start-up" in ours and "`bgem3-qdrant bench`" in ours, ours
    assert "encoder-only vs end-to-end" in theirs and "`bgem3 bench`" in theirs, theirs


def test_search_mode_help_in_plain_words(capsys: pytest.CaptureFixture[str]) -> None:
    from bgem3_qdrant.stores.base import MODES

    out = _rendered_help("bgem3-qdrant", ["search"], capsys)
    mode_help = out[out.index("--mode") :]
    for mode in MODES:
        assert mode in mode_help
    assert "`bgem3-qdrant eval` also has colbert and all" in mode_help, mode_help
    assert "eval's colbert" not in out
