"""The model name `tiny`: a tiny random checkpoint, generated once into the user's cache on first use.

`--model tiny` (an embedding model) and `--reranker tiny` (a cross-encoder) run every command offline, from
any folder, on random weights: every step runs, the scores and rankings mean nothing. Generating needs torch
and sentencepiece (not in the base install); a run without them says which pip command adds them.

Folders: $BGEM3_TINY_DIR, else $XDG_CACHE_HOME/bgem3_embeddings/tiny (~/.cache/...), with `bge-m3/` and
`reranker/` inside. A folder named `tiny` in the working directory wins, as any folder does.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from bgem3_embeddings.install_hint import pip_install

logger = logging.getLogger(__name__)

TINY_MODEL_NAME = "tiny"
TINY_DIR_ENV = "BGEM3_TINY_DIR"
# What generating needs beyond the base install; torch pinned as the project pins it (an unpinned torch pulls
# GBs of CUDA packages).
TINY_INSTALL = pip_install("torch==2.13.0", "sentencepiece>=0.2")
TINY_SEED = 0  # the tests' tiny checkpoints use it too: the same weights

Kind = Literal["encoder", "reranker"]
_FOLDERS: dict[str, str] = {"encoder": "bge-m3", "reranker": "reranker"}
_WHAT: dict[str, str] = {"encoder": "embedding model", "reranker": "cross-encoder"}


def is_tiny_name(name: object) -> bool:
    """Whether `name` means the tiny model: the string `tiny`, with no folder of that name here."""
    return isinstance(name, str) and name == TINY_MODEL_NAME and not Path(name).exists()


def tiny_root() -> Path:
    """The folder holding the tiny checkpoints."""
    env = os.environ.get(TINY_DIR_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "bgem3_embeddings" / "tiny"


def tiny_dir(kind: Kind = "encoder") -> Path:
    """Where the tiny checkpoint of `kind` is (or will be) generated."""
    return tiny_root() / _FOLDERS[kind]


class TinyUnavailableError(FileNotFoundError):
    """The tiny model is not generated yet and this install cannot generate it (no torch or sentencepiece)."""


def ensure_tiny(kind: Kind = "encoder", announce: Callable[[str], None] | None = None) -> Path:
    """The tiny checkpoint of `kind`, generated first when missing (`announce` gets the one line saying so;
    default: a log warning). Generated aside and renamed into place, so an interrupted run leaves none."""
    target = tiny_dir(kind)
    if (target / "config.json").is_file():
        return target
    try:
        from bgem3_embeddings.checkpoint import tiny_weights
    except ImportError as err:
        raise TinyUnavailableError(
            f"the model name {TINY_MODEL_NAME!r} is a tiny random {_WHAT[kind]} generated on first use into "
            f"{target}, which needs {err.name or 'torch and sentencepiece'} (not installed): "
            f"run {TINY_INSTALL}"
        ) from err
    line = (
        f"generating the tiny random {_WHAT[kind]} once into {target} (random weights: every step runs, "
        "its scores and rankings mean nothing)"
    )
    (announce or logger.warning)(line)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        make = tiny_weights.make_tiny_checkpoint
        if kind == "reranker":
            make = tiny_weights.make_tiny_reranker_checkpoint
        make(staging, weights="safetensors", seed=TINY_SEED)
        try:
            staging.rename(target)
        except OSError:  # another process generated it meanwhile: theirs is the same
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
