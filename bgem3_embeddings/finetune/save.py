"""Save a (fine-tuned) Keras BGEM3Model as BAAI ships BGE-M3, for FlagEmbedding's BGEM3FlagModel and for us.

The folder holds, as the hub repo BAAI/bge-m3 does:

    model.safetensors    the encoder under Hugging Face XLMRobertaModel names (no "roberta." prefix), float32,
                         Linear weights [out, in]; tensors of the source the model has no variable for (the
                         pooler, which BGE-M3 does not use, an old position_ids buffer) copied from it
    colbert_linear.pt    torch.save of a Linear's state dict {"weight": [out, in], "bias": [out]}, written
    sparse_linear.pt     without torch (checkpoint/torch_pickle_writer.py), for torch.load(weights_only=True)
    config.json, the tokenizer files and sentence-transformers' descriptors: copied from the source folder

The names come from checkpoint/porting.py's loading specs, read backwards: what loads is what is saved.
Weights held in bfloat16 or float16 are written as float32 (exact). A Dense layer with Keras LoRA enabled
is saved with its adapters merged (`layer.kernel` is then the merged kernel). With LoRA each merged kernel
is computed when the specs are built, so the adapted kernels are held twice while saving.

The folder is written beside OUT and renamed into place (finetune/replace_folder.py): a crash or a full disk
never leaves a half checkpoint, and the previous one in OUT stays until the new one is complete.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

import keras
import numpy as np

from bgem3_embeddings.checkpoint.files import (
    COLBERT_HEAD_FILE,
    CONFIG_FILE,
    SPARSE_HEAD_FILE,
    TOKENIZER_FILES,
    CheckpointNotFoundError,
    checkpoint_files_in,
)
from bgem3_embeddings.checkpoint.open_weights import open_tensor_source
from bgem3_embeddings.checkpoint.porting import (
    WeightSpec,
    _strip_prefix,
    encoder_weight_specs,
    head_weight_specs,
    identity,
    transpose,
)
from bgem3_embeddings.checkpoint.safetensors_writer import PendingTensor, write_safetensors
from bgem3_embeddings.checkpoint.tensor_source import TensorSource
from bgem3_embeddings.checkpoint.torch_pickle_writer import write_state_dict
from bgem3_embeddings.finetune.replace_folder import FolderWriteError, replaced_atomically
from bgem3_embeddings.model import BGEM3Model

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
# Copied as they are when the source has them: the config, the tokenizer, and sentence-transformers'
# descriptors (BAAI's repo has them, so SentenceTransformer loads the folder too).
COPIED_FILES = (
    CONFIG_FILE,
    *TOKENIZER_FILES,
    "config_sentence_transformers.json",
    "modules.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
)
# transformers refuses a safetensors file whose metadata does not name its framework.
SAFETENSORS_METADATA = {"format": "pt"}
FLOAT32 = np.dtype(np.float32)
# Each loading transform's inverse: a transpose undoes itself. A new transform in porting.py must be added.
_INVERSE = {transpose: transpose, identity: identity}


class CheckpointSaveError(FolderWriteError):
    """The checkpoint could not be saved; the message says why and that OUT's previous content is intact."""


def _hf_value(spec: WeightSpec) -> np.ndarray:
    """A spec's variable (or LoRA-merged kernel) as the float32 Hugging Face tensor it was loaded from."""
    if spec.transform not in _INVERSE:
        raise TypeError(f"{spec.name}: no inverse for the loading transform {spec.transform!r}")
    value = keras.ops.convert_to_numpy(spec.variable).astype(FLOAT32)  # bf16 -> float32 is exact
    return np.asarray(_INVERSE[spec.transform](value))


def _shape(spec: WeightSpec) -> tuple[int, ...]:
    return tuple(int(n) for n in spec.source_shape)


def encoder_tensors(model: BGEM3Model, source: TensorSource) -> list[PendingTensor]:
    """model.safetensors' tensors: the encoder's variables, then the source's tensors the model lacks."""
    return spec_tensors(encoder_weight_specs(model), source)


def spec_tensors(specs: list[WeightSpec], source: TensorSource) -> list[PendingTensor]:
    """The tensors of `specs` (the loading specs of any model: the encoder's, the reranker's), then the
    source's tensors no spec names, under the source's names ('roberta.' dropped where every name has it,
    as loading drops it)."""
    tensors = [PendingTensor(s.name, _shape(s), FLOAT32, partial(_hf_value, s)) for s in specs]
    ours = {s.name for s in specs}
    infos = source.infos()
    for name, stored in sorted(_strip_prefix(set(infos)).items()):
        if name in ours:
            continue
        info = infos[stored]
        dtype = FLOAT32 if np.issubdtype(info.dtype, np.floating) else info.dtype
        tensors.append(PendingTensor(name, tuple(info.shape), dtype, partial(source.read, stored)))
    return tensors


def head_arrays(layer: Any) -> dict[str, np.ndarray]:
    """A head's torch Linear state dict {"weight": [out, in], "bias": [out]}, float32."""
    return {spec.name.lstrip("."): _hf_value(spec) for spec in head_weight_specs(layer)}


@contextmanager
def _created(path: Path) -> Iterator[BinaryIO]:
    """`path` opened for writing; an OSError names the file (a write's ENOSPC carries no file name)."""
    try:
        with open(path, "xb") as out:
            yield out
    except OSError as err:
        if err.filename is None:
            err.filename = str(path)
        raise


def write_bgem3_files(model: BGEM3Model, source_dir: Path, folder: Path) -> None:
    """Write the BAAI/bge-m3 layout of `model` into the existing empty `folder` (not atomic: see
    `save_bgem3_checkpoint`); config and tokenizer from the checkpoint folder `source_dir`."""
    write_weights_and_copies(partial(encoder_tensors, model), source_dir, folder)
    heads = ((COLBERT_HEAD_FILE, model.colbert_linear), (SPARSE_HEAD_FILE, model.sparse_linear))
    for file_name, layer in heads:
        with _created(folder / file_name) as out:
            write_state_dict(out, head_arrays(layer), archive_name=Path(file_name).stem)


def write_weights_and_copies(
    tensors: Callable[[TensorSource], list[PendingTensor]], source_dir: Path, folder: Path
) -> None:
    """model.safetensors from `tensors(source)` (source: the checkpoint in `source_dir`), then the config,
    tokenizer and descriptor files copied from `source_dir`: what every saved model folder holds."""
    files = checkpoint_files_in(Path(source_dir))
    with open_tensor_source(files.weights) as source, _created(folder / WEIGHTS_FILE) as out:
        write_safetensors(out, tensors(source), SAFETENSORS_METADATA)
    for name in COPIED_FILES:
        if (files.root / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            _copy(files.root / name, folder / name)


def _copy(source: Path, target: Path) -> None:
    with open(source, "rb") as src, _created(target) as out:
        shutil.copyfileobj(src, out)


def check_output_dir(output_dir: Path, overwrite: bool) -> None:
    """Refuse to replace a folder that holds something other than a checkpoint, unless `overwrite`."""
    if overwrite or not output_dir.exists():
        return
    if output_dir.is_dir() and not any(output_dir.iterdir()):
        return
    try:
        checkpoint_files_in(output_dir)
    except CheckpointNotFoundError as err:
        raise CheckpointSaveError(
            f"{output_dir} holds something other than a model checkpoint ({err}); nothing was changed: "
            "choose another output folder, or overwrite it on purpose"
        ) from err


def save_bgem3_checkpoint(
    model: BGEM3Model,
    source_dir: Path,
    output_dir: Path,
    *,
    overwrite: bool = False,
    extra: Callable[[Path], None] | None = None,
    write: Callable[[Any, Path, Path], None] = write_bgem3_files,
) -> None:
    """Save `model` into `output_dir` in BAAI/bge-m3's layout, config and tokenizer from `source_dir` (the
    checkpoint the model was loaded from), atomically: `output_dir` is replaced whole only once the new
    folder is complete on disk.

    `output_dir` may hold a previous checkpoint (replaced) or nothing; a folder holding anything else is
    refused (CheckpointSaveError) unless `overwrite`. `extra(folder)`, when given, writes more files (a
    training state) into the new folder before it is renamed into place. `write(model, source_dir, folder)`
    writes the model's own files (the reranker's layout differs). An OSError (ENOSPC) while writing
    raises CheckpointSaveError, one line; `output_dir` keeps its previous content.
    """
    output_dir = Path(output_dir)
    checkpoint_files_in(Path(source_dir))  # a missing source file is named before anything is written
    check_output_dir(output_dir, overwrite)
    try:
        with replaced_atomically(output_dir) as folder:
            write(model, Path(source_dir), folder)
            if extra is not None:
                extra(folder)
    except FolderWriteError as err:
        raise CheckpointSaveError(str(err)) from err.__cause__
    logger.info("saved the checkpoint to %s", output_dir)
