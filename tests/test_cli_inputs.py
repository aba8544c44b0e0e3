"""What a user sees when an optional extra is missing or an input is not there, for the core's commands:
one line with the install command or every missing input named at once, exit 1, before anything loads
(never "this is a bug")."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support import assert_clean_failure, run_module, without_modules

CLI = "bgem3_embeddings.cli"


def _no_bug(done: object) -> None:
    assert "this is a bug" not in done.stderr and "unexpected" not in done.stderr  # type: ignore[attr-defined]


def test_serve_without_the_serve_extra(tmp_path: Path, tiny_checkpoint: Path) -> None:
    env = without_modules(tmp_path / "stubs", "fastapi")
    done = run_module(CLI, "serve", "--model", str(tiny_checkpoint), env=env)
    assert_clean_failure(done, 1, "needs fastapi, not installed", 'pip install "bgem3-embeddings[serve]"')
    soak = run_module(CLI, "bench-serve", "--model", str(tiny_checkpoint), "--soak", "5", env=env)
    assert_clean_failure(soak, 1, "needs fastapi, not installed", 'pip install "bgem3-embeddings[serve]"')
    _no_bug(soak)


def test_bench_without_the_bench_extra(tmp_path: Path, tiny_checkpoint: Path) -> None:
    env = without_modules(tmp_path / "stubs", "onnxruntime")
    done = run_module(CLI, "bench", "--engine", "onnxruntime", "--model", str(tiny_checkpoint), env=env)
    assert_clean_failure(done, 1, "needs onnxruntime, not installed", 'pip install "bgem3-embeddings[bench]"')


def test_serve_with_a_missing_checkpoint_stops_before_tensorflow(tmp_path: Path) -> None:
    # TensorFlow stubbed out: the check must answer without importing it.
    env = without_modules(tmp_path / "stubs", "tensorflow")
    done = run_module(CLI, "serve", "--model", str(tmp_path / "missing"), env=env)
    assert_clean_failure(done, 1, "missing does not exist (--model)", "nothing was loaded")


def test_encode_names_every_missing_input_at_once(tmp_path: Path, tiny_checkpoint: Path) -> None:
    broken = Path(shutil.copytree(tiny_checkpoint, tmp_path / "ckpt"))
    (broken / "config.json").unlink()
    done = run_module(CLI, "encode", "--file", str(tmp_path / "texts.txt"), "--model", str(broken))
    phrases = ("no such file or directory:", "texts.txt (--file)", "missing config.json (--model)")
    assert_clean_failure(done, 1, *phrases)
