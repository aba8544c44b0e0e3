"""The two Metal backends for TensorFlow on Apple silicon, the TensorFlow each needs, what to tell a user.

- Apple's **tensorflow-metal** (binary wheels, macOS arm64, CPython 3.9-3.12, last release 1.2.0 of
  January 2025): Apple documents 1.2 for TensorFlow 2.18 (1.1.0 with TF 2.18 fails at import with "Symbol
  not found"). The `metal` extra in pyproject.toml installs exactly that pair.
- The community **tensorflow-metal-plugin** (PyPI, Apache-2.0, alpha; the out-of-tree form of
  tensorflow/tensorflow PR #126384): an sdist compiled at install against the installed TensorFlow, pinned to
  one TensorFlow minor (2.21 for 0.4.x), macOS 15 or later. It declines to load into another TensorFlow
  unless TF_METAL_SKIP_VERSION_CHECK is set, and TF_DISABLE_METAL keeps it from offering a GPU. The
  `metal-plugin` extra pins the pair; it installs in two commands (TensorFlow first, then the plugin).

Both register the GPU as `/physical_device:GPU:0` and install their backend as the same file,
`site-packages/tensorflow-plugins/libmetal_plugin.dylib`: with both installed, the one installed last
replaced the other's, and uninstalling either removes the backend. This module holds these facts for
`bgem3 doctor` and for the error when device="metal" cannot be served, and the one graph option the
Metal route sets (`remapper_off`: no fused MatMul + activation kernels, docs/precision-and-devices.md).
Besides that option, pure functions on version strings, so they are tested without a Mac:

    >>> metal_pair_problem("2.21.0", "1.1.0")[0]
    'error'
    >>> metal_pair_problem("2.18.1", "1.2.0") is None
    True
    >>> plugin_problems("2.20.0", (15, 1), {})[0][0]
    'error'
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path

from bgem3_embeddings.install_hint import pip_install

# The pair Apple documents: TensorFlow 2.18.x with tensorflow-metal >= 1.2 (keep in step with the
# `metal` extra in pyproject.toml; tests/test_metal_extra.py checks the extra).
METAL_DOCUMENTED_TF = (2, 18)
METAL_MIN_PLUGIN = (1, 2)
# tensorflow-metal's wheels are cp39-cp312: no Python 3.13 wheels.
METAL_MAX_PYTHON = (3, 12)
METAL_FIX_COMMAND = pip_install("tensorflow==2.18.*", "tensorflow-metal>=1.2")
METAL_EXTRA_COMMAND = pip_install("bgem3-embeddings[metal]")
METAL_PYTHON_FIX = f"create the environment with Python 3.11 or 3.12, then {METAL_EXTRA_COMMAND}"

APPLE_DIST = "tensorflow-metal"
PLUGIN_DIST = "tensorflow-metal-plugin"
# Both distributions install their backend under this name (TensorFlow loads every library in the folder).
PLUGIN_LIBRARY = "tensorflow-plugins/libmetal_plugin.dylib"
# tensorflow-metal-plugin 0.4.x: TF_SUPPORTED_VERSION 2.21.0 (the plugin declines any other major.minor) and
# macOS 15 (its deployment target: dyld will not load it on older macOS). Keep in step with the
# `metal-plugin` extra and tests/data/metal_plugin_kernels.json (tests/test_metal_extra.py checks both).
PLUGIN_TF = (2, 21)
PLUGIN_MIN_MACOS = (15, 0)
PLUGIN_INSTALL = (pip_install("tensorflow==2.21.*"), pip_install("bgem3-embeddings[metal-plugin]"))
PLUGIN_INSTALL_TEXT = f"{PLUGIN_INSTALL[0]}, then {PLUGIN_INSTALL[1]} (two commands: it compiles at install)"
# What the plugin itself tells a user whose TensorFlow changed under it.
PLUGIN_REBUILD = pip_install("--force-reinstall", "--no-build-isolation", "tensorflow-metal-plugin")
DISABLE_ENV = "TF_DISABLE_METAL"
SKIP_VERSION_CHECK_ENV = "TF_METAL_SKIP_VERSION_CHECK"


def version_tuple(version: str | None) -> tuple[int, ...]:
    """Leading numeric parts of a version string: '2.18.0rc1' -> (2, 18, 0); None or '' -> ()."""
    parts = []
    for piece in (version or "").split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def is_apple_silicon(platform_name: str) -> bool:
    """True for 'Darwin-arm64' (platform.system()-platform.machine())."""
    return platform_name.lower() == "darwin-arm64"


def metal_pair_problem(tensorflow: str | None, plugin: str | None) -> tuple[str, str] | None:
    """(severity, message) when this tensorflow / tensorflow-metal pair is not Apple's documented one.

    "error": known to fail (a plugin older than 1.2 with TF >= 2.18); "warning": unverified (TF newer
    than 2.18 with plugin 1.2). Each message names the pair and the command that installs the right one.
    """
    tf_v, plugin_v = version_tuple(tensorflow), version_tuple(plugin)
    if not tf_v or not plugin_v:
        return None
    pair = f"TensorFlow {tensorflow} with tensorflow-metal {plugin}"
    fix = f"fix: {METAL_FIX_COMMAND}"
    if plugin_v[:2] < METAL_MIN_PLUGIN and tf_v[:2] >= METAL_DOCUMENTED_TF:
        return (
            "error",
            f"{pair}: mismatched pair; tensorflow-metal before 1.2 is built for older TensorFlow "
            f"(1.1.0 with TF 2.18 fails at import: 'Symbol not found'); {fix}",
        )
    if tf_v[:2] != METAL_DOCUMENTED_TF:
        other_route = ""
        if tf_v[:2] == PLUGIN_TF:
            other_route = (
                f", or keep TensorFlow {tensorflow} with the community {PLUGIN_DIST} instead "
                f"(pip uninstall tensorflow-metal first)"
            )
        return (
            "warning",
            f"{pair}: Apple documents tensorflow-metal {METAL_MIN_PLUGIN[0]}.{METAL_MIN_PLUGIN[1]} for "
            f"TF {METAL_DOCUMENTED_TF[0]}.{METAL_DOCUMENTED_TF[1]} only; this pair is unverified (if the GPU "
            f"fails, use device='cpu'); {fix}{other_route}",
        )
    return None


def env_flag(environ: Mapping[str, str], name: str) -> bool:
    """A variable as the plugin reads it: set, non-empty and not "0"."""
    value = environ.get(name, "")
    return value not in ("", "0")


def _version_text(version: tuple[int, ...]) -> str:
    return ".".join(str(v) for v in version)


def plugin_problems(
    tensorflow: str | None, macos: tuple[int, ...], environ: Mapping[str, str]
) -> list[tuple[str, str]]:
    """(severity, message) for tensorflow-metal-plugin with this TensorFlow, macOS version (() when unknown)
    and environment: what keeps it from offering the GPU, each with its fix."""
    problems = []
    pin = _version_text(PLUGIN_TF)
    if macos and macos[:2] < PLUGIN_MIN_MACOS:
        problems.append((
            "error",
            f"{PLUGIN_DIST} needs macOS {_version_text(PLUGIN_MIN_MACOS)} or later (this is macOS "
            f"{_version_text(macos)}): it will not load here; use device='cpu', or Apple's route "
            f"({METAL_EXTRA_COMMAND}, TensorFlow 2.18, Python <= 3.12)",
        ))
    tf_v = version_tuple(tensorflow)
    if tf_v and tf_v[:2] != PLUGIN_TF:
        if env_flag(environ, SKIP_VERSION_CHECK_ENV):
            problems.append((
                "warning",
                f"{PLUGIN_DIST} is built for TensorFlow {pin} and loaded into TensorFlow {tensorflow} "
                f"because {SKIP_VERSION_CHECK_ENV} is set: its C structs are matched by size, so expect "
                f"crashes or wrong numbers; unset it and install TensorFlow {pin}: {PLUGIN_INSTALL[0]}, "
                f"then {PLUGIN_REBUILD}",
            ))
        else:
            problems.append((
                "error",
                f"{PLUGIN_DIST} is built for TensorFlow {pin} and declines to load into TensorFlow "
                f"{tensorflow}: no GPU; fix: {PLUGIN_INSTALL[0]}, then {PLUGIN_REBUILD}",
            ))
    if env_flag(environ, DISABLE_ENV):
        problems.append((
            "warning",
            f"{DISABLE_ENV}={environ[DISABLE_ENV]}: {PLUGIN_DIST} offers no GPU (TensorFlow runs on the "
            "CPU); unset it to use the Apple GPU",
        ))
    return problems


def record_sha256(data: bytes) -> str:
    """A file's hash as a wheel's RECORD writes it: urlsafe base64 of the sha256, unpadded."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


def library_owner(recorded: Mapping[str, str | None], on_disk: str | None) -> str | None:
    """Which distribution's RECORD hash of libmetal_plugin.dylib matches the file TensorFlow will load.

    recorded: distribution -> the hash its RECORD lists (None: not listed); on_disk: the file's hash (None:
    no file). None when no record matches (no file, or a copy none of them installed).
    """
    if on_disk is None:
        return None
    owners = [dist for dist, digest in recorded.items() if digest == on_disk]
    return owners[0] if len(owners) == 1 else None


def read_library_records() -> tuple[dict[str, str | None], str | None]:
    """For each installed Metal backend, the hash its RECORD lists for libmetal_plugin.dylib, and the hash
    of that file as it is on disk now (None if absent). Reads metadata and one file; imports nothing."""
    from importlib import metadata

    recorded: dict[str, str | None] = {}
    location: Path | None = None
    for dist_name in (APPLE_DIST, PLUGIN_DIST):
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            continue
        recorded[dist_name] = None
        for entry in dist.files or ():
            if entry.as_posix() == PLUGIN_LIBRARY:
                sha256 = entry.hash is not None and entry.hash.mode == "sha256"
                recorded[dist_name] = entry.hash.value if sha256 and entry.hash is not None else None
                location = Path(str(entry.locate()))
    on_disk = record_sha256(location.read_bytes()) if location is not None and location.is_file() else None
    return recorded, on_disk


def metal_unavailable_hint(
    platform_name: str,
    python: tuple[int, int],
    *,
    installed: Mapping[str, str | None] | None = None,
    tensorflow: str | None = None,
    macos: tuple[int, ...] = (),
    environ: Mapping[str, str] | None = None,
) -> str:
    """Why the Metal GPU is not there and what to do, for this platform, Python, installed backends
    (distribution -> version), TensorFlow, macOS version and environment."""
    if not is_apple_silicon(platform_name):
        return f"the Metal GPU needs macOS on Apple silicon (arm64); this is {platform_name or 'unknown'}"
    installed = {name: v for name, v in (installed or {}).items() if v}
    if PLUGIN_DIST in installed:
        reasons = plugin_problems(tensorflow, macos, environ or {})
        if reasons:
            return reasons[0][1]
        return f"{PLUGIN_DIST} is installed but offers no GPU: `python -c 'import tensorflow'` prints why"
    plugin_route = (
        f"the community {PLUGIN_DIST} (TensorFlow {_version_text(PLUGIN_TF)}, macOS 15+): "
        f"{PLUGIN_INSTALL_TEXT}"
    )
    if python > METAL_MAX_PYTHON:
        return (
            f"Apple's tensorflow-metal has wheels for CPython 3.9-3.12 only (this is Python "
            f"{python[0]}.{python[1]}): Metal needs Python <= {METAL_MAX_PYTHON[0]}.{METAL_MAX_PYTHON[1]} "
            f"with it ({METAL_PYTHON_FIX}), or {plugin_route}"
        )
    return f"install the 'metal' extra: {METAL_EXTRA_COMMAND} (Apple's, TensorFlow 2.18), or {plugin_route}"


@contextlib.contextmanager
def remapper_off() -> Iterator[None]:
    """tf.function calls made by this thread inside the block run a graph optimised with grappler's
    remapper off: no MatMul + BiasAdd + activation is fused into one `_FusedMatMul`.

    Why: tensorflow-metal's fused MatMul + BiasAdd + Relu kernel is reported to give wrong results in graph
    mode, and tensorflow-metal-plugin registers `_FusedMatMul` with Relu and GeluExact, which TensorFlow's
    remapper emits for a GPU node wherever it allows MatMul fusions (today it gates them on
    TF_USE_CUBLASLT). The TensorFlow runner wraps its calls in this on the Metal route only: the CPU keeps
    oneDNN's fused MatMul + BiasAdd + GELU. The plugins' own graph passes are not switched off by it: our
    graphs hold no MatMul -> BiasAdd -> Relu chain for them to fold (metal_ops.plugin_activation_chains).

    Thread-local: the options ride on each function call (its `config_proto` attribute) and a function is
    optimised once per distinct config, so other threads and other functions keep the process's options
    (tf.config.optimizer.set_experimental_options would change them for the whole process). Uses
    TensorFlow's eager context, which has no public per-call form; tests/test_metal_fusion.py checks the
    optimised graph, so a TensorFlow that changes it fails there.
    """
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
    from tensorflow.python.eager import context

    ctx = context.context()
    saved = ctx.function_call_options
    config = config_pb2.ConfigProto.FromString(saved.config_proto_serialized)
    config.graph_options.rewrite_options.remapping = rewriter_config_pb2.RewriterConfig.OFF
    ctx.function_call_options = context.FunctionCallOptions(
        executor_type=saved.executor_type, config_proto=config
    )
    try:
        yield
    finally:
        ctx.function_call_options = saved
