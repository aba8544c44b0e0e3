"""Rules the test suite keeps so that a green run means what it says (issue 60).

A skip must never hide a broken install: tests skip through tests.optional (`require_module`,
`skip_or_fail`), which skips only for a package that is not installed and fails under CI. pytest's own
`importorskip` skips on any ImportError, also one raised inside our modules, and everywhere.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_DIRS = [ROOT / "tests", *sorted((ROOT / "integrations").glob("*/tests"))]
IMPORTORSKIP = re.compile(r"\bimportorskip\s*\(")


def suite_files() -> list[Path]:
    """Every Python file of the suites (helpers and workers included: they run inside tests)."""
    return sorted(p for d in TEST_DIRS for p in d.rglob("*.py") if "__pycache__" not in p.parts)


def importorskip_calls(paths: list[Path]) -> list[str]:
    """'path:line' of each pytest.importorskip call outside tests/optional.py."""
    found = []
    for path in paths:
        if path == ROOT / "tests" / "optional.py":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if IMPORTORSKIP.search(line) and not line.lstrip().startswith("#"):
                found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{n}")
    return found


def test_no_test_skips_through_importorskip() -> None:
    found = importorskip_calls(suite_files())
    assert not found, f"use tests.optional.require_module instead of pytest.importorskip: {found}"


def test_the_check_finds_an_importorskip(tmp_path: Path) -> None:
    bad = tmp_path / "test_bad.py"
    call = "pytest." + "importorskip"  # spelled apart: this file is scanned too
    bad.write_text(f'import pytest\n\njax = {call}("jax")\n', encoding="utf-8")
    good = tmp_path / "test_good.py"
    good.write_text('from tests.optional import require_module\n\njax = require_module("jax")\n')
    assert importorskip_calls([bad, good]) == [f"{bad}:3"]
