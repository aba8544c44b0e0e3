"""A program that imports bgem3_embeddings sees no TensorFlow start-up lines (the absl ones that
TF_CPP_MIN_LOG_LEVEL does not reach included), unless its user set their own level; a device asked for
and not there is one clear line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import TF_NOISE, assert_clean_failure, run_module, run_program

PROGRAM = """
import sys
from bgem3_embeddings import BGEM3Encoder
encoder = BGEM3Encoder(sys.argv[1], show_progress=False)
print(encoder.encode(["What is BGE M3?"])["dense_vecs"].shape)
"""


def test_a_program_sees_no_tensorflow_lines(tiny_checkpoint: Path) -> None:
    done = run_program(PROGRAM, str(tiny_checkpoint))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(1, 32)"
    assert done.stderr == "", done.stderr


def test_the_users_own_level_is_left_alone(tiny_checkpoint: Path) -> None:
    done = run_program(PROGRAM, str(tiny_checkpoint), env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert done.returncode == 0, done.stderr
    # TensorFlow's own start-up lines (which lines depends on the machine: some always come on CPU)
    assert any(noise in done.stderr for noise in TF_NOISE), done.stderr


def test_a_device_that_is_not_there_is_one_line(tiny_checkpoint: Path) -> None:
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    model = ("--model", str(tiny_checkpoint))
    done = run_module("bgem3_embeddings.cli", "encode", "hi", *model, "--device", "gpu")
    assert_clean_failure(done, 2, "device 'gpu' asked for", "sees no GPU")
