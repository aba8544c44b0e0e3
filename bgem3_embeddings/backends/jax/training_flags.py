"""XLA's memory-optimised CPU scheduler for training on JAX, set before JAX starts its CPU client.

XLA:CPU's default scheduler orders a compiled program for concurrency, and in a gradient it ran the
forward recomputations of `jax.checkpoint` (Keras' `remat`, `bgem3 finetune --gradient-checkpointing`)
early enough to keep every layer's activations alive: remat then saved nothing (full size, 2 x 8 x 128,
GradCache 8 rows: 14,923 MB under the default scheduler, 12,499 MB under this one; the table and its
command: docs/performance/finetune.md).

XLA reads XLA_FLAGS once, when JAX creates its CPU client (its first computation), so this must run before
that; a flag the user set is left alone. Other devices ignore the flag.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

FLAG = "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"
# The first jaxlib this was measured on; an older XLA may not know the flag, and an unknown flag in
# XLA_FLAGS aborts the process.
MIN_JAXLIB = (0, 10)


def use_memory_optimized_scheduler() -> bool:
    """Add FLAG to XLA_FLAGS unless the user chose a scheduler; whether the flag is in effect."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_scheduler_type" in flags:
        return FLAG in flags
    import jaxlib

    version = tuple(int(part) for part in jaxlib.__version__.split(".")[:2] if part.isdigit())
    if version < MIN_JAXLIB:
        logger.debug("jaxlib %s: XLA's memory-optimised CPU scheduler not set", jaxlib.__version__)
        return False
    if _cpu_client_started():
        logger.warning(
            "JAX started before training: remat on the CPU keeps more memory than it should; set "
            "XLA_FLAGS=%s before the first JAX computation",
            FLAG,
        )
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {FLAG}".strip()
    return True


def _cpu_client_started() -> bool:
    """Whether JAX has created its backends (after which XLA_FLAGS is not read again)."""
    try:
        from jax._src import xla_bridge  # private: the only record of whether the backends exist
    except ImportError:
        return False
    return bool(getattr(xla_bridge, "_backends", {}))
