"""TensorFlow's oneDNN CPU kernels on every x86-64 CPU, not only the ones TensorFlow picks by default.

TensorFlow turns oneDNN on by default only on x86 CPUs with AVX-512 VNNI / BF16, AVX-VNNI or AMX. On
others (an AVX2-only AMD EPYC, older Xeons) MatMul runs on Eigen and grappler's remapper does not fuse
MatMul + BiasAdd + Gelu. Measured on a 2-vCPU AMD EPYC (AVX2): a (2048, 1024) @ (1024, 4096) matmul
88-94 GFLOP/s on Eigen (its second thread adds nothing on that shape) against 173-188 GFLOP/s with oneDNN;
one full-size encoder layer at (8 x 992) tokens 2.21 s against 1.30 s (docs/performance.md).

TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, when it is imported. So the package sets it, as a default,
before anything of ours imports TensorFlow: only on x86-64, only when the user has not set it (set
TF_ENABLE_ONEDNN_OPTS=0 to keep Eigen), and not at all when TensorFlow is already imported (too late to
matter; `bgem3 doctor` then says whether oneDNN is on).
"""

from __future__ import annotations

import logging
import os
import platform
import sys
from collections.abc import MutableMapping

logger = logging.getLogger(__name__)

ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
X86_64 = ("x86_64", "amd64")


def prefer_onednn(
    environ: MutableMapping[str, str] | None = None,
    machine: str | None = None,
    tensorflow_imported: bool | None = None,
) -> bool:
    """Set TF_ENABLE_ONEDNN_OPTS=1 when it is unset, the CPU is x86-64 and TensorFlow is not imported yet.

    Returns True when it set the variable. The arguments exist for tests; by default they are the
    process's environment, CPU architecture and sys.modules.

        >>> env = {}
        >>> prefer_onednn(env, machine="x86_64", tensorflow_imported=False), env
        (True, {'TF_ENABLE_ONEDNN_OPTS': '1'})
    """
    env = os.environ if environ is None else environ
    arch = (machine if machine is not None else platform.machine()).lower()
    imported = "tensorflow" in sys.modules if tensorflow_imported is None else tensorflow_imported
    if ONEDNN_ENV in env or arch not in X86_64 or imported:
        return False
    env[ONEDNN_ENV] = "1"
    return True


def onednn_enabled() -> bool | None:
    """Whether this process's TensorFlow runs oneDNN kernels (None when it cannot tell).

    Imports TensorFlow: call it where TensorFlow is needed anyway (the doctor).
    """
    try:
        from tensorflow.python.util import _pywrap_util_port  # no public API says it
    except ImportError:
        return None
    try:
        return bool(_pywrap_util_port.IsMklEnabled())
    except Exception:  # noqa: BLE001 - a private function that may change between TensorFlow releases
        logger.debug("could not ask TensorFlow whether oneDNN is on", exc_info=True)
        return None
