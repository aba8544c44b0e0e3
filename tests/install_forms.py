"""The install hints the commands print in the test venv (no torch imported: light tests use it too).

`make setup-dev` installs every package of this project editable from this clone, so a hint names the
clone's folder (bgem3_embeddings/install_hint.py says why): `pip install -e "CLONE/integrations/qdrant[mcp]"`.
"""

from __future__ import annotations

from pathlib import Path

CLONE = Path(__file__).resolve().parents[1]


def clone_pip_install(folder: str = ".", extra: str = "") -> str:
    """The hint for the package in `folder` of this clone (with `extra`), as a command prints it here."""
    path = (CLONE / folder).resolve()
    return f'pip install -e "{path}[{extra}]"' if extra else f"pip install -e {path}"
