"""`bgem3 doctor`: versions, devices, CPU features, the device and precision "auto" picks, known problems.

The compatibility rules are data checked by pure functions (`known_problems`), unit-tested without the
platforms they describe.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Annotated

import typer

from bgem3_embeddings.backends.tensorflow.metal import (
    APPLE_DIST,
    METAL_MAX_PYTHON,
    METAL_PYTHON_FIX,
    PLUGIN_DIST,
    PLUGIN_INSTALL_TEXT,
    PLUGIN_LIBRARY,
    PLUGIN_MIN_MACOS,
    PLUGIN_TF,
    is_apple_silicon,
    library_owner,
    metal_pair_problem,
    metal_unavailable_hint,
    plugin_problems,
    read_library_records,
    version_tuple,
)
from bgem3_embeddings.backends.tensorflow.onednn import ONEDNN_ENV, X86_64, onednn_enabled
from bgem3_embeddings.devices import (
    AUTO_CPU_BF16_ENV,
    CPU_BF16_SPEEDUP,
    DeviceInventory,
    auto_cpu_bf16,
    choose_compute_dtype,
    choose_device,
    choose_precision,
    cpu_bf16_pays,
    cpu_has_int8_dot,
    cpu_has_native_bf16,
    keras_device_name,
    resolve_serve_precision,
)
from bgem3_embeddings.install_hint import pip_install

logger = logging.getLogger(__name__)
PACKAGES = (
    "bgem3-embeddings",
    "tensorflow",
    "tensorflow-metal",
    "tensorflow-metal-plugin",
    "tensorflow-macos",
    "keras",
    "jax",
    "jaxlib",
    "numpy",
    "transformers",
    "tokenizers",
    "huggingface-hub",
    "torch",
    "FlagEmbedding",
)
CPU_FEATURES = (
    "avx2",
    "avx512f",
    "avx512_vnni",
    "avx_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
@dataclass(frozen=True)
class Problem:
    severity: str  # "error": will not work; "warning": unverified or slow
    message: str


def installed_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed distribution versions (None when absent), read from metadata: nothing is imported."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def known_problems(
    versions: dict[str, str | None],
    platform_name: str,
    python: tuple[int, int],
    cpu_flags: frozenset[str] = frozenset(),
    gpus: tuple[str, ...] = (),
    environ: dict[str, str] | None = None,
    onednn: bool | None = None,
    macos: tuple[int, ...] = (),
    backend: str = "tensorflow",
) -> list[Problem]:
    """Known-incompatible or unverified combinations for these versions on this platform.

    onednn: whether this process's TensorFlow runs oneDNN kernels (None: unknown); macos: the macOS
    version (() elsewhere or unknown); backend: the Keras backend this process runs (tensorflow, jax, torch).
    The TensorFlow and Metal-plugin rules apply on the TensorFlow backend only.
    """
    if backend != "tensorflow":
        return backend_problems(backend, versions, platform_name, gpus) + cpu_problems(
            cpu_flags, gpus, platform_name, backend
        )
    env = environ or {}
    tf_v = version_tuple(versions.get("tensorflow"))
    metal_v = version_tuple(versions.get(APPLE_DIST))
    plugin_v = versions.get(PLUGIN_DIST)
    keras_v = version_tuple(versions.get("keras"))
    apple = is_apple_silicon(platform_name)
    problems = []
    if versions.get("tensorflow") is None:
        problems.append(Problem("error", "tensorflow is not installed"))
    if keras_v and keras_v < (3,):
        problems.append(Problem("error", f"keras {versions['keras']}: Keras 3 is required"))
    if versions.get("tensorflow-macos") and tf_v >= (2, 13):
        problems.append(
            Problem(
                "warning",
                "tensorflow-macos is installed: since TF 2.13 install plain "
                "'tensorflow' (tensorflow-macos is no longer needed or updated)",
            )
        )
    if metal_v and plugin_v:
        problems.append(
            Problem(
                "error",
                f"{APPLE_DIST} and {PLUGIN_DIST} are both installed: both install {PLUGIN_LIBRARY}, so the "
                "one installed last replaced the other's, and uninstalling either removes the GPU backend; "
                f"keep one: pip uninstall -y {APPLE_DIST} {PLUGIN_DIST}, then install one route "
                "(docs/precision-and-devices.md)",
            )
        )
    for dist in (APPLE_DIST, PLUGIN_DIST):
        if versions.get(dist) and not apple:
            problems.append(
                Problem("warning", f"{dist} is installed on {platform_name}: it only works on macOS arm64")
            )
    if plugin_v and apple:
        reasons = [Problem(*p) for p in plugin_problems(versions.get("tensorflow"), macos, env)]
        problems += reasons
        if not gpus and not reasons:
            problems.append(
                Problem(
                    "warning",
                    f"{PLUGIN_DIST} is installed but TensorFlow sees no GPU: "
                    "`python -c 'import tensorflow'` prints the plugin's reason",
                )
            )
    if metal_v:
        if python > METAL_MAX_PYTHON:
            problems.append(
                Problem(
                    "error",
                    f"tensorflow-metal has no wheels for Python {python[0]}.{python[1]} "
                    f"(cp39-cp312 only): the Metal GPU is unavailable; {METAL_PYTHON_FIX}, or use the "
                    f"community {PLUGIN_DIST} instead: {PLUGIN_INSTALL_TEXT}",
                )
            )
        pair = metal_pair_problem(versions.get("tensorflow"), versions.get(APPLE_DIST))
        if pair:
            problems.append(Problem(*pair))
        if tf_v[:3] == (2, 16, 1):
            problems.append(
                Problem(
                    "warning",
                    "TensorFlow 2.16.1 + Keras 3 on Metal: known GPU breakage; "
                    "use another TensorFlow version",
                )
            )
        if apple and not gpus and python <= METAL_MAX_PYTHON and not plugin_v:
            problems.append(Problem("warning", "tensorflow-metal is installed but TensorFlow sees no GPU"))
    elif apple and not plugin_v:
        hint = metal_unavailable_hint(platform_name, python)
        problems.append(Problem("warning", f"Apple silicon without a Metal backend: CPU only ({hint})"))
    x86 = platform_name.lower().endswith(X86_64)
    if x86 and env.get(ONEDNN_ENV) == "0":
        problems.append(
            Problem(
                "warning",
                "TF_ENABLE_ONEDNN_OPTS=0: oneDNN kernels are off, CPU inference is slower (bf16 much slower)",
            )
        )
    elif x86 and onednn is False:
        problems.append(
            Problem(
                "warning",
                "oneDNN kernels are off in this process (TensorFlow was imported before bgem3_embeddings, "
                "or TF_ENABLE_ONEDNN_OPTS is not 1): fp32 matmuls run about 2x slower on CPUs such as "
                "AVX2-only AMD EPYC; import bgem3_embeddings first or export TF_ENABLE_ONEDNN_OPTS=1",
            )
        )
    return problems + cpu_problems(cpu_flags, gpus, platform_name, backend)


def cpu_problems(
    cpu_flags: frozenset[str], gpus: tuple[str, ...], platform_name: str, backend: str
) -> list[Problem]:
    """What this CPU lacks for bf16 and int8 (int8 runs on the TensorFlow backend only)."""
    problems = []
    x86 = platform_name.lower().endswith(X86_64)
    if cpu_flags and not cpu_has_native_bf16(cpu_flags) and not gpus:
        problems.append(
            Problem(
                "warning",
                "this CPU has no native bf16 (avx512_bf16 / AMX): precision='bfloat16' keeps bf16 weights "
                "(half the memory) but runs the matmuls in float32 (compute_dtype='auto'); "
                "compute_dtype='bfloat16' is emulated here, about 4x slower than float32",
            )
        )
    speedup = CPU_BF16_SPEEDUP
    if backend == "jax" and cpu_has_native_bf16(cpu_flags) and not gpus:
        problems.append(
            Problem(
                "warning",
                "JAX on this CPU: precision='bfloat16' runs slower than float32 (XLA:CPU's bf16 matmuls use "
                f"no bf16 instructions: {speedup['jax']:.2f}x float32 on a Zen 5 with avx512_bf16); keep "
                "float32, or run bf16 on KERAS_BACKEND=tensorflow or torch "
                f"({speedup['tensorflow']:.2f}x and {speedup['torch']:.2f}x their float32 there)",
            )
        )
    if backend == "tensorflow" and x86 and cpu_flags and not cpu_has_int8_dot(cpu_flags):
        problems.append(
            Problem(
                "warning",
                "this CPU has no int8 dot-product instructions (avx512_vnni / avx_vnni / amx_int8): "
                "precision='int8' runs at about float32 speed here (XNNPACK's AVX2 kernels) and still "
                "holds about a third of float32's memory; ONNX Runtime's int8 is faster on such CPUs",
            )
        )
    return problems


def backend_problems(
    backend: str, versions: dict[str, str | None], platform_name: str, gpus: tuple[str, ...]
) -> list[Problem]:
    """What Keras' JAX and PyTorch backends cannot do here, or do with a known bug."""
    apple = is_apple_silicon(platform_name)
    problems = [
        Problem(
            "warning",
            f"Keras runs on {backend}: precision='int8' and `bgem3 export` (TFLite, SavedModel) need the "
            "TensorFlow backend (KERAS_BACKEND=tensorflow)",
        )
    ]
    if versions.get(backend) is None:
        problems.append(Problem("error", f"KERAS_BACKEND={backend} but {backend} is not installed: "
                                         + pip_install(f"bgem3-embeddings[{backend}]")))
    if backend == "jax" and apple:
        problems.append(
            Problem(
                "warning",
                "JAX has no maintained Apple GPU backend (jax-metal is abandoned, jax #26968): CPU only; "
                "KERAS_BACKEND=torch runs on the Apple GPU through PyTorch's MPS",
            )
        )
    if backend == "torch" and apple:
        state = "the encoder is not affected" if gpus else "not in use here (no MPS device)"
        problems.append(
            Problem(
                "warning",
                "keras-team/keras#23700: on MPS, keras.ops.convert_to_tensor of a float64 numpy array fails; "
                f"the encoder hands Keras only int32 ids and float32/16 weights ({state}), your own "
                "keras.ops calls on float64 arrays are",
            )
        )
    return problems


def metal_lines(
    versions: dict[str, str | None],
    gpus: tuple[str, ...],
    recorded: dict[str, str | None],
    on_disk: str | None,
) -> list[str]:
    """Which Metal backend is installed and which one TensorFlow loads (the one whose RECORD hash matches
    tensorflow-plugins/libmetal_plugin.dylib on disk), and whether it offers the GPU."""
    about = {
        APPLE_DIST: "Apple's, binary wheels; documented for TensorFlow 2.18",
        PLUGIN_DIST: (
            f"community, compiled at install; TensorFlow {PLUGIN_TF[0]}.{PLUGIN_TF[1]} only, "
            f"macOS {PLUGIN_MIN_MACOS[0]}+"
        ),
    }
    installed = [dist for dist in (APPLE_DIST, PLUGIN_DIST) if versions.get(dist)]
    if not installed:
        return ["metal backend: none installed (docs/precision-and-devices.md#the-apple-gpu-three-routes)"]
    lines = ["metal backends:"]
    lines += [f"  {dist} {versions[dist]} ({about[dist]})" for dist in installed]
    owner = library_owner(recorded, on_disk)
    if owner is None:
        lines.append(
            f"  active: none: {PLUGIN_LIBRARY} is "
            + ("missing" if on_disk is None else "not the file any installed backend recorded")
            + "; reinstall one backend"
        )
    else:
        lines.append(
            f"  active: {owner} (TensorFlow loads its libmetal_plugin.dylib); "
            + (f"GPU offered: {', '.join(gpus)}" if gpus else "it offers no GPU (see known problems)")
        )
    return lines


def report_lines(
    inventory: DeviceInventory,
    versions: dict[str, str | None],
    library: tuple[dict[str, str | None], str | None] | None = None,
) -> list[str]:
    """Everything the doctor prints, as lines. library: read_library_records()'s answer (read here when
    None and the machine is a Mac on Apple silicon)."""
    py = sys.version_info
    lines = [
        f"python {platform.python_version()} on {inventory.platform} ({platform.platform()})",
        "",
        "packages:",
    ]
    lines += [f"  {name:<24} {version or '-'}" for name, version in versions.items()]
    lines += ["", f"cpu: {_cpu_model()}, {os.cpu_count()} logical CPUs"]
    lines.append(
        "  features: " + ", ".join(f"{f} {'yes' if f in inventory.cpu_flags else 'no'}" for f in CPU_FEATURES)
    )
    lines.append(f"  native bf16 matmul: {'yes' if cpu_has_native_bf16(inventory.cpu_flags) else 'no'}")
    int8_dot = "yes" if cpu_has_int8_dot(inventory.cpu_flags) else "no"
    lines.append(f"  int8 dot products (fast precision='int8'): {int8_dot}")
    tensorflow_backend = inventory.backend == "tensorflow"
    onednn = onednn_enabled() if tensorflow_backend else None  # imports TensorFlow
    if tensorflow_backend:
        state = {True: "on", False: "off", None: "unknown"}[onednn]
        onednn_env = os.environ.get(ONEDNN_ENV, "unset")
        lines.append(f"  oneDNN kernels: {state} (TF_ENABLE_ONEDNN_OPTS={onednn_env})")
    lines += ["", *backend_lines(inventory)]
    lines.append(f"gpus seen by {inventory.backend_label}: " + (", ".join(inventory.gpus) or "none"))
    metal_installed = any(versions.get(d) for d in (APPLE_DIST, PLUGIN_DIST))
    if tensorflow_backend and (inventory.is_apple_silicon or metal_installed):
        if inventory.macos:
            lines.append("macOS " + ".".join(str(v) for v in inventory.macos))
        recorded, on_disk = library if library is not None else read_library_records()
        lines += metal_lines(versions, inventory.gpus, recorded, on_disk)
    lines += auto_lines(inventory)
    lines += attention_lines(inventory)
    lines += projection_lines(inventory)
    device = choose_device("auto", inventory)
    half_compute = {
        half: choose_compute_dtype(half, device, inventory.cpu_flags) for half in ("bfloat16", "float16")
    }
    lines.append(
        "  with half-precision weights, compute_dtype 'auto' runs matmuls in: "
        + ", ".join(f"{half} -> {compute}" for half, compute in half_compute.items())
    )
    problems = known_problems(
        versions,
        inventory.platform,
        (py.major, py.minor),
        inventory.cpu_flags,
        inventory.gpus,
        dict(os.environ),
        onednn,
        inventory.macos,
        inventory.backend,
    )
    lines += ["", "known problems:" if problems else "known problems: none"]
    lines += [f"  [{p.severity}] {p.message}" for p in problems]
    return lines


def backend_lines(inventory: DeviceInventory, environ: dict[str, str] | None = None) -> list[str]:
    """The Keras backend, its version and where the choice came from (docs/backends.md)."""
    env = os.environ if environ is None else environ
    chosen = env.get("KERAS_BACKEND")
    source = f"KERAS_BACKEND={chosen}" if chosen else "~/.keras/keras.json or the default"
    label = f"{inventory.backend} {inventory.backend_version}"
    return [
        f"keras backend: {label} ({inventory.backend_label}; from {source})",
        "  others: KERAS_BACKEND=tensorflow | jax | torch "
        f"({pip_install('bgem3-embeddings[jax]')} or [torch])",
    ]


# Which commands take the library's 'auto' (BGEM3Encoder) and which take serve's (devices.py holds both).
LIBRARY_COMMANDS = "library, bgem3 encode/explain, bgem3-qdrant (incl. mcp, ui), LangChain, LlamaIndex"
SERVE_COMMAND = "bgem3 serve"


def auto_lines(inventory: DeviceInventory, environ: dict[str, str] | None = None) -> list[str]:
    """What --device/--precision/--compute-dtype 'auto' pick, per command: the functions the commands
    themselves call (the encoder's choose_precision, serve's resolve_serve_precision), so they agree."""
    device = choose_device("auto", inventory)
    library = choose_precision("auto", device, cpu_bf16_ok=auto_cpu_bf16(inventory, environ))
    served, reason = resolve_serve_precision("auto", "auto", inventory)
    flags = inventory.cpu_flags
    opt_in = (
        f"; {AUTO_CPU_BF16_ENV}=1 picks bfloat16 on this CPU"
        if device.kind == "cpu" and library == "float32" and cpu_bf16_pays(inventory.backend, flags)
        else ""
    )

    def pick(precision: str) -> str:
        compute = choose_compute_dtype(precision, device, inventory.cpu_flags)
        return f"{precision} weights, {compute} matmuls"

    return [
        f"auto choice: device {device.kind} ({keras_device_name(device, inventory.backend)}); "
        "precision per command:",
        f"  {LIBRARY_COMMANDS}: {pick(library)}{opt_in}",
        f"  {SERVE_COMMAND}: {pick(served)} ({reason})",
    ]


def attention_lines(
    inventory: DeviceInventory, problem_of: Callable[[str, str], str | None] | None = None
) -> list[str]:
    """On JAX with a CUDA GPU: whether half precision runs cuDNN's flash attention here, or why not (the JAX
    runner's own test, `backends.jax.kernels.flash_attention_problem`, which compiles one small call)."""
    device = choose_device("auto", inventory)
    if inventory.backend != "jax" or device.kind != "cuda":
        return []
    # Imported here: they import Keras and JAX, which only this case needs.
    from bgem3_embeddings.backends.jax.kernels import FLASH_DTYPES, flash_attention_problem
    from bgem3_embeddings.backends.portable.chunking import LONG_INPUT_CHUNK

    problem_of = problem_of or flash_attention_problem
    lines = ["attention on JAX (CUDA):"]
    for half in FLASH_DTYPES:
        problem = problem_of("cuda", half)
        flash = f"cuDNN flash attention (right-padded batches up to {LONG_INPUT_CHUNK:,} tokens)"
        how = flash if problem is None else f"XLA, slower: {problem}"
        lines.append(f"  {half}: {how}")
    return lines


def projection_lines(
    inventory: DeviceInventory, problem_of: Callable[[str, str], str | None] | None = None
) -> list[str]:
    """On PyTorch with the CPU: whether float32 projections run as oneDNN's fused linear here, or why not
    (the PyTorch runner's own test, `backends.torch.kernels.onednn_linear_problem`, which runs one small
    call)."""
    device = choose_device("auto", inventory)
    if inventory.backend != "torch" or device.kind != "cpu":
        return []
    from bgem3_embeddings.backends.torch.kernels import onednn_linear_problem  # imports torch: this case only

    problem = (problem_of or onednn_linear_problem)("cpu", "float32")
    how = "oneDNN's fused linear (+ GELU)" if problem is None else f"torch.matmul: {problem}"
    return [f"projections on PyTorch (CPU, float32): {how}"]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def doctor(
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit 1 when an error-level problem is found.")
    ] = False,
) -> None:
    """Versions, devices, CPU features (AMX, avx512_bf16), the auto device/precision and known problems."""
    versions = installed_versions()
    inventory = DeviceInventory.detect()
    lines = report_lines(inventory, versions)
    typer.echo("\n".join(lines))
    if strict and any(line.startswith("  [error]") for line in lines):
        raise typer.Exit(code=1)
