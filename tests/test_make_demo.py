"""`make demo` as a newcomer runs it: quiet (no setuptools "Editable installation" blocks, no TensorFlow
lines), only what the demo uses installed (the serve extra for the README's next step; torch only for the
tiny model), one collection per model (a tiny demo, then another model, both run), the three commands to
run next, and `make clean-demo` dropping the demo's collections only."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tests.optional import skip_or_fail
from tests.support import user_install_pythonpath

ROOT = Path(__file__).resolve().parents[1]


def _make(*args: str, env: dict[str, str] | None = None) -> str:
    if shutil.which("make") is None:
        skip_or_fail("make is not installed")
    done = subprocess.run(
        ["make", "-s", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_demo_setup_installs_what_the_demo_uses_and_test_setup_everything(tmp_path: Path) -> None:
    # -n: the commands `make demo` / `make setup` would run in a fresh venv, without running them
    venv = tmp_path / "venv"
    demo = _make("-n", "-B", f"VENV={venv}", "demo")
    installs = [line for line in demo.splitlines() if " install " in line and "--upgrade pip" not in line]
    # the core with the serve extra (the README's next step) and bgem3-qdrant without extras: no Ray, no
    # torch (the tiny model installs it in run_demo.sh, only then), no LangChain or LlamaIndex
    assert installs == [
        f'{venv}/bin/python -m pip install -q --no-compile -e ".[serve]" -e "integrations/qdrant"'
    ], demo
    assert "bash examples/run_demo.sh" in demo
    full = _make("-n", "-B", f"VENV={venv}", f"{venv}/.dev-done")
    for wanted in ('-e ".[serve]"', "integrations/qdrant[ray,", "integrations/langchain[qdrant]", "torch=="):
        assert wanted in full, full
    shown = _make("--eval", "show-warnings: ; @echo $$PYTHONWARNINGS", "show-warnings")
    assert shown.strip() == "ignore:Editable installation"
    # pip installs without byte-compiling, so Python must be free to write each .pyc on first import even
    # where the machine says not to (CI's does): else every process compiles TensorFlow from source again
    no_pyc = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    seen = _make("--eval", 'show-pyc: ; @echo "[$$PYTHONDONTWRITEBYTECODE]"', "show-pyc", env=no_pyc)
    assert seen.strip() == "[]", seen


def _demo(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "examples/run_demo.sh", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_demo_after_a_tiny_demo_and_clean_demo(tmp_path: Path, tiny_checkpoint: Path) -> None:
    """`BGEM3_MODEL=tiny make demo`, then the demo with another model in the same store: both run (each
    model has its own collection), torch is installed for the tiny one only, the second ends with the
    commands to run next (run here too), and `make clean-demo` drops the demo collections only."""
    pip_log = tmp_path / "pip.log"
    fake_pip = tmp_path / "pip"  # records what the demo would install (torch is already here)
    fake_pip.write_text(f'#!/bin/sh\necho "$*" >> {pip_log}\n')
    fake_pip.chmod(0o755)
    store = tmp_path / "store"
    env = {
        "PATH": "/usr/bin:/bin",
        "PY": sys.executable,
        "PIP": str(fake_pip),
        "QDRANT_PATH": str(store),
        "BGEM3_TINY_DIR": str(tmp_path / "tiny-bge-m3"),
        "HOME": str(tmp_path),
        "BGEM3_WEIGHTS_CACHE": "off",
        # a newcomer's install: no scikit-learn, no JAX (tests/support.py: both slow every start down)
        "PYTHONPATH": user_install_pythonpath(),
    }
    tiny = _demo({**env, "BGEM3_MODEL": "tiny"})
    assert tiny.returncode == 0, tiny.stdout + tiny.stderr
    assert "-c bgem3-demo-tiny" in tiny.stdout and "--model tiny" in tiny.stdout
    # said once that its rankings are random (issue 58, item 12)
    assert tiny.stdout.count("the tiny model's weights are random, so its rankings below are random") == 1
    # the commands generated the tiny model into BGEM3_TINY_DIR, with a line saying so
    assert "generating the tiny random embedding model once into" in tiny.stderr
    assert (tmp_path / "tiny-bge-m3" / "bge-m3" / "config.json").is_file()
    assert pip_log.read_text().split() == ["install", "-q", "torch==2.13.0", "sentencepiece>=0.2"]

    done = _demo({**env, "BGEM3_MODEL": str(tiny_checkpoint)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "", done.stderr  # no TensorFlow start-up lines, no warnings
    assert "weights are random" not in done.stdout  # a model that is not `tiny` is not told so
    assert len(pip_log.read_text().splitlines()) == 1  # nothing installed for a model that is not tiny
    collection = f"bgem3-demo-{tiny_checkpoint.name}"
    tail = done.stdout.rstrip().splitlines()[-5:]
    assert tail[0] == "== next, run these yourself from this folder:"
    assert tail[1].strip() == ". .venv/bin/activate"
    # no --model: search uses the model the collection records (issue 58, item 2), run below as printed
    assert tail[2].strip().startswith("bgem3-qdrant search ") and "--model" not in tail[2]
    assert f"--path {store}" in tail[2] and f"-c {collection} " in tail[2]
    assert tail[3].strip().startswith(f"bgem3 serve --model {tiny_checkpoint}")
    assert tail[4].strip().startswith("bgem3-qdrant search ") and f"-c {collection} " in tail[4]
    _run_the_hints(tail[2:], tmp_path)

    mine = subprocess.run(  # a collection of the user's own in the same store: clean-demo keeps it
        [sys.executable, "-m", "bgem3_qdrant", "ingest", "examples/corpus/bge-m3.md", "-c", "mine"]
        + ["--model", str(tiny_checkpoint), "--path", str(store)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert mine.returncode == 0, mine.stdout + mine.stderr
    clean = _demo(env, "--clean")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "dropped bgem3-demo-tiny" in clean.stdout and f"dropped {collection}" in clean.stdout
    assert sorted(p.name for p in (store / "collections").iterdir() if not p.name.startswith(".")) == ["mine"]
    assert not (tmp_path / "tiny-bge-m3").exists()


def _run_the_hints(hints: list[str], tmp_path: Path) -> None:
    """The printed commands, as a user pastes them after `. .venv/bin/activate`: the search, then the server
    (on a free port instead of 8000, which may be taken here) and the search through it."""
    bin_dir = Path(sys.executable).parent
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "BGEM3_WEIGHTS_CACHE": "off",
        "PYTHONPATH": user_install_pythonpath(),
    }

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


def test_make_test_checks_the_system_before_it_installs(tmp_path: Path) -> None:
    """Issue 58, item 1: on a machine without a browser, `make test` stops before the venv is made, with one
    line per missing piece naming its apt and Homebrew command; with them, the check passes silently.
    `make` alone lists the targets."""
    if shutil.which("make") is None:
        skip_or_fail("make is not installed")
    bin_dir = tmp_path / "bin"  # a PATH with the shell, make and Python only: no chromium, no chromedriver
    bin_dir.mkdir()
    tools = {"sh": shutil.which("sh"), "make": shutil.which("make"), "python3": sys.executable}
    for name, target in tools.items():
        (bin_dir / name).symlink_to(str(target))
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    venv = tmp_path / "venv"
    done = subprocess.run(["make", "-s", "test", f"VENV={venv}"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0 and not venv.exists(), done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: make test needs")]
    assert len(lines) == 2, done.stderr
    assert "chromium (" in lines[0] and "apt-get install -y chromium;" in lines[0]
    assert "brew install --cask chromium" in lines[0]
    assert "chromedriver" in lines[1] and "apt-get install -y chromium-driver;" in lines[1]
    assert "brew install --cask chromedriver" in lines[1]

    for name in ("chromium", "chromedriver"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    checked = subprocess.run(["make", "-s", "check-system"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=60)  # fmt: skip
    assert checked.returncode == 0 and checked.stdout + checked.stderr == "", checked.stderr
    listed = _make()
    assert "make test " in listed and "make demo " in listed and "make check-system " in listed
