"""Helpers shared by the core's tests and the integrations' tests: import them from here.

    from tests.support import ReferenceM3, assert_clean_failure

- `ReferenceM3`, `assert_batch_matches_reference`: the reference (transformers' XLMRobertaModel with
  FlagEmbedding's heads) on a checkpoint's weights (tests/reference_m3.py).
- `make_tiny_checkpoint`: a tiny random checkpoint in the BAAI/bge-m3 layout (tests/tiny_checkpoint.py).
- `run_module`, `run_program`, `assert_clean_failure`: a command (or a program) run as a user runs it, and
  what a person sees when it fails as expected.
- `without_modules`: an environment in which optional packages look uninstalled.
- `clone_pip_install`: the install hint a command prints in this clone's editable venv.
- `tiny_server`: `bgem3 serve`'s app on a tiny checkpoint, in a thread on loopback (needs the serve extra).
- `load_benchmark`: a script of benchmarks/ (or of a folder in it: `findings/NAME`) as a module, to call
  its functions.

Skipping on a missing optional package or program (never under CI=true) is tests/optional.py's
`require_module` / `skip_or_fail`, kept apart because this module imports torch.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.install_forms import CLONE as CLONE
from tests.install_forms import clone_pip_install as clone_pip_install
from tests.optional import skip_or_fail
from tests.reference_m3 import ReferenceM3, assert_batch_matches_reference
from tests.tiny_checkpoint import make_tiny_checkpoint

# Markers of TensorFlow's C++ logging (absl prefixes and the start-up sources seen on CPU machines).
TF_NOISE = ("cudart_stub", "cuda_platform", "absl::", "cpu_feature_guard", "I0000 ", "E0000 ", "W0000 ")


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module; NAME may name a folder (`findings/torch_dispatch`). Not a package:
    loaded by path, with its own folder and benchmarks/ on sys.path while it runs, for the scripts that
    import a sibling or a script of benchmarks/."""
    path = BENCHMARKS / f"{name}.py"
    module_name = path.stem
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # as an import would: dataclasses look their module up there
    folders = list(dict.fromkeys((str(path.parent), str(BENCHMARKS))))
    sys.path[:0] = folders
    try:
        spec.loader.exec_module(module)
    finally:
        for folder in folders:
            sys.path.remove(folder)
    return module


# Packages only the reference needs, hidden from a user's commands as a user's install lacks them
# (tests/reference_only says why).
REFERENCE_ONLY = Path(__file__).resolve().parent / "reference_only"
# Packages the default install (the TensorFlow backend) lacks, hidden from commands on that backend.
DEFAULT_INSTALL_ONLY = Path(__file__).resolve().parent / "default_install_only"


def user_env(env: dict[str, str] | None) -> dict[str, str]:
    """The environment with TensorFlow's logging and QDRANT_URL as a user has them (not as the test
    session set them), plus `env`, and without the reference's own dependencies (`REFERENCE_ONLY`) or, on
    the TensorFlow backend, the extras' packages TensorFlow imports when present (`DEFAULT_INSTALL_ONLY`)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "QDRANT_URL")}
    full_env.update(env or {})
    backend = full_env.get("KERAS_BACKEND", "tensorflow")
    full_env["PYTHONPATH"] = user_install_pythonpath(full_env.get("PYTHONPATH", ""), backend)
    return full_env


def user_install_pythonpath(pythonpath: str = "", backend: str = "tensorflow") -> str:
    """`pythonpath` with the stubs of what a user's install lacks first: the reference's own dependencies
    (`REFERENCE_ONLY`) and, on the TensorFlow backend, `DEFAULT_INSTALL_ONLY`. For processes started outside
    `user_env` (the demo script, a test cluster's daemons)."""
    path = _first_on_path(REFERENCE_ONLY, pythonpath)
    return _first_on_path(DEFAULT_INSTALL_ONLY, path) if backend == "tensorflow" else path


def _first_on_path(folder: Path, pythonpath: str) -> str:
    """`pythonpath` with `folder` first, so that its modules win over installed ones."""
    return os.pathsep.join(p for p in (str(folder), pythonpath) if p)


def run_module(
    module: str,
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stdin: str | None = None,
    prefix: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` in a fresh process, in a user's environment (`user_env`), in folder `cwd`
    (default: this one), with `stdin` as what the user types (default: this process's stdin), started
    through `prefix` if any (`bound_by_file_modes()`)."""
    return subprocess.run(
        [*prefix, sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=user_env(env),
        timeout=300,
        cwd=cwd,
        input=stdin,
    )


def bound_by_file_modes() -> list[str]:
    """The command prefix under which a process obeys file permissions as a user's does: none for a
    non-root user; for root (CI, containers), which ignores them, util-linux's setpriv dropping
    CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH. Skips (fails under CI=true) where that is not possible."""
    if os.geteuid() != 0:
        return []
    drop = [shutil.which("setpriv") or "setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    try:
        works = subprocess.run([*drop, "true"], capture_output=True, timeout=30).returncode == 0
    except OSError:
        works = False
    if not works:
        skip_or_fail("root ignores file permissions and setpriv cannot drop CAP_DAC_OVERRIDE here")
    return drop


def assert_reordered(reranked: Sequence[int]) -> None:
    """`reranked`: a cross-encoder's top hits as indices into the first stage's ranked candidates (as
    `BGEM3Reranker.rerank` gives them). A rerank test holds a pipeline to that order; where the hits keep
    the first stage's relative order (0, 1, 2 or 1, 3), a pipeline that left the cross-encoder out, or
    only let it pick the hits, would pass too: some hit must come ahead of one the first stage ranked
    higher."""
    order = list(reranked)
    assert order != sorted(order), f"the cross-encoder kept the first stage's order {order}"


def run_program(
    code: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -c CODE ARGS`: a user's own program, in a fresh process and a user's environment."""
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=user_env(env), timeout=300
    )


def without_modules(folder: Path, *modules: str) -> dict[str, str]:
    """An environment (for `run_module`) in which importing `modules` fails as if they were not installed:
    a stub that raises ImportError for each, first on PYTHONPATH."""
    folder.mkdir(parents=True, exist_ok=True)
    for module in modules:
        stub = f'raise ImportError("No module named {module!r}", name={module!r})\n'
        (folder / f"{module}.py").write_text(stub)
    return {"PYTHONPATH": _first_on_path(folder, os.environ.get("PYTHONPATH", ""))}


def assert_clean_failure(done: subprocess.CompletedProcess[str], code: int, *phrases: str) -> None:
    """Exit code, the phrases in stderr, at most two lines, no traceback and no TensorFlow log lines."""
    err = done.stderr
    assert done.returncode == code, f"exit {done.returncode}\n{err}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 2, err
    assert lines[0].startswith("error: "), err
    for phrase in phrases:
        assert phrase in err, f"{phrase!r} not in {err!r}"
    assert "Traceback" not in err, err
    for noise in TF_NOISE:
        assert noise not in err, f"TensorFlow log line in stderr: {err!r}"


@contextmanager
def tiny_server(checkpoint: Path, **settings: Any) -> Iterator[str]:
    """A server on its own fp32 CPU encoder of `checkpoint` (the server's warm-up changes an encoder's
    eager-batch counter, so it is not shared); yields the base URL. `settings`: ServeSettings fields."""
    from bgem3_embeddings import BGEM3Encoder
    from bgem3_embeddings.serve.app import create_app
    from bgem3_embeddings.serve.server import serve_in_thread
    from bgem3_embeddings.serve.settings import ServeSettings

    encoder = BGEM3Encoder(checkpoint, precision="float32", device="cpu", show_progress=False)
    with serve_in_thread(create_app(encoder, ServeSettings(**settings))) as url:
        yield url


def assert_health_answers_during(base: str, request: Callable[[], Any]) -> Any:
    """Run `request()` (a slow HTTP call to the server at `base`) on a thread while /health is probed every
    50 ms; assert that probes were answered while it ran (at least 3) and that none waited a third of its
    time, i.e. its work stayed off the event loop. Returns what `request()` returned."""
    import threading
    import time

    import httpx

    done: dict[str, Any] = {}

    def run() -> None:
        done["start"] = time.perf_counter()
        done["answer"] = request()
        done["end"] = time.perf_counter()

    worker = threading.Thread(target=run)
    worker.start()
    probes: list[tuple[float, float]] = []  # (sent, answered)
    while worker.is_alive():
        sent = time.perf_counter()
        assert httpx.get(f"{base}/health", timeout=300).status_code == 200
        probes.append((sent, time.perf_counter()))
        time.sleep(0.05)
    worker.join()
    took = done["end"] - done["start"]
    during = [(s, a) for s, a in probes if s >= done["start"] and a <= done["end"]]
    assert len(during) >= 3, (took, probes)  # probes were answered while the request ran ...
    longest = max(a - s for s, a in probes)
    assert longest < took / 3, (longest, took)  # ... and none waited for most of it
    return done["answer"]


__all__ = [
    "assert_health_answers_during",
    "TF_NOISE",
    "ReferenceM3",
    "assert_batch_matches_reference",
    "assert_clean_failure",
    "make_tiny_checkpoint",
    "run_module",
    "run_program",
    "tiny_server",
    "without_modules",
]
