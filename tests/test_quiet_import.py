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


CHILD = """
import sys
from bgem3_embeddings import BGEM3Encoder
BGEM3Encoder(sys.argv[1], show_progress=False)
"""
PARENT = f"""
import os, subprocess, sys
from bgem3_embeddings import BGEM3Encoder
BGEM3Encoder(sys.argv[1], show_progress=False)
print("TF_CPP_MIN_LOG_LEVEL" in os.environ)  # not left behind for child processes
child = subprocess.run([sys.executable, "-c", {CHILD!r}, sys.argv[1]], capture_output=True, text=True)
print(child.returncode, repr(child.stderr))
"""


def test_child_processes_get_the_users_environment_and_start_quietly(tiny_checkpoint: Path) -> None:
    """The quiet start leaves no TF_CPP_MIN_LOG_LEVEL behind: a child process (a Ray worker, a second
    program) does not mistake it for the user's own setting, and starts its TensorFlow quietly too."""
    done = run_program(PARENT, str(tiny_checkpoint))
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr
    assert done.stdout.splitlines() == ["False", "0 ''"], done.stdout


THREADED = """
import os, sys, threading, time
written = []
def chatter():
    for i in range(40):
        line = f"thread line {i}"
        if i % 2:
            os.write(2, (line + "\\n").encode())      # C level, as a library's thread writes
        else:
            print(line, file=sys.stderr, flush=True)  # Python level
        written.append(line)
        time.sleep(0.05)
t = threading.Thread(target=chatter)
t.start()
from bgem3_embeddings import BGEM3Encoder
BGEM3Encoder(sys.argv[1], show_progress=False)
t.join()
print(len(written))
"""


def test_other_threads_stderr_is_kept_while_tensorflow_starts(tiny_checkpoint: Path) -> None:
    """Descriptor 2 is redirected while TensorFlow imports: what another thread wrote meanwhile comes back
    (TensorFlow's own lines do not)."""
    done = run_program(THREADED, str(tiny_checkpoint))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "40"
    lines = done.stderr.splitlines()
    assert sorted(lines, key=lambda x: int(x.split()[-1])) == [f"thread line {i}" for i in range(40)], lines
    for noise in TF_NOISE:
        assert noise not in done.stderr, done.stderr


@pytest.mark.parametrize("descriptor_2", ["open", "closed"])
def test_a_program_without_stderr_starts(tiny_checkpoint: Path, descriptor_2: str) -> None:
    """pythonw: sys.stderr is None (and descriptor 2 may not be open); the quiet start still works."""
    close = "os.close(2)" if descriptor_2 == "closed" else "pass"
    program = f"import os, sys\n{close}\nsys.stderr = None\n" + PROGRAM
    done = run_program(program, str(tiny_checkpoint))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(1, 32)"
    assert not any(noise in done.stderr for noise in TF_NOISE), done.stderr
