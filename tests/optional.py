"""Skips for what a test genuinely needs and a machine lacks, never for a broken install; none under CI.

    from tests.optional import require_module, skip_or_fail

    jax = require_module("jax", "the JAX backend")  # at module level or inside a test

`make test` imports every optional package before it runs (the Makefile's check-test-deps), and with
CI=true (the CI run, .ci/run) everything the tests need is installed: there a missing package, program or
browser fails the test instead of skipping it. Elsewhere (a `pytest` on a partial install) a test skips
only when the package it names is itself not installed: a package that is installed but fails to import
(one of its own imports missing, an error inside one of our modules) is an error, as pytest.importorskip
would have turned it into a skip.

No heavy imports here (tests/support.py imports torch): a test can use it to skip without torch.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest


def on_ci() -> bool:
    """CI=true: the CI run, where every optional package, program and browser the tests use is installed."""
    return os.environ.get("CI", "").lower() == "true"


def skip_or_fail(reason: str, ci_hint: str = "") -> NoReturn:
    """Skip with `reason`; under CI=true fail with it instead (plus `ci_hint`: what CI should have done)."""
    if on_ci():
        hint = ci_hint or "the CI run installs everything the tests use"
        pytest.fail(f"{reason} (CI=true: {hint})", pytrace=False)
    pytest.skip(reason, allow_module_level=True)  # as importorskip: in a test or at module level


def require_module(name: str, reason: str = "") -> ModuleType:
    """`import name`, skipping (failing under CI) only when `name` itself, or a package above it, is not
    installed. Any other import error, inside the package or inside one of ours, propagates."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if not missing or (name != missing and not name.startswith(missing + ".")):
            raise
        skip_or_fail(f"{name} is not installed" + (f": {reason}" if reason else ""))
