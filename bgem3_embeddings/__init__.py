"""BGE-M3 (dense, sparse and ColBERT outputs) in Keras 3, loading the official checkpoint.

It runs on whichever Keras backend the process uses: TensorFlow (the default), JAX or PyTorch. Each backend's
code lives in its own room under `backends/` (kernels, runner, and what only it has), the shared math in
`backends/portable/`, and `backends/__init__.py` alone chooses between them.

Names are imported lazily so that `bgem3_embeddings.scoring` and the CLI's help start without TensorFlow;
the first `BGEM3Encoder` / `BGEM3Model` starts TensorFlow without its C++ start-up lines
(backends/tensorflow/quiet.py) unless TF_CPP_MIN_LOG_LEVEL is set.
Importing the package turns TensorFlow's oneDNN kernels on for x86-64 CPUs where TensorFlow leaves them
off, unless TF_ENABLE_ONEDNN_OPTS is set (see bgem3_embeddings/backends/tensorflow/onednn.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from bgem3_embeddings._version import __version__
from bgem3_embeddings.backends.tensorflow.onednn import prefer_onednn
from bgem3_embeddings.backends.tensorflow.quiet import start_tensorflow_quietly

if TYPE_CHECKING:
    from bgem3_embeddings.config import BGEM3Config
    from bgem3_embeddings.encoder import BGEM3Encoder
    from bgem3_embeddings.model import BGEM3Model
    from bgem3_embeddings.remote import RemoteEncoder
    from bgem3_embeddings.reranker.reranker import BGEM3Reranker

__all__ = ["BGEM3Config", "BGEM3Encoder", "BGEM3Model", "BGEM3Reranker", "RemoteEncoder", "__version__"]

# Before any submodule imports TensorFlow, which reads the variable once at start-up.
prefer_onednn()

_WHERE = {
    "BGEM3Config": "config",
    "BGEM3Encoder": "encoder",
    "BGEM3Model": "model",
    "BGEM3Reranker": "reranker.reranker",  # the cross-encoder (bge-reranker-v2-m3)
    "RemoteEncoder": "remote",  # no TensorFlow: encodes through `bgem3 serve`
}


# These import TensorFlow: started without its C++ start-up lines (backends/tensorflow/quiet.py; not if the
# user set TF_CPP_MIN_LOG_LEVEL, or imported TensorFlow first).
_NEEDS_TENSORFLOW = ("BGEM3Encoder", "BGEM3Model", "BGEM3Reranker")


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        if name in _NEEDS_TENSORFLOW:
            start_tensorflow_quietly()
        return getattr(importlib.import_module(f"bgem3_embeddings.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'bgem3_embeddings' has no attribute {name!r}")
