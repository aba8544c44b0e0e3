"""Make this process one where `import tensorflow` fails, as on a machine without TensorFlow.

The import system's path finder is wrapped so that it finds no `tensorflow` (or `tf_keras`) package:
`import tensorflow` raises ModuleNotFoundError, `importlib.util.find_spec("tensorflow")` returns None and
`importlib.metadata.version("tensorflow")` raises PackageNotFoundError, exactly as when the package is not
installed (PyTorch probes for it that way at import). Used by the
backend tests' subprocesses (tests/backend_worker.py) before anything imports Keras.
"""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec, PathFinder
from typing import Any

HIDDEN = ("tensorflow", "tf_keras", "tensorboard")


class _PathFinderWithoutTensorFlow:
    @classmethod
    def find_spec(cls, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if name.split(".", 1)[0] in HIDDEN:
            return None
        return PathFinder.find_spec(name, path, target)

    @classmethod
    def find_distributions(cls, *args: Any, **kwargs: Any) -> Any:
        """Installed distributions (importlib.metadata asks here), without TensorFlow's."""
        for dist in PathFinder.find_distributions(*args, **kwargs):
            name = (dist.metadata["Name"] or "").lower().replace("-", "_")
            if name not in HIDDEN:
                yield dist

    @classmethod
    def invalidate_caches(cls) -> None:
        PathFinder.invalidate_caches()


def hide_tensorflow() -> None:
    """From now on this process cannot import TensorFlow (call before anything imports it)."""
    if any(name.split(".", 1)[0] in HIDDEN for name in sys.modules):
        raise RuntimeError("TensorFlow is already imported in this process: hide it before anything else")
    sys.meta_path[:] = [_PathFinderWithoutTensorFlow if f is PathFinder else f for f in sys.meta_path]
