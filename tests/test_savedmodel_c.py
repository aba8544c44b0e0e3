"""The SavedModel from TensorFlow's C API (examples/savedmodel_c): built with the system C compiler against
the installed TensorFlow wheel, run on a `bgem3 export` of the tiny checkpoint; its three outputs equal
FlagEmbedding's on the same texts (the ids from the export's own tokenizer.json)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from bgem3_embeddings.cli import app
from tests.optional import skip_or_fail
from tests.tolerances import SCALED, UNIT_VECTORS

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "savedmodel_c"
TEXTS = ["What is BGE M3?", "BM25 is a bag-of-words retrieval function.", "a", "Pad me, please: 12 tokens?"]


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/savedmodel_c built by its build.sh (gcc, the wheel's headers and libtensorflow_cc)."""
    if shutil.which(os.environ.get("CC", "gcc")) is None:
        skip_or_fail("no C compiler (gcc)", ".ci/run installs gcc")
    out = tmp_path_factory.mktemp("c") / "bgem3_savedmodel"
    done = subprocess.run(
        [str(EXAMPLE / "build.sh"), str(out)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture(scope="module")
def export_dir(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "saved_model"
    args = ["export", str(out), "--format", "saved_model", "--model", str(tiny_checkpoint)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return out


def run_c(program: Path, export: Path, ids: list[list[int]]) -> dict[str, Any]:
    lines = "".join(" ".join(map(str, row)) + "\n" for row in ids)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [str(program), str(export)], input=lines, capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_c_api_outputs_equal_flagembedding(program: Path, export_dir: Path, tiny_checkpoint: Path) -> None:
    from tokenizers import Tokenizer

    from tests.flagembedding_ref import flagembedding_m3

    tokenizer = Tokenizer.from_file(str(export_dir / "tokenizer" / "tokenizer.json"))
    ids = [tokenizer.encode(t).ids for t in TEXTS]
    assert len({len(row) for row in ids}) > 1  # right padding is exercised
    out = run_c(program, export_dir, ids)
    ref = flagembedding_m3(tiny_checkpoint).encode(
        TEXTS, return_dense=True, return_sparse=True, return_colbert_vecs=True
    )
    dense = np.asarray(out["dense_vecs"], np.float32)
    np.testing.assert_allclose(dense, ref["dense_vecs"], **UNIT_VECTORS)
    for i, row in enumerate(ids):
        weights = np.asarray(out["sparse_weights"][i], np.float32)
        lexical: dict[str, float] = {}
        for token, w in zip(row, weights[: len(row)], strict=True):
            if w > 0:
                lexical[str(token)] = max(lexical.get(str(token), 0.0), float(w))
        expected = {k: float(v) for k, v in ref["lexical_weights"][i].items()}
        assert lexical.keys() == expected.keys(), (TEXTS[i], lexical, expected)
        np.testing.assert_allclose(
            [lexical[k] for k in expected], list(expected.values()), **SCALED, err_msg=TEXTS[i]
        )
        assert not weights[len(row) :].any()  # padding
        colbert = np.asarray(out["colbert_vecs"][i], np.float32)
        np.testing.assert_allclose(colbert[: len(row) - 1], ref["colbert_vecs"][i], **UNIT_VECTORS)
        assert not colbert[len(row) - 1 :].any()  # padding rows


def test_c_program_errors_are_one_line(program: Path, tmp_path: Path) -> None:
    """A folder that is no SavedModel, and no ids: exit 1, the last line says which (TensorFlow's own
    start-up lines may come before it: TF_CPP_MIN_LOG_LEVEL=2 keeps most of them out)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    for stdin, message in (
        ("0 2\n", "error: cannot load the SavedModel: "),
        ("", "error: no token ids on stdin: one text per line, ids separated by spaces"),
    ):
        done = subprocess.run(
            [str(program), str(tmp_path)], input=stdin, capture_output=True, text=True, env=env, timeout=300
        )
        assert done.returncode == 1, done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith(message), done.stderr
