"""`make demo` as a newcomer runs it: quiet (no setuptools "Editable installation" blocks, no TensorFlow
lines), the serve extra installed for the README's next step, and the three commands to run next."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _make(*args: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    done = subprocess.run(["make", "-s", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_setup_installs_the_serve_extra_without_editable_warnings(tmp_path: Path) -> None:
    # -n: the commands `make setup` would run in a fresh venv, without running them
    recipe = _make("-n", "-B", f"VENV={tmp_path / 'venv'}", f"{tmp_path / 'venv'}/.setup-done")
    assert '-e ".[serve]"' in recipe, recipe
    shown = _make("--eval", "show-warnings: ; @echo $$PYTHONWARNINGS", "show-warnings")
    assert shown.strip() == "ignore:Editable installation"


def test_demo_is_quiet_and_ends_with_the_next_commands(tmp_path: Path, tiny_checkpoint: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "PY": sys.executable,
        "BGEM3_MODEL": str(tiny_checkpoint),
        "QDRANT_PATH": str(tmp_path / "store"),
        "HOME": str(tmp_path),
        "BGEM3_WEIGHTS_CACHE": "off",
    }
    done = subprocess.run(
        ["bash", "examples/run_demo.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "", done.stderr  # no TensorFlow start-up lines, no warnings
    tail = done.stdout.rstrip().splitlines()[-5:]
    assert tail[0] == "== next, run these yourself from this folder:"
    assert tail[1].strip() == ". .venv/bin/activate"
    assert tail[2].strip().startswith("bgem3-qdrant search ") and f"--model {tiny_checkpoint}" in tail[2]
    assert f"--path {tmp_path / 'store'}" in tail[2] and "-c bgem3-demo" in tail[2]
    assert tail[3].strip().startswith(f"bgem3 serve --model {tiny_checkpoint}")
    assert tail[4].strip().startswith("bgem3-qdrant search ") and "-c bgem3-demo" in tail[4]
    _run_the_hints(tail[2:], tmp_path)


def _run_the_hints(hints: list[str], tmp_path: Path) -> None:
    """The printed commands, as a user pastes them after `. .venv/bin/activate`: the search, then the server
    (on a free port instead of 8000, which may be taken here) and the search through it."""
    bin_dir = Path(sys.executable).parent
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "BGEM3_WEIGHTS_CACHE": "off"}

    def command(line: str) -> list[str]:
        return shlex.split(line.split("  #")[0])

    search = subprocess.run(command(hints[0]), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert search.returncode == 0 and search.stdout.startswith("1. ["), search.stdout + search.stderr
    serve = subprocess.Popen(
        [*command(hints[1]), "--port", "0"], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        assert serve.stderr is not None
        # "bgem3 serve: MODEL (float32) on http://127.0.0.1:PORT", after the --precision auto line
        started = serve.stderr.readline()
        while started and " on http" not in started:
            started = serve.stderr.readline()
        url = started.rsplit(" on ", 1)[-1].strip()
        assert url.startswith("http://127.0.0.1:"), started
        through = command(hints[2].replace("http://127.0.0.1:8000", url))
        remote = subprocess.run(through, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert remote.returncode == 0, remote.stdout + remote.stderr
        assert remote.stdout.startswith("1. [") and remote.stderr == "", remote.stdout + remote.stderr
        # the same hits in the same order as the local search: the server encodes with the same checkpoint, at
        # the precision its start-up line names (bfloat16 on a CPU with bf16 matmuls), so scores agree to bf16
        def hits(out: str) -> list[tuple[str, float]]:
            found = re.findall(r"^\d+\. \[([0-9.]+)\] (.+?)  \(", out, flags=re.M)
            return [(where, float(score)) for score, where in found]

        local, served = hits(search.stdout), hits(remote.stdout)
        assert local and [w for w, _ in served] == [w for w, _ in local], remote.stdout + search.stdout
        assert all(abs(a - b) <= 0.01 * abs(b) + 1e-3 for (_, a), (_, b) in zip(served, local, strict=True))
    finally:
        serve.terminate()
        serve.wait(timeout=60)
