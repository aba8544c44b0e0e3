"""Apple's tensorflow-metal plugin: which TensorFlow it is documented for, and what to tell a user.

Apple documents tensorflow-metal 1.2 for TensorFlow 2.18 (1.1.0 with TF 2.18 fails at import with
"Symbol not found"), and ships wheels only for macOS arm64 and CPython 3.9-3.12. The `metal` extra in
pyproject.toml installs exactly that pair; this module holds the same facts for `bgem3 doctor` and for
the error when device="metal" cannot be served. Pure functions on version strings, so they are tested
without a Mac:

    >>> metal_pair_problem("2.21.0", "1.1.0")[0]
    'error'
    >>> metal_pair_problem("2.18.1", "1.2.0") is None
    True
"""

from __future__ import annotations

# The pair Apple documents: TensorFlow 2.18.x with tensorflow-metal >= 1.2 (keep in step with the
# `metal` extra in pyproject.toml; tests/test_metal_extra.py checks the extra).
METAL_DOCUMENTED_TF = (2, 18)
METAL_MIN_PLUGIN = (1, 2)
# tensorflow-metal's wheels are cp39-cp312: no Python 3.13 wheels.
METAL_MAX_PYTHON = (3, 12)
METAL_FIX_COMMAND = "pip install \"tensorflow==2.18.*\" \"tensorflow-metal>=1.2\""
METAL_EXTRA_COMMAND = "pip install \"bgem3-embeddings[metal]\""
METAL_PYTHON_FIX = f"create the environment with Python 3.11 or 3.12, then {METAL_EXTRA_COMMAND}"


def version_tuple(version: str | None) -> tuple[int, ...]:
    """Leading numeric parts of a version string: '2.18.0rc1' -> (2, 18, 0); None or '' -> ()."""
    parts = []
    for piece in (version or "").split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def is_apple_silicon(platform_name: str) -> bool:
    """True for 'Darwin-arm64' (platform.system()-platform.machine())."""
    return platform_name.lower() == "darwin-arm64"


def metal_pair_problem(tensorflow: str | None, plugin: str | None) -> tuple[str, str] | None:
    """(severity, message) when this tensorflow / tensorflow-metal pair is not Apple's documented one.

    "error": known to fail (a plugin older than 1.2 with TF >= 2.18); "warning": unverified (TF newer
    than 2.18 with plugin 1.2). Each message names the pair and the command that installs the right one.
    """
    tf_v, plugin_v = version_tuple(tensorflow), version_tuple(plugin)
    if not tf_v or not plugin_v:
        return None
    pair = f"TensorFlow {tensorflow} with tensorflow-metal {plugin}"
    fix = f"fix: {METAL_FIX_COMMAND}"
    if plugin_v[:2] < METAL_MIN_PLUGIN and tf_v[:2] >= METAL_DOCUMENTED_TF:
        return (
            "error",
            f"{pair}: mismatched pair; tensorflow-metal before 1.2 is built for older TensorFlow "
            f"(1.1.0 with TF 2.18 fails at import: 'Symbol not found'); {fix}",
        )
    if tf_v[:2] != METAL_DOCUMENTED_TF:
        return (
            "warning",
            f"{pair}: Apple documents tensorflow-metal {METAL_MIN_PLUGIN[0]}.{METAL_MIN_PLUGIN[1]} for "
            f"TF {METAL_DOCUMENTED_TF[0]}.{METAL_DOCUMENTED_TF[1]} only; this pair is unverified (if the GPU "
            f"fails, use device='cpu'); {fix}",
        )
    return None


def metal_unavailable_hint(platform_name: str, python: tuple[int, int]) -> str:
    """Why the Metal GPU is not there and what to do, for this platform and Python version."""
    if not is_apple_silicon(platform_name):
        return f"the Metal GPU needs macOS on Apple silicon (arm64); this is {platform_name or 'unknown'}"
    if python > METAL_MAX_PYTHON:
        return (
            f"Metal needs Python <= {METAL_MAX_PYTHON[0]}.{METAL_MAX_PYTHON[1]} (tensorflow-metal has wheels "
            f"for CPython 3.9-3.12 only; this is Python {python[0]}.{python[1]}): {METAL_PYTHON_FIX}"
        )
    return f"install the 'metal' extra: {METAL_EXTRA_COMMAND}"
