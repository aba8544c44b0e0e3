"""Choosing where the model runs (CUDA GPU, Apple Metal GPU or CPU) and in which precision.

The logic takes the list of devices as data so it is testable on a CPU-only machine:

    >>> choose_device("auto", DeviceInventory(gpus=("/physical_device:GPU:0",), platform="Darwin-arm64"))
    DeviceChoice(kind='metal', tf_device='/GPU:0')
"""

from __future__ import annotations

import os
import platform as _platform
import sys
from dataclasses import dataclass, field

from bgem3_embeddings.backends.tensorflow.metal import (
    APPLE_DIST,
    DISABLE_ENV,
    PLUGIN_DIST,
    SKIP_VERSION_CHECK_ENV,
    is_apple_silicon,
    metal_unavailable_hint,
    version_tuple,
)

PRECISIONS = ("auto", "float32", "bfloat16", "float16", "int8")
DEVICE_KINDS = ("auto", "cpu", "gpu", "cuda", "metal")
COMPUTE_DTYPES = ("auto", "float32", "bfloat16", "float16")


class DeviceError(ValueError):
    """An unknown or unavailable device or precision was asked for."""


@dataclass(frozen=True)
class DeviceInventory:
    """What the Keras backend sees (`backend`: tensorflow, jax or torch; `backend_version`): GPU device
    names, the platform (system-machine, e.g. 'Darwin-arm64'), CPU
    flags and the Python version (tensorflow-metal has no wheels past 3.12); for the Apple GPU also the
    Metal backends installed (distribution, version), the TensorFlow version, the macOS version (() off
    macOS) and the Metal backend's environment variables (TF_DISABLE_METAL, TF_METAL_SKIP_VERSION_CHECK),
    which say why a backend offers no GPU."""

    gpus: tuple[str, ...] = ()
    platform: str = ""
    cpu_flags: frozenset[str] = frozenset()
    python: tuple[int, int] = field(default_factory=lambda: (sys.version_info[0], sys.version_info[1]))
    metal_backends: tuple[tuple[str, str], ...] = ()
    tensorflow: str = ""
    macos: tuple[int, ...] = ()
    metal_env: tuple[tuple[str, str], ...] = ()
    backend: str = "tensorflow"
    backend_version: str = ""

    @property
    def is_apple_silicon(self) -> bool:
        return is_apple_silicon(self.platform)

    @property
    def backend_label(self) -> str:
        """The backend's own name for messages: TensorFlow, JAX or PyTorch."""
        return BACKEND_LABELS.get(self.backend, self.backend)

    @classmethod
    def detect(cls) -> DeviceInventory:
        """This process's inventory, as the Keras backend in use sees it (no other backend imported)."""
        from bgem3_embeddings.backends.keras_backend import backend_name

        backend = backend_name()
        gpus, version = _BACKEND_GPUS[backend]()
        names = (DISABLE_ENV, SKIP_VERSION_CHECK_ENV)
        metal_env = tuple((k, os.environ[k]) for k in names if k in os.environ)
        return cls(
            gpus=gpus,
            platform=current_platform(),
            cpu_flags=read_cpu_flags(),
            metal_backends=installed_metal_backends(),
            tensorflow=version if backend == "tensorflow" else "",
            macos=version_tuple(_platform.mac_ver()[0]),
            metal_env=metal_env,
            backend=backend,
            backend_version=version,
        )


BACKEND_LABELS = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "PyTorch"}


def _tensorflow_gpus() -> tuple[tuple[str, ...], str]:
    import tensorflow as tf

    return tuple(d.name for d in tf.config.list_physical_devices("GPU")), tf.__version__


def _jax_gpus() -> tuple[tuple[str, ...], str]:
    """JAX's accelerators (CUDA; jax-metal is dead, jax #26968): none with only its CPU backend."""
    import jax

    try:
        gpus = tuple(f"gpu:{d.id}" for d in jax.devices("gpu"))
    except RuntimeError:  # "Unknown backend: 'gpu' requested, but no platforms that are instances of gpu"
        gpus = ()
    return gpus, jax.__version__


def _torch_gpus() -> tuple[tuple[str, ...], str]:
    """PyTorch's CUDA devices, or Apple's GPU through MPS (keras' torch backend prefers mps, then cuda)."""
    import torch

    gpus = tuple(f"cuda:{i}" for i in range(torch.cuda.device_count())) if torch.cuda.is_available() else ()
    mps = getattr(torch.backends, "mps", None)
    if not gpus and mps is not None and mps.is_available():
        gpus = ("mps",)
    return gpus, torch.__version__


_BACKEND_GPUS = {"tensorflow": _tensorflow_gpus, "jax": _jax_gpus, "torch": _torch_gpus}


def installed_metal_backends() -> tuple[tuple[str, str], ...]:
    """(distribution, version) of each Metal backend installed, from package metadata (nothing imported)."""
    from importlib import metadata

    found = []
    for name in (APPLE_DIST, PLUGIN_DIST):
        try:
            found.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            continue
    return tuple(found)


@dataclass(frozen=True)
class DeviceChoice:
    kind: str  # "cpu" | "cuda" | "metal"
    tf_device: str  # "/CPU:0" or "/GPU:N", for tf.device(...)

    @property
    def index(self) -> int:
        return int(self.tf_device.rsplit(":", 1)[1])

    @property
    def keras_device(self) -> str:
        """This device as `keras.device(...)` names it on the backend in use: tf.device's '/GPU:0' on
        TensorFlow, 'cuda:0' / 'mps' / 'cpu' on PyTorch, 'gpu:0' / 'cpu:0' on JAX.

            >>> DeviceChoice("cpu", "/CPU:0").keras_device  # doctest: +SKIP
            '/CPU:0'
        """
        from bgem3_embeddings.backends.keras_backend import backend_name

        return keras_device_name(self, backend_name())


CPU = DeviceChoice("cpu", "/CPU:0")


def keras_device_name(device: DeviceChoice, backend: str) -> str:
    """`device` as `keras.device(...)` takes it on `backend`.

    >>> keras_device_name(DeviceChoice("metal", "/GPU:0"), "torch")
    'mps'
    """
    if backend == "tensorflow":
        return device.tf_device
    if device.kind == "cpu":
        # PyTorch's own name for its CPU, "cpu": Keras moves every tensor it converts `.to()` its device, and
        # "cpu:0" is not the device a CPU tensor reports, so each call copied every weight (1.2 GB at full
        # size: 10.8 s of 26 per 8 x 128 batch on a 2-vCPU EPYC).
        return "cpu" if backend == "torch" else "cpu:0"
    if device.kind == "metal":
        if backend != "torch":
            raise DeviceError(f"the Apple GPU runs on Keras' TensorFlow or PyTorch backend, not {backend}")
        return "mps"
    return f"{'cuda' if backend == 'torch' else 'gpu'}:{device.index}"


def current_platform() -> str:
    """This machine as 'system-machine', e.g. 'Darwin-arm64' or 'Linux-x86_64'."""
    return f"{_platform.system()}-{_platform.machine()}"


def tf_device_kind(tf_device: str, platform_name: str) -> str:
    """'metal', 'cuda' or 'cpu' for a tf.device string ('/GPU:0', '/CPU:0') on `platform_name`.

    >>> tf_device_kind("/GPU:0", "Darwin-arm64")
    'metal'
    """
    if "GPU" not in tf_device.upper():
        return "cpu"
    return "metal" if is_apple_silicon(platform_name) else "cuda"


def read_cpu_flags() -> frozenset[str]:
    """CPU feature flags from /proc/cpuinfo (Linux); empty elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _gpu_kind(inventory: DeviceInventory) -> str:
    # Both Metal backends register the Apple GPU as an ordinary "GPU" device, PyTorch as "mps"; only the
    # platform tells.
    return tf_device_kind("/GPU:0", inventory.platform)


def choose_device(device: str, inventory: DeviceInventory) -> DeviceChoice:
    """Resolve a device request: 'auto' prefers a GPU; 'cpu', 'gpu', 'cuda', 'metal', or '/GPU:1'-style."""
    if not isinstance(device, str):
        raise DeviceError(f"device must be a string, got {device!r}")
    request = device.strip().lower()
    if request.startswith(("/gpu:", "gpu:", "cuda:")):
        index_text = request.rsplit(":", 1)[1]
        if not index_text.isdigit():
            raise DeviceError(f"device {device!r}: expected a GPU index like '/GPU:0'")
        index = int(index_text)
        if index >= len(inventory.gpus):
            seen = f"{inventory.backend_label} sees {len(inventory.gpus)} GPU(s)"
            raise DeviceError(f"device {device!r} asked for, but {seen}")
        return DeviceChoice(_gpu_kind(inventory), f"/GPU:{index}")
    if request.startswith("/cpu"):
        return DeviceChoice("cpu", "/CPU:0")
    if request not in DEVICE_KINDS:
        raise DeviceError(f"unknown device {device!r}; choose one of {', '.join(DEVICE_KINDS)} or '/GPU:N'")
    if request == "cpu":
        return DeviceChoice("cpu", "/CPU:0")
    if request == "auto":
        return (
            DeviceChoice(_gpu_kind(inventory), "/GPU:0") if inventory.gpus else DeviceChoice("cpu", "/CPU:0")
        )
    if not inventory.gpus:
        hint = ""
        if request == "metal" and inventory.backend == "torch":
            hint = " (PyTorch's MPS is not available here: torch.backends.mps.is_available() is False)"
        elif request == "metal" and inventory.backend == "jax":
            hint = " (JAX has no Apple GPU backend: use KERAS_BACKEND=torch for PyTorch's MPS)"
        elif request == "metal":
            reason = metal_unavailable_hint(
                inventory.platform,
                inventory.python,
                installed=dict(inventory.metal_backends),
                tensorflow=inventory.tensorflow,
                macos=inventory.macos,
                environ=dict(inventory.metal_env),
            )
            hint = f" ({reason})"
        raise DeviceError(f"device {device!r} asked for, but {inventory.backend_label} sees no GPU{hint}")
    kind = _gpu_kind(inventory)
    if request in ("cuda", "metal") and request != kind:
        raise DeviceError(f"device {device!r} asked for, but the GPU here is a {kind} device")
    return DeviceChoice(kind, "/GPU:0")


def choose_precision(precision: str, device: DeviceChoice, *, cpu_bf16_ok: bool = False) -> str:
    """Resolve 'auto': float16 on CUDA (as the reference does on GPU), float32 on Metal and CPU.

    bf16 on CPU is chosen only when `cpu_bf16_ok` (the CPU has native bf16 matmul and its quality was
    measured to hold; see docs/precision-and-devices.md).
    """
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise DeviceError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if precision == "int8" and device.kind != "cpu":
        raise DeviceError("precision 'int8' runs on the CPU only (TFLite with XNNPACK): use device='cpu'")
    if precision != "auto":
        return precision
    if device.kind == "cuda":
        return "float16"
    if device.kind == "cpu" and cpu_bf16_ok:
        return "bfloat16"
    return "float32"


def cpu_has_native_bf16(flags: frozenset[str]) -> bool:
    """AMX-BF16 or AVX512-BF16: bf16 matmuls run at full speed."""
    return bool(flags & {"amx_bf16", "avx512_bf16"})


# The whole model's speed with bf16 weights and matmuls over float32, per Keras backend, on a CPU with bf16
# instructions: a Zen 5 (avx512_bf16), 2026-11-28, `bgem3 bench --texts 4 --dense-only`
# (docs/precision-and-devices.md; PyTorch's with its projections in oneDNN at both dtypes,
# backends/torch/kernels.py). XLA:CPU uses no bf16 instructions: its bf16 GEMM ran at 342 GFLOP/s and its
# float32 one at 379, where TensorFlow's oneDNN reached 758 in bf16.
CPU_BF16_SPEEDUP = {"tensorflow": 1.56, "torch": 1.78, "jax": 0.75}
CPU_BF16_BACKENDS = tuple(b for b, speedup in CPU_BF16_SPEEDUP.items() if speedup > 1.0)


def cpu_bf16_pays(backend: str, flags: frozenset[str]) -> bool:
    """Whether bf16 matmuls run faster than float32 on this CPU under this Keras backend.

    >>> zen5 = frozenset({"avx512_bf16"})
    >>> cpu_bf16_pays("tensorflow", zen5), cpu_bf16_pays("torch", zen5), cpu_bf16_pays("jax", zen5)
    (True, True, False)
    """
    return backend in CPU_BF16_BACKENDS and cpu_has_native_bf16(flags)


def cpu_has_native_fp16(flags: frozenset[str]) -> bool:
    """AMX-FP16 or AVX512-FP16: fp16 matmuls run at full speed."""
    return bool(flags & {"amx_fp16", "avx512_fp16"})


def cpu_has_int8_dot(flags: frozenset[str]) -> bool:
    """AVX512-VNNI, AVX-VNNI or AMX-INT8: the int8 dot products XNNPACK's fast int8 GEMMs use.

    Without them (AVX2-only CPUs) precision="int8" runs XNNPACK's AVX2 kernels, which multiply in 16 bits
    and measured at about float32 speed (docs/performance/cpu.md#avx2-kernels-on-the-xeon).
    """
    return bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8"})


def choose_compute_dtype(
    precision: str, device: DeviceChoice, cpu_flags: frozenset[str], requested: str = "auto"
) -> str:
    """The dtype matmuls run in, for weights held in `precision`.

    'auto': the weights' dtype on a GPU and on a CPU with native support for it; float32 on a CPU
    without (bf16/fp16 GEMMs are then emulated, 4x slower than fp32 here, so half-precision weights
    are widened to float32 as each layer reads them: half the memory, full fp32 speed).

        >>> choose_compute_dtype("bfloat16", DeviceChoice("cpu", "/CPU:0"), frozenset({"avx512f"}))
        'float32'
    """
    if not isinstance(requested, str) or requested not in COMPUTE_DTYPES:
        raise DeviceError(f"unknown compute_dtype {requested!r}; choose one of {', '.join(COMPUTE_DTYPES)}")
    if precision == "int8":
        if requested != "auto":
            raise DeviceError(f"compute_dtype {requested!r} cannot be set with precision 'int8': use 'auto'")
        return "int8"  # int8 GEMMs, per-row quantized activations (backends/tensorflow/int8.py)
    if requested != "auto":
        if requested not in ("float32", precision):
            raise DeviceError(
                f"compute_dtype {requested!r} is not possible with {precision} weights: "
                f"use 'auto', 'float32' or {precision!r}"
            )
        return requested
    if precision == "float32" or device.kind != "cpu":
        return precision
    native = {"bfloat16": cpu_has_native_bf16, "float16": cpu_has_native_fp16}[precision](cpu_flags)
    return precision if native else "float32"


# precision="auto" on CPU stays float32 (the reference's own outputs) unless this is set to 1 and bf16 pays
# here (`cpu_bf16_pays`): bf16 quality holds (dense cosine >= 0.9999 on the full-size random-init model) and
# it runs 1.56x-1.78x float32 on TensorFlow and PyTorch with avx512_bf16 (`CPU_BF16_SPEEDUP`), 1.98x on AMX
# (docs/precision-and-devices.md), but it changes every output slightly, so it is an opt-in.
AUTO_CPU_BF16_ENV = "BGEM3_AUTO_CPU_BF16"


def auto_cpu_bf16(inventory: DeviceInventory, environ: dict[str, str] | None = None) -> bool:
    """Whether precision='auto' may pick bfloat16 on this CPU: opted in via the env var, and bf16 matmuls
    faster than float32 here (native bf16, on a backend that uses it: `cpu_bf16_pays`)."""
    env = os.environ if environ is None else environ
    return env.get(AUTO_CPU_BF16_ENV, "0") == "1" and cpu_bf16_pays(inventory.backend, inventory.cpu_flags)


def resolve_placement(
    device: str, precision: str, compute_dtype: str, inventory: DeviceInventory
) -> tuple[DeviceChoice, str, str]:
    """(device, weights precision, matmul dtype) for what a caller asked: the one way the encoder and the
    reranker resolve "auto" (choose_device, then choose_precision with auto_cpu_bf16, then
    choose_compute_dtype).

        >>> inventory = DeviceInventory(cpu_flags=frozenset({"avx2"}))
        >>> chosen, weights, matmuls = resolve_placement("auto", "auto", "auto", inventory)
        >>> (chosen.kind, weights, matmuls)
        ('cpu', 'float32', 'float32')
    """
    chosen = choose_device(device, inventory)
    weights = choose_precision(precision, chosen, cpu_bf16_ok=auto_cpu_bf16(inventory))
    matmuls = choose_compute_dtype(weights, chosen, inventory.cpu_flags, requested=compute_dtype)
    return chosen, weights, matmuls


@dataclass(frozen=True)
class ServePrecision:
    """What `bgem3 serve --precision auto` runs (weights and matmuls), and why, for its start-up line."""

    precision: str
    compute_dtype: str
    reason: str


def choose_serve_precision(
    device: DeviceChoice, cpu_flags: frozenset[str], backend: str = "tensorflow"
) -> ServePrecision:
    """`bgem3 serve --precision auto`, from the figures of docs/performance/serve.md (one full-size model
    served at each precision): bfloat16 on a CPU with bf16 matmuls (AVX512-BF16, AMX-BF16) under TensorFlow or
    PyTorch, float32 on other CPUs and on JAX's CPU backend (`cpu_bf16_pays`), the library's choice on GPUs.

    With bf16 matmuls, bf16 weights take less memory and run faster than float32 while keeping the
    reference's rankings. Without them the weights would be widened to float32 at every call (about 0.1 s
    each at full size), which slows a lone query, so float32 stays. int8 is not chosen for you (its first
    start converts the model: minutes, several GB of memory; it keeps less of the reference's outputs);
    the reason names it where the CPU's int8 dot products (VNNI, AMX-INT8) run it fastest.

        >>> choose_serve_precision(DeviceChoice("cpu", "/CPU:0"), frozenset({"avx512_bf16"})).precision
        'bfloat16'
    """
    if device.kind != "cpu":
        precision = choose_precision("auto", device)
        return ServePrecision(precision, precision, f"{device.kind} GPU: {precision}, as the library chooses")
    int8_hint = (
        "; --precision int8 runs faster on this CPU's int8 dot products (converted once, at first start)"
        if cpu_has_int8_dot(cpu_flags) and backend == "tensorflow"  # int8 is TensorFlow's (TFLite)
        else ""
    )
    if cpu_bf16_pays(backend, cpu_flags):
        native = " and ".join(sorted(cpu_flags & {"amx_bf16", "avx512_bf16"}))
        reason = f"CPU with {native}: bf16 weights and matmuls, faster than float32 in less memory"
        return ServePrecision("bfloat16", "bfloat16", reason + int8_hint)
    if cpu_has_native_bf16(cpu_flags):
        reason = (
            f"{BACKEND_LABELS.get(backend, backend)} on the CPU: float32, the reference's own outputs "
            f"(its bf16 matmuls use no bf16 instructions: {CPU_BF16_SPEEDUP.get(backend, 1.0):.2f}x float32 "
            "on a Zen 5)"
        )
        return ServePrecision("float32", "float32", reason + int8_hint)
    reason = (
        "CPU without bf16 matmuls: float32, the reference's own outputs (--precision bfloat16 holds half the "
        "weights' memory but widens them at every call, slower for a lone query)"
    )
    return ServePrecision("float32", "float32", reason + int8_hint)


def resolve_serve_precision(
    precision: str, device: str, inventory: DeviceInventory | None = None
) -> tuple[str, str | None]:
    """The precision `bgem3 serve` loads: `precision` itself, or for 'auto' the serve choice
    (`choose_serve_precision`) and its reason, said at start-up."""
    if precision != "auto":
        return precision, None
    inventory = inventory or DeviceInventory.detect()
    choice = choose_serve_precision(choose_device(device, inventory), inventory.cpu_flags, inventory.backend)
    return choice.precision, choice.reason
