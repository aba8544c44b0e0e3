"""The root conftest's SLOW_FILES_FIRST: every name is a test file that exists (a renamed file would
silently stop being scheduled first), and collection puts those files first."""

from __future__ import annotations

from pathlib import Path

import pytest

import conftest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", conftest.SLOW_FILES_FIRST)
def test_every_slow_file_exists(name: str) -> None:
    assert (ROOT / name).is_file(), f"{name} is in conftest.SLOW_FILES_FIRST but does not exist"


class _Item:
    def __init__(self, path: Path) -> None:
        self.path = path


class _Config:
    rootpath = ROOT


def test_slow_files_are_collected_first_and_the_rest_keep_their_order() -> None:
    names = ["tests/test_a.py", conftest.SLOW_FILES_FIRST[1], "tests/test_b.py", conftest.SLOW_FILES_FIRST[0]]
    items = [_Item(ROOT / name) for name in names] + [_Item(Path("/elsewhere/test_c.py"))]
    conftest.pytest_collection_modifyitems(_Config(), items)  # type: ignore[arg-type]
    ordered = [str(item.path) for item in items]
    assert ordered == [
        str(ROOT / conftest.SLOW_FILES_FIRST[0]),
        str(ROOT / conftest.SLOW_FILES_FIRST[1]),
        str(ROOT / "tests/test_a.py"),
        str(ROOT / "tests/test_b.py"),
        "/elsewhere/test_c.py",
    ]
