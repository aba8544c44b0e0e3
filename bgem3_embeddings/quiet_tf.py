"""TensorFlow started without its start-up lines on the terminal: by every command, and by the first use
of `bgem3_embeddings.BGEM3Encoder` / `BGEM3Model` in a program.

TF_CPP_MIN_LOG_LEVEL does not silence everything: since TF 2.18, lines such as cudart_stub's "Could not
find cuda drivers" and cuda_platform's "failed call to cuInit" go through absl logging, which ignores it
(tensorflow#100442). So TensorFlow's import and its device set-up run with file descriptor 2 redirected;
what they printed is shown only if they fail. A user who set TF_CPP_MIN_LOG_LEVEL themselves gets
TensorFlow's own behaviour untouched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import IO

TF_LOG_ENV = "TF_CPP_MIN_LOG_LEVEL"


@contextlib.contextmanager
def _stderr_to(sink: IO[bytes]) -> Iterator[None]:
    """Send file descriptor 2 (where C++ code logs) to `sink` for the duration of the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(sink.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def start_tensorflow_quietly() -> None:
    """Import TensorFlow and initialise its devices without its C++ start-up lines on the terminal, and
    keep its Python warnings and INFO logs off (a no-op once TensorFlow is imported, or when the user set
    TF_CPP_MIN_LOG_LEVEL: their level, TensorFlow's behaviour)."""
    if TF_LOG_ENV in os.environ or "tensorflow" in sys.modules:
        return
    os.environ[TF_LOG_ENV] = "2"  # INFO and WARNING of TensorFlow's own C++ logging, for the whole run
    with tempfile.TemporaryFile() as sink:
        try:
            with _stderr_to(sink):
                import tensorflow as tf

                tf.config.list_physical_devices()  # platform initialisation logs here (cuInit)
        except BaseException:
            sink.seek(0)
            sys.stderr.write(sink.read().decode("utf-8", "replace"))
            raise
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"(tensorflow|keras)(\.|$)")
