"""A training run's state beside its checkpoint: every variable, the optimizer's, and where the data stood.

`bgem3 finetune` saves the model in BAAI's layout into the output folder and this state into its
`training_state/` subfolder, in the same atomic swap (save.py): the folder always holds one complete
checkpoint that FlagEmbedding loads and `--resume` continues from. Arrays go into a `.npz` read back with
`allow_pickle=False` (no pickle: nothing in it can run code), each under its index and checked against the
variable's path and shape, so a state from another configuration is refused instead of half-applied.

    >>> write_state(folder / STATE_DIR, finetuner, step=120, fingerprint={...})
    >>> read_state(output_dir / STATE_DIR).step
    120
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from keras import ops

STATE_DIR = "training_state"
ARRAYS_FILE = "variables.npz"
POSITION_FILE = "position.json"
FORMAT = 1


class TrainingStateError(ValueError):
    """A saved state that cannot be resumed here (missing, damaged, or from another configuration)."""


@dataclass(frozen=True)
class TrainingState:
    step: int  # steps completed
    fingerprint: dict[str, Any]  # what must match to resume (options that shape the run)
    arrays: dict[str, np.ndarray]
    paths: list[str]


# Keras numbers a name taken earlier in the process ("adamw_1", "m3_finetuner_2"): what else the process
# built first decides the suffix (also inside an optimizer variable's name: "adam_w_1/model_1_dense_m"), so
# a resume compares paths without any "_N" part; the order and every shape are still checked.
_UNIQUE_SUFFIX = re.compile(r"_\d+(?=[/_]|$)")


def stable_path(path: str) -> str:
    """A variable's path without Keras' per-process numbering: `stable_path("adam_w_1/m_3")` -> "adam_w/m"."""
    return _UNIQUE_SUFFIX.sub("", path)


def _variables(model: Any, optimizer: Any) -> list[Any]:
    """What a resume must restore: the model's variables (weights, LoRA factors, dropout's seed state) and
    the optimizer's (step count, moments)."""
    return [*model.variables, *optimizer.variables]


def write_state(folder: Path, model: Any, optimizer: Any, *, step: int, fingerprint: dict[str, Any]) -> None:
    """Write the state after `step` completed steps into `folder` (created)."""
    folder.mkdir(parents=True, exist_ok=True)
    variables = _variables(model, optimizer)
    arrays = {f"v{i}": np.asarray(ops.convert_to_numpy(v.value)) for i, v in enumerate(variables)}
    with open(folder / ARRAYS_FILE, "wb") as out:
        np.savez(out, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle
    position = {
        "format": FORMAT,
        "step": step,
        "fingerprint": fingerprint,
        "paths": [v.path for v in variables],
    }
    (folder / POSITION_FILE).write_text(json.dumps(position, indent=1), encoding="utf-8")


def read_state(folder: Path) -> TrainingState:
    """The state saved in `folder`, or TrainingStateError naming what is wrong."""
    position_file = folder / POSITION_FILE
    if not position_file.is_file():
        raise TrainingStateError(
            f"{folder.parent} holds no training state to resume from ({STATE_DIR}/{POSITION_FILE} is "
            "missing): "
            "start without --resume"
        )
    try:
        position = json.loads(position_file.read_text(encoding="utf-8"))
        with np.load(folder / ARRAYS_FILE, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except (OSError, ValueError) as err:
        raise TrainingStateError(
            f"the training state in {folder} is damaged ({err}): start without --resume"
        ) from err
    if position.get("format") != FORMAT:
        raise TrainingStateError(f"{position_file} has format {position.get('format')!r}, expected {FORMAT}")
    return TrainingState(
        int(position["step"]), dict(position["fingerprint"]), arrays, list(position["paths"])
    )


def restore_state(state: TrainingState, model: Any, optimizer: Any, fingerprint: dict[str, Any]) -> None:
    """Assign a read state to the model and the (built) optimizer, after checking it belongs to this run."""
    changed = sorted(
        k for k in set(fingerprint) | set(state.fingerprint) if fingerprint.get(k) != state.fingerprint.get(k)
    )
    if changed:
        details = ", ".join(
            f"{k}: {state.fingerprint.get(k)!r} then, {fingerprint.get(k)!r} now" for k in changed
        )
        raise TrainingStateError(f"--resume needs the options of the saved run ({details})")
    variables = _variables(model, optimizer)
    if [stable_path(v.path) for v in variables] != [stable_path(p) for p in state.paths]:
        raise TrainingStateError(
            "the saved state holds other variables than this model: start without --resume"
        )
    for i, variable in enumerate(variables):
        value = state.arrays[f"v{i}"]
        if tuple(value.shape) != tuple(variable.shape):
            raise TrainingStateError(
                f"saved {variable.path} has shape {value.shape}, the model {tuple(variable.shape)}"
            )
        variable.assign(value)
