"""Find a checkpoint's files: a local directory, or a Hugging Face hub id fetched with huggingface_hub.

Only the files BGE-M3 needs are downloaded (never the 2.3 GB onnx/ folder); the torch-pickle encoder
weights are fetched only when the repo has no safetensors. huggingface_hub honours HF_HOME,
HF_HUB_CACHE and HF_HUB_OFFLINE itself; cache_dir, revision and local_files_only are passed through.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from bgem3_embeddings.checkpoint.tiny import Kind, TinyUnavailableError, ensure_tiny, is_tiny_name, tiny_dir

logger = logging.getLogger(__name__)

DEFAULT_MODEL_ID = "BAAI/bge-m3"
CONFIG_FILE = "config.json"
COLBERT_HEAD_FILE = "colbert_linear.pt"
SPARSE_HEAD_FILE = "sparse_linear.pt"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "sentencepiece.bpe.model",
)
# In preference order: safetensors first (no pickle at all), torch pickles only as a fallback.
SAFETENSORS_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def local_checkpoint_path(name: str | Path, kind: Kind = "encoder") -> Path:
    """The folder a model name means: the path itself, except `tiny` (when no `tiny` folder is here), which
    is the tiny random checkpoint of `kind` in the user's cache (checkpoint/tiny.py; maybe not generated)."""
    if is_tiny_name(name):
        return tiny_dir(kind)
    return Path(name).expanduser()


class CheckpointNotFoundError(FileNotFoundError):
    """The path or hub id does not hold a usable BGE-M3 checkpoint; the message says what is missing."""


@dataclass(frozen=True)
class CheckpointFiles:
    """Paths of one checkpoint's files. Heads are None when the file is absent."""

    root: Path
    config: Path
    weights: Path
    colbert_head: Path | None
    sparse_head: Path | None

    @property
    def tokenizer_dir(self) -> Path:
        return self.root


def find_weights(root: Path) -> Path | None:
    """The encoder weights file in `root`, preferring safetensors."""
    for name in (*SAFETENSORS_WEIGHTS, *PICKLE_WEIGHTS):
        if (root / name).is_file():
            return root / name
    return None


def checkpoint_files_in(root: Path) -> CheckpointFiles:
    """Validate a local checkpoint directory and name its files."""
    if not root.exists():
        raise CheckpointNotFoundError(f"{root} does not exist")
    if not root.is_dir():
        raise CheckpointNotFoundError(f"{root} is not a directory: expected a BGE-M3 checkpoint folder")
    config = root / CONFIG_FILE
    weights = find_weights(root)
    missing = []
    if not config.is_file():
        missing.append(CONFIG_FILE)
    if weights is None:
        missing.append(" or ".join((*SAFETENSORS_WEIGHTS, *PICKLE_WEIGHTS)))
    if not (root / "tokenizer.json").is_file() and not (root / "sentencepiece.bpe.model").is_file():
        missing.append("tokenizer.json or sentencepiece.bpe.model")
    if missing:
        raise CheckpointNotFoundError(f"{root} is not a BGE-M3 checkpoint: missing {', '.join(missing)}")
    assert weights is not None
    colbert, sparse = root / COLBERT_HEAD_FILE, root / SPARSE_HEAD_FILE
    return CheckpointFiles(
        root=root,
        config=config,
        weights=weights,
        colbert_head=colbert if colbert.is_file() else None,
        sparse_head=sparse if sparse.is_file() else None,
    )


def looks_like_hub_id(name: str) -> bool:
    """'owner/name' with no path separators beyond one slash and no leading ./ or /."""
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~")) and "\\" not in name


def download_checkpoint(
    repo_id: str,
    *,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
) -> Path:
    """Fetch the needed files of a hub repo into the HF cache and return the snapshot folder."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

    def fetch(patterns: list[str]) -> Path:
        return Path(
            str(
                snapshot_download(
                    repo_id=repo_id,
                    revision=revision,
                    cache_dir=str(cache_dir) if cache_dir is not None else None,
                    local_files_only=local_files_only,
                    allow_patterns=patterns,
                )
            )
        )

    base_patterns = [CONFIG_FILE, *TOKENIZER_FILES, COLBERT_HEAD_FILE, SPARSE_HEAD_FILE]
    try:
        # safetensors shards are named model-0000x-of-0000y.safetensors.
        root = fetch([*base_patterns, "model*.safetensors*"])
        if find_weights(root) is None:
            logger.info("%s has no safetensors weights: fetching pytorch_model.bin", repo_id)
            root = fetch(["pytorch_model*.bin*"])
    except LocalEntryNotFoundError as err:
        raise CheckpointNotFoundError(_not_cached_message(repo_id, local_files_only, cache_dir)) from err
    except RepositoryNotFoundError as err:
        raise CheckpointNotFoundError(
            f"{repo_id!r} is neither a local folder nor a Hugging Face repo you can access "
            f"(check the name, or log in with `hf auth login` for a private or gated repo)"
        ) from err
    except Exception as err:  # huggingface_hub raises many kinds: name the repo and the cause.
        raise CheckpointNotFoundError(
            f"could not fetch {repo_id!r} from the Hugging Face hub: {err}"
        ) from err
    return root


def _not_cached_message(repo_id: str, local_files_only: bool, cache_dir: str | Path | None) -> str:
    """Why a hub id could not be resolved from the cache: downloads are off, or the hub is unreachable."""
    from huggingface_hub import constants

    cache = cache_dir if cache_dir is not None else constants.HF_HUB_CACHE
    if local_files_only or constants.HF_HUB_OFFLINE:
        switch = "local_files_only=True" if local_files_only else "HF_HUB_OFFLINE=1"
        return (
            f"{repo_id} is not in the Hugging Face cache ({cache}) and downloads are off ({switch}): "
            f"download it once with downloads on, or pass a local checkpoint folder"
        )
    return (
        f"cannot reach the Hugging Face hub to fetch {repo_id}, and it is not in the cache ({cache}): "
        f"check the network (or HF_ENDPOINT / proxy settings), or pass a local checkpoint folder"
    )


def resolve_checkpoint(
    model_name_or_path: str | Path,
    *,
    revision: str | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
    kind: Kind = "encoder",
) -> CheckpointFiles:
    """A local directory when one exists at that path, otherwise a hub id; `tiny` is the tiny random
    checkpoint of `kind` (an embedding model or a cross-encoder), generated on first use (checkpoint/tiny.py).

    Example:
        >>> files = resolve_checkpoint("BAAI/bge-m3", local_files_only=True)  # doctest: +SKIP
    """
    if not isinstance(model_name_or_path, str | Path) or not str(model_name_or_path).strip():
        raise CheckpointNotFoundError(
            f"model_name_or_path must be a hub id or a directory, got {model_name_or_path!r}"
        )
    if is_tiny_name(model_name_or_path):
        try:
            return checkpoint_files_in(ensure_tiny(kind))
        except TinyUnavailableError as err:
            raise CheckpointNotFoundError(str(err)) from err
    path = local_checkpoint_path(model_name_or_path)
    if (
        path.exists()
        or isinstance(model_name_or_path, Path)
        or not looks_like_hub_id(str(model_name_or_path))
    ):
        return checkpoint_files_in(path)
    root = download_checkpoint(
        str(model_name_or_path), revision=revision, cache_dir=cache_dir, local_files_only=local_files_only
    )
    return checkpoint_files_in(root)
