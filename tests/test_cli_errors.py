"""What a person sees when a `bgem3` command fails as expected: one or two lines, no traceback, no TF noise.

The commands run in fresh processes, as a user runs them, so TensorFlow's C++ start-up logging (which
goes straight to file descriptor 2) would show up in stderr if it were not silenced.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer

from bgem3_embeddings.cli_support import CommandError, run_cli
from tests.support import assert_clean_failure, user_env


def run_bgem3(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bgem3_embeddings.cli", *args],
        capture_output=True,
        text=True,
        env=user_env(env),
        timeout=300,
    )


def test_folder_that_is_no_checkpoint(tmp_path: Path) -> None:
    done = run_bgem3("encode", "hello", "--model", str(tmp_path))
    assert_clean_failure(done, 1, "is not a BGE-M3 checkpoint", "missing config.json")


def test_missing_folder(tmp_path: Path) -> None:
    done = run_bgem3("encode", "hello", "--model", str(tmp_path / "nope"))
    assert_clean_failure(done, 1, "does not exist")


def test_hub_id_offline_says_downloads_are_off(tmp_path: Path) -> None:
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    done = run_bgem3("encode", "hello", "--model", "BAAI/bge-m3", env=env)
    assert_clean_failure(done, 1, "not in the Hugging Face cache", "HF_HUB_OFFLINE=1")


def test_hub_unreachable_is_not_called_offline_mode(tmp_path: Path) -> None:
    # A closed port on loopback: the hub cannot be reached, and downloading is not switched off.
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}
    done = run_bgem3("encode", "hello", "--model", "BAAI/bge-m3", env=env)
    assert_clean_failure(done, 1, "cannot reach the Hugging Face hub")
    assert "downloads are off" not in done.stderr


def test_bad_option_value(tiny_checkpoint: Path) -> None:
    done = run_bgem3("encode", "hello", "--model", str(tiny_checkpoint), "--precision", "fp8")
    assert_clean_failure(done, 2, "fp8", "bgem3 encode --help")


def test_unreadable_input_file(tmp_path: Path) -> None:
    done = run_bgem3("encode", "--file", str(tmp_path / "missing.txt"), "--model", str(tmp_path))
    # both named at once, before anything loads (the folder is no checkpoint either)
    assert_clean_failure(done, 1, "missing.txt (--file)", "is not a BGE-M3 checkpoint")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    done = run_bgem3("encode", "hello", "--model", str(tmp_path), "--debug")
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "is not a BGE-M3 checkpoint" in done.stderr


# --- run_cli itself, in-process (no TensorFlow start) -------------------------------------------------
demo = typer.Typer()


@demo.command()
def fail(kind: str) -> None:
    if kind == "expected":
        raise CommandError("the store is in use by another process: close it and run again")
    if kind == "bug":
        raise KeyError("oops")
    raise typer.Exit(code=3)


def run_demo(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        run_cli(demo, argv=list(args), start_tensorflow=False)
    return int(exit_info.value.code or 0), capsys.readouterr().err


def test_expected_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_demo(capsys, "expected")
    assert code == 1
    assert err == "error: the store is in use by another process: close it and run again\n"


def test_unexpected_error_names_itself_and_points_at_debug(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_demo(capsys, "bug")
    assert code == 1
    assert err.splitlines() == [
        "error: unexpected KeyError: 'oops'",
        "  this is a bug; run again with --debug for the traceback",
    ]


def test_exit_codes_pass_through(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_demo(capsys, "other")[0] == 3


def test_unexpected_error_with_debug_raises(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(KeyError):
        run_cli(demo, argv=["bug", "--debug"], start_tensorflow=False)
