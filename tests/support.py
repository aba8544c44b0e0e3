"""Helpers shared by the core's tests and the integrations' tests: import them from here.

    from tests.support import ReferenceM3, assert_clean_failure

- `ReferenceM3`, `assert_batch_matches_reference`: the reference (transformers' XLMRobertaModel with
  FlagEmbedding's heads) on a checkpoint's weights (tests/reference_m3.py).
- `make_tiny_checkpoint`: a tiny random checkpoint in the BAAI/bge-m3 layout (tests/tiny_checkpoint.py).
- `run_module`, `assert_clean_failure`: a command run as a user runs it, and what a person sees when it
  fails as expected.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.reference_m3 import ReferenceM3, assert_batch_matches_reference
from tests.tiny_checkpoint import make_tiny_checkpoint

# Markers of TensorFlow's C++ logging (absl prefixes and the start-up sources seen on CPU machines).
TF_NOISE = ("cudart_stub", "cuda_platform", "absl::", "cpu_feature_guard", "I0000 ", "E0000 ", "W0000 ")


def run_module(
    module: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` in a fresh process, with TensorFlow's logging and QDRANT_URL as a user has
    them (not as the test session set them)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "QDRANT_URL")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, env=full_env, timeout=300
    )


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


__all__ = [
    "TF_NOISE",
    "ReferenceM3",
    "assert_batch_matches_reference",
    "assert_clean_failure",
    "make_tiny_checkpoint",
    "run_module",
]
