"""The `pip install` line a message gives, in the form that works for how this project was installed.

None of this project's distributions is on a package index: from a clone they install by folder
(`pip install -e integrations/qdrant`). A hint naming `bgem3-qdrant[mcp]` would send pip to an index that does
not have it, so this project's own distributions are named by their folder in the clone they were installed
from, found in PEP 610's direct_url.json (a file:// URL; `dir_info.editable` when installed with -e), as an
absolute path so the line works from any folder. Installed from a wheel or an index, the name stays.
Every `pip install` the library and the integrations print comes from `pip_install`.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

# Each of this project's distributions and its folder inside a clone.
CLONE_FOLDERS = {
    "bgem3-embeddings": ".",
    "bgem3-qdrant": "integrations/qdrant",
    "langchain-bgem3": "integrations/langchain",
    "llama-index-embeddings-bgem3": "integrations/llama-index",
}
# name, [extras], the rest (a version specifier); PEP 508's names, markers are not used here.
_REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?(.*)$")
# Characters a POSIX shell reads as more than a word (brackets glob, > and < redirect): such a word is quoted.
_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_./:@+,-]+$")


@dataclass(frozen=True)
class CloneInstall:
    """Where a distribution of this project was installed from: the clone's root and whether with -e."""

    root: Path
    editable: bool


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installation(distribution: str) -> importlib.metadata.Distribution | None:
    """The installed `distribution`: the first on sys.path that an installer wrote (PEP 627's INSTALLER
    file). A source tree's egg-info (the clone's root is on sys.path when Python runs there) is not one."""
    for found in importlib.metadata.distributions(name=distribution):
        if found.read_text("INSTALLER") is not None:
            return found
    return None


def _direct_url(distribution: str) -> dict[str, object] | None:
    """The distribution's direct_url.json, or None when it is not installed or came from an index/wheel."""
    found = _installation(distribution)
    text = found.read_text("direct_url.json") if found is not None else None
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _installed(distribution: str) -> bool:
    return _installation(distribution) is not None


def clone_install(distribution: str) -> CloneInstall | None:
    """The clone `distribution` was installed from, or None (installed from an index or a wheel)."""
    record = _direct_url(distribution)
    if record is None or not isinstance(record.get("dir_info"), dict):
        return None  # no record (an index) or an archive/VCS URL: not a folder on this machine
    url = urlparse(str(record.get("url", "")))
    if url.scheme != "file":
        return None
    folder = Path(unquote(url.path))
    root = folder
    for _ in Path(CLONE_FOLDERS[distribution]).parts:
        root = root.parent
    dir_info = record["dir_info"]
    editable = isinstance(dir_info, dict) and dir_info.get("editable") is True
    return CloneInstall(root=root, editable=editable)


@functools.cache
def _source_of(distribution: str) -> CloneInstall | None:
    """Where to install `distribution` (one of this project's) from: its own record when it is installed,
    otherwise the clone another of this project's distributions came from (e.g. bgem3-qdrant, not yet
    installed, next to the bgem3-embeddings that is)."""
    if _installed(distribution):
        return clone_install(distribution)
    for other in CLONE_FOLDERS:
        found = clone_install(other) if other != distribution else None
        if found is not None:
            return found
    return None


def _quoted(word: str) -> str:
    return word if _PLAIN_WORD.match(word) else f'"{word}"'


def _own_requirements(folder: Path, extras: str) -> list[str]:
    """This project's distributions that the package in `folder` (with `extras`, "[qdrant]") depends on.

    pip would look those up on an index, which does not have them: a hint installs them from the clone too."""
    try:
        project = tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return []
    wanted = list(project.get("dependencies", []))
    optional = project.get("optional-dependencies", {})
    for extra in extras.strip("[]").split(","):
        wanted += optional.get(extra.strip(), [])
    names = []
    for requirement in wanted:
        match = _REQUIREMENT.match(str(requirement))
        if match and _canonical(match.group(1)) in CLONE_FOLDERS:
            names.append(_canonical(match.group(1)))
    return names


def _install_words(requirement: str, done: set[str]) -> list[str]:
    """The pip arguments for one requirement: this project's own as its clone folder (-e when installed
    editable), after those of its own dependencies that are not installed yet; anything else as given."""
    match = _REQUIREMENT.match(requirement)
    name = _canonical(match.group(1)) if match else ""
    if requirement.startswith("-") or match is None or name not in CLONE_FOLDERS:
        return [_quoted(requirement)]
    source = _source_of(name)
    folder = (source.root / CLONE_FOLDERS[name]).resolve() if source is not None else None
    if source is None or folder is None or not (folder / "pyproject.toml").is_file():
        return [_quoted(requirement)]
    done.add(name)
    words: list[str] = []
    for dependency in _own_requirements(folder, match.group(2) or ""):
        if dependency not in done and not _installed(dependency):
            words += _install_words(dependency, done)
    target = _quoted(f"{folder}{match.group(2) or ''}{match.group(3)}")
    return [*words, "-e", target] if source.editable else [*words, target]


def pip_install(*requirements: str) -> str:
    """`pip install ...` for `requirements` ("bgem3-qdrant[mcp]", "torch==2.13.0", options such as
    "--no-deps"), each of this project's distributions named the way it installs here.

    >>> pip_install("torch==2.13.0", "FlagEmbedding")
    'pip install "torch==2.13.0" FlagEmbedding'
    """
    done: set[str] = set()
    words = [word for requirement in requirements for word in _install_words(requirement, done)]
    return " ".join(["pip install", *words])
