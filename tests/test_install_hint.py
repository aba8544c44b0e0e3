"""Install hints name what pip can install here (issue 58, item 4): this project's packages by the folder of
the clone they were installed from (-e when editable), by name when installed from a wheel or an index.

The environments are built from dist-info folders alone (PEP 610's direct_url.json, or none) on a sys.path
that holds nothing else, so each install kind is what importlib.metadata finds, as it would be in a user's.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bgem3_embeddings import install_hint
from bgem3_embeddings.install_hint import pip_install
from tests.install_forms import CLONE


@pytest.fixture(autouse=True)
def _fresh_lookup() -> Iterator[None]:
    install_hint._source_of.cache_clear()  # remembered per process: each test is its own install
    yield
    install_hint._source_of.cache_clear()


def clone_copy(root: Path) -> Path:
    """A clone's package folders (their pyproject.toml: the dependencies a hint must add) under `root`."""
    for folder in install_hint.CLONE_FOLDERS.values():
        (root / folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(CLONE / folder / "pyproject.toml", root / folder / "pyproject.toml")
    return root


def installed(site: Path, name: str, *, url: str | None = None, editable: bool = False) -> None:
    """A dist-info for `name` in `site`: from a folder `url` (file://) when given, else from an index."""
    info = site / f"{name.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    (info / "INSTALLER").write_text("pip\n")
    if url is not None:
        (info / "direct_url.json").write_text(json.dumps({"url": url, "dir_info": {"editable": editable}}))


def test_editable_from_a_clone_names_the_folders_and_adds_the_missing_own_dependencies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clone = clone_copy(tmp_path / "my clone")  # a space: the path is quoted
    site = tmp_path / "site"
    installed(site, "bgem3-embeddings", url=clone.as_uri(), editable=True)
    installed(site, "langchain-bgem3", url=(clone / "integrations/langchain").as_uri(), editable=True)
    monkeypatch.setattr(sys, "path", [str(site)])
    # bgem3-qdrant is not installed: langchain's [qdrant] extra needs it and no index has it.
    assert pip_install("langchain-bgem3[qdrant]") == (
        f'pip install -e "{clone}/integrations/qdrant" -e "{clone}/integrations/langchain[qdrant]"'
    )
    assert pip_install("bgem3-qdrant[mcp]") == f'pip install -e "{clone}/integrations/qdrant[mcp]"'
    assert pip_install("bgem3-embeddings[serve]") == f'pip install -e "{clone}[serve]"'
    # Other packages keep their names, quoted where a shell would read them otherwise.
    assert pip_install("ray[data,default]", "FlagEmbedding") == (
        'pip install "ray[data,default]" FlagEmbedding'
    )


def test_installed_from_a_folder_without_e_names_the_folder_without_e(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clone = clone_copy(tmp_path / "clone")
    site = tmp_path / "site"
    installed(site, "bgem3-embeddings", url=clone.as_uri())
    installed(site, "bgem3-qdrant", url=(clone / "integrations/qdrant").as_uri())
    monkeypatch.setattr(sys, "path", [str(site)])
    assert pip_install("bgem3-qdrant[ray]") == f'pip install "{clone}/integrations/qdrant[ray]"'


def test_a_wheel_install_or_none_gives_the_plain_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    installed(site, "bgem3-embeddings")
    installed(site, "bgem3-qdrant")
    monkeypatch.setattr(sys, "path", [str(site)])
    assert pip_install("bgem3-qdrant[mcp]") == 'pip install "bgem3-qdrant[mcp]"'
    assert pip_install("langchain-bgem3[qdrant]") == 'pip install "langchain-bgem3[qdrant]"'
    install_hint._source_of.cache_clear()
    monkeypatch.setattr(sys, "path", [str(tmp_path / "empty")])
    assert pip_install("bgem3-embeddings[serve]") == 'pip install "bgem3-embeddings[serve]"'


def test_a_clone_that_was_moved_away_gives_the_plain_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    installed(site, "bgem3-embeddings", url=(tmp_path / "gone").as_uri(), editable=True)
    monkeypatch.setattr(sys, "path", [str(site)])
    assert pip_install("bgem3-embeddings[serve]") == 'pip install "bgem3-embeddings[serve]"'


def test_a_source_trees_egg_info_is_not_an_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python run from the clone's root finds the clone's own bgem3_embeddings.egg-info first on sys.path
    (setuptools' build metadata, no INSTALLER): the editable install behind it still decides."""
    clone = clone_copy(tmp_path / "clone")
    egg = clone / "bgem3_embeddings.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: bgem3-embeddings\nVersion: 0.1.0\n")
    site = tmp_path / "site"
    installed(site, "bgem3-embeddings", url=clone.as_uri(), editable=True)
    monkeypatch.setattr(sys, "path", [str(clone), str(site)])
    assert pip_install("bgem3-embeddings[serve]") == f'pip install -e "{clone}[serve]"'
