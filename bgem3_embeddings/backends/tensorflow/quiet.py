"""TensorFlow started without its start-up lines on the terminal: by every command, and by the first use
of `bgem3_embeddings.BGEM3Encoder` / `BGEM3Model` in a program.

TF_CPP_MIN_LOG_LEVEL does not silence everything: since TF 2.18, lines such as cudart_stub's "Could not
find cuda drivers" and cuda_platform's "failed call to cuInit" go through absl logging, which ignores it
(tensorflow#100442). So TensorFlow's import and its device set-up run with file descriptor 2 redirected to a
temporary file. Afterwards, what other threads of the program wrote there meanwhile is written back to
stderr, without TensorFlow's own log lines; if the import fails, everything is shown.

TF_CPP_MIN_LOG_LEVEL is set only for the import (TensorFlow's C++ logging reads it once, at its first line,
which the import writes) and then removed: child processes get the user's environment and start their own
TensorFlow quietly. A user who set TF_CPP_MIN_LOG_LEVEL themselves gets TensorFlow's own behaviour. A
program without stderr (pythonw: `sys.stderr` is None, descriptor 2 not open) starts as well.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import IO

from bgem3_embeddings.backends.keras_backend import configured_backend

TF_LOG_ENV = "TF_CPP_MIN_LOG_LEVEL"
QUIET_LEVEL = "2"  # INFO and WARNING of TensorFlow's own C++ logging off
# TensorFlow's log lines as absl ("I0000 00:00:1700000000.123456    42 cudart_stub.cc:31] ...") and TSL
# ("2024-01-01 12:00:00.000000: I tensorflow/...cc:12] ...") write them, and absl's notice about them.
TF_LOG_LINE = re.compile(
    r"[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] "
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] \S+:\d+\] "
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
)


def without_tensorflow_lines(text: str) -> str:
    """`text` less TensorFlow's own log lines (what another thread wrote stays, in order)."""
    return "".join(line for line in text.splitlines(keepends=True) if not TF_LOG_LINE.match(line))


def _flush_stderr() -> None:
    if sys.stderr is not None:
        with contextlib.suppress(Exception):  # a closed or replaced stream: nothing to flush
            sys.stderr.flush()


def _write_stderr(text: str) -> None:
    if text and sys.stderr is not None:
        with contextlib.suppress(Exception):
            sys.stderr.write(text)
            sys.stderr.flush()


def _descriptor_2_open() -> bool:
    try:
        os.fstat(2)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _stderr_to(sink: IO[bytes]) -> Iterator[None]:
    """Send file descriptor 2 (where C++ code logs) to `sink` for the duration of the block."""
    _flush_stderr()
    saved = os.dup(2)
    os.dup2(sink.fileno(), 2)
    try:
        yield
    finally:
        _flush_stderr()
        os.dup2(saved, 2)
        os.close(saved)


def _import_tensorflow() -> None:
    import tensorflow as tf

    tf.config.list_physical_devices()  # platform initialisation logs here (cuInit)


def _import_capturing() -> None:
    """Import TensorFlow with descriptor 2 in a temporary file; write back what was not TensorFlow's."""
    with tempfile.TemporaryFile() as sink:
        try:
            with _stderr_to(sink):
                _import_tensorflow()
        except BaseException:
            sink.seek(0)
            _write_stderr(sink.read().decode("utf-8", "replace"))
            raise
        sink.seek(0)
        _write_stderr(without_tensorflow_lines(sink.read().decode("utf-8", "replace")))


def start_tensorflow_quietly() -> None:
    """Import TensorFlow and initialise its devices without its C++ start-up lines on the terminal, and
    keep its Python warnings and INFO logs off (a no-op once TensorFlow is imported, or when the user set
    TF_CPP_MIN_LOG_LEVEL: their level, TensorFlow's behaviour). Nothing on Keras' JAX or PyTorch
    backends, which run without TensorFlow."""
    if TF_LOG_ENV in os.environ or "tensorflow" in sys.modules or configured_backend() != "tensorflow":
        return
    os.environ[TF_LOG_ENV] = QUIET_LEVEL
    try:
        if not _descriptor_2_open():
            # No stderr (pythonw): descriptor 2 on the null device, so that TensorFlow's C++ logging cannot
            # write into whatever file the program opens next as descriptor 2.
            null = os.open(os.devnull, os.O_WRONLY)
            if null != 2:
                os.dup2(null, 2)
                os.close(null)
            _import_tensorflow()
        else:
            _import_capturing()
    finally:
        os.environ.pop(TF_LOG_ENV, None)  # the level stays read; child processes get the user's environment
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"(tensorflow|keras)(\.|$)")
