"""Fine-tuning on more than one device: Keras' DataParallel on JAX, several hosts through jax.distributed.

`--data-parallel` replicates the model on every device JAX sees (every device of every process when several
hosts run) and splits each step's batch between them: --per-device-train-batch-size queries (and their
groups) per device, as FlagEmbedding's per-process batch under torchrun. The step is one jitted function
over the whole batch (Keras' DataParallel distribution; XLA inserts the collectives), so the gradient is the
whole batch's. The loss is FlagEmbedding's per process, averaged over the devices (M3Finetuner(devices=...),
loss.m3_loss); `--negatives-cross-device` joins every device's passages to every query's negatives in the
dense term, as FlagEmbedding's option of that name does.

Several hosts: run the same command on each, with `--coordinator-address HOST:PORT --num-processes N
--process-id I` (what `jax.distributed.initialize` takes); any left out JAX fills from its environment
(JAX_COORDINATOR_ADDRESS, or Slurm, Open MPI, Kubernetes and Cloud TPU jobs, which it detects). Every host
reads the same training files and makes the same seeded global batches, and feeds its own devices' rows.

TensorFlow and PyTorch have no such path here: asking for it there is refused in one line naming JAX.

    >>> parallel = start(options)       # doctest: +SKIP  (before any Keras variable exists)
    >>> parallel.devices                # doctest: +SKIP
    2
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from bgem3_embeddings.devices import BACKEND_LABELS, CPU, DeviceChoice
from bgem3_embeddings.finetune.options import FinetuneOptions


@dataclass(frozen=True)
class JaxDevice(DeviceChoice):
    """One of this process's own JAX devices, as keras.device names it ('cpu:2048' on the second host's CPU:
    DeviceChoice names every CPU 'cpu:0', which is the first host's there)."""

    name: str = "cpu:0"

    @property
    def keras_device(self) -> str:
        return self.name


class DataParallelError(ValueError):
    """Data-parallel training cannot start as asked (one line: cause, option, what to do)."""


@dataclass(frozen=True)
class Parallel:
    """Where a run's steps go: `devices` in all (each takes a per-device batch), over `processes` hosts'
    processes, this one being `process_index` with `local_devices` of them."""

    devices: int = 1
    processes: int = 1
    process_index: int = 0
    local_devices: int = 1
    # where the weights load before they are replicated: this process's own first device (a value on
    # another host's device cannot be replicated from here)
    device: DeviceChoice = field(default=CPU)

    def global_batch_size(self, per_device: int) -> int:
        """Queries per step over every device."""
        return per_device * self.devices

    def local_rows(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """This process's share of a global batch (every input's rows are queries or their groups, in
        device order); the whole batch when one process runs."""
        if self.processes == 1:
            return inputs
        share = self.local_devices / self.devices
        out = {}
        for name, value in inputs.items():
            rows = round(value.shape[0] * share)
            out[name] = value[self.process_index * rows : (self.process_index + 1) * rows]
        return out

    @property
    def writes(self) -> bool:
        """Whether this process writes the output folder (the first one; the others hold the same weights)."""
        return self.process_index == 0


SINGLE = Parallel()


def asked(options: FinetuneOptions) -> bool:
    """Whether `options` ask for more than one device or for negatives across devices."""
    return options.data_parallel or options.negatives_cross_device or _multi_host(options)


def check_backend(options: FinetuneOptions, backend: str) -> None:
    """DataParallelError when `options` ask for devices the Keras `backend` cannot give here."""
    if backend == "jax" or not asked(options):
        return
    option = "--negatives-cross-device" if options.negatives_cross_device else "--data-parallel"
    raise DataParallelError(
        f"{option}: fine-tuning on more than one device runs on Keras' JAX backend only, not on "
        f"{BACKEND_LABELS.get(backend, backend)}: set KERAS_BACKEND=jax (pip install jax), or drop {option}"
    )


def start(options: FinetuneOptions) -> Parallel:
    """Join the other hosts (jax.distributed) and make Keras' DataParallel over every device the global
    distribution, before any variable is made (a variable made earlier is not replicated); SINGLE when
    `options` ask for one device."""
    import keras

    check_backend(options, keras.backend.backend())
    if not options.data_parallel:
        return SINGLE
    import jax

    if _multi_host(options):
        keras.distribution.initialize(options.coordinator_address, options.num_processes, options.process_id)
    devices = jax.device_count()
    # each process feeds its own rows of every batch (Parallel.local_rows): no sharding of the data by Keras
    keras.distribution.set_distribution(keras.distribution.DataParallel(auto_shard_dataset=False))
    local = jax.local_devices()[0]
    kind = "cpu" if local.platform == "cpu" else "cuda"
    device = JaxDevice(kind, f"/{local.platform.upper()}:{local.id}", f"{local.platform}:{local.id}")
    return Parallel(devices, jax.process_count(), jax.process_index(), jax.local_device_count(), device)


def stop(parallel: Parallel) -> None:
    """Leave the distribution `start` set (a later run in this process starts from none)."""
    if parallel is not SINGLE:
        import keras

        keras.distribution.set_distribution(None)


def _multi_host(options: FinetuneOptions) -> bool:
    given = (options.coordinator_address, options.num_processes, options.process_id)
    return any(v is not None for v in given) or (
        options.data_parallel and bool(os.environ.get("JAX_COORDINATOR_ADDRESS"))
    )
