"""`--help` of every command of both CLIs at 80 columns: every option name and environment variable whole
(Typer's Rich panels cut them: `--no-colbert-on-d…`, `BGEM3_QDRANT_COLL…`), no `<bool>` on flags, usage
lines that name arguments as PATHS... (not `{paths}...`). The commands are read from the apps, so a command
registered later is checked too."""

from __future__ import annotations

import importlib
import re
from typing import Any

import pytest
import typer

from bgem3_embeddings.cli_support import run_cli
from tests.optional import require_module
from tests.support import run_module

CLIS = {
    "bgem3": ("bgem3_embeddings.cli", "bgem3_embeddings.cli"),
    "bgem3-qdrant": ("bgem3_qdrant.cli", "bgem3_qdrant"),
}


def _app(cli: str) -> typer.Typer:
    module = CLIS[cli][0]
    if cli == "bgem3-qdrant":
        require_module("bgem3_qdrant")
    app: typer.Typer = importlib.import_module(module).app
    return app


def _commands(cli: str) -> list[tuple[str, Any]]:
    group = typer.main.get_command(_app(cli))
    return sorted(getattr(group, "commands", {}).items())


def _whole(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


def _help(cli: str, command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        run_cli(_app(cli), argv=[command, "--help"], prog_name=cli)
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("cli", sorted(CLIS))
def test_every_option_and_variable_whole_at_80_columns(
    cli: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    commands = _commands(cli)
    assert len(commands) >= 6, commands  # the apps were read
    for name, command in commands:
        out = _help(cli, name, capsys)
        assert "…" not in out, f"{cli} {name}: cut at 80 columns\n{out}"
        assert "<bool>" not in out, f"{cli} {name}\n{out}"
        assert max(len(line) for line in out.splitlines()) <= 80, f"{cli} {name}\n{out}"
        usage = out.splitlines()[0]
        assert usage.startswith(f"Usage: {cli} {name} ") and "{" not in usage, usage
        for param in command.params:
            if param.param_type_name == "argument":
                assert _whole(str(param.name).upper(), usage), usage
                continue
            for opt in (*param.opts, *param.secondary_opts):
                assert _whole(opt, out), f"{cli} {name}: {opt} not whole\n{out}"
            envvars = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
            for var in envvars:
                assert _whole(var, out), f"{cli} {name}: {var} not whole\n{out}"


@pytest.mark.parametrize("cli", sorted(CLIS))
def test_help_as_a_user_runs_it(cli: str) -> None:
    if cli == "bgem3-qdrant":
        require_module("bgem3_qdrant")
    command = "ingest" if cli == "bgem3-qdrant" else "encode"
    done = run_module(CLIS[cli][1], command, "--help", env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    usage = done.stdout.splitlines()[0]
    assert usage.endswith("[OPTIONS] PATHS..." if cli == "bgem3-qdrant" else "[OPTIONS] [TEXTS...]"), usage
    if cli == "bgem3-qdrant":
        for name in (
            "--colbert-on-disk / --no-colbert-on-disk",
            "BGEM3_QDRANT_COLLECTION",
            "BGEM3_ENCODER_API_KEY",
        ):
            assert name in done.stdout, done.stdout


def test_bgem3_help_names_debug() -> None:
    """`bgem3 --help` as a user runs it names --debug (run_cli takes it anywhere on the line)."""
    done = run_module("bgem3_embeddings.cli", "--help", env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    assert "--debug" in done.stdout and "BGEM3_DEBUG=1" in done.stdout, done.stdout
