"""What a user sees when an optional extra is missing or an input is not there, for the core's commands:
one line with the install command or every missing input named at once, exit 1, before anything loads
(never "this is a bug")."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support import assert_clean_failure, clone_pip_install, run_module, without_modules

CLI = "bgem3_embeddings.cli"


def _no_bug(done: object) -> None:
    assert "this is a bug" not in done.stderr and "unexpected" not in done.stderr  # type: ignore[attr-defined]


def test_serve_without_the_serve_extra(tmp_path: Path, tiny_checkpoint: Path) -> None:
    """From a folder outside the clone, the hint names the clone's folder (this venv installed it with -e)
    and pip installs from that very line there; installed from a wheel, the hint names the package (issue
    58, item 4; bench-serve --soak needs the same extra)."""
    env = without_modules(tmp_path / "stubs", "fastapi")
    done = run_module(CLI, "serve", "--model", str(tiny_checkpoint), env=env, cwd=tmp_path)
    assert_clean_failure(done, 1, "needs fastapi, not installed", clone_pip_install(".", "serve"))
    pip, install, *args = shlex.split(done.stderr.split("run ", 1)[1])
    dry_run = [sys.executable, "-m", pip, install, "--dry-run", "--no-index", "--no-build-isolation", *args]
    tried = subprocess.run(dry_run, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert tried.returncode == 0 and "Would install bgem3-embeddings" in tried.stdout, tried.stderr
    # A wheel's install: its dist-info without direct_url.json, found first on the path.
    wheel = tmp_path / "stubs" / "bgem3_embeddings-0.1.0.dist-info"
    wheel.mkdir()
    (wheel / "METADATA").write_text("Metadata-Version: 2.1\nName: bgem3-embeddings\nVersion: 0.1.0\n")
    (wheel / "INSTALLER").write_text("pip\n")
    soak = run_module(CLI, "bench-serve", "--model", str(tiny_checkpoint), "--soak", "5", env=env)
    assert_clean_failure(soak, 1, 'needs fastapi, not installed: run pip install "bgem3-embeddings[serve]"')
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
