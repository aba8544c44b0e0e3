"""Run a command as if on an AVX2-only x86-64 CPU: CPUID hides AVX-512, VNNI, AVX-VNNI and AMX.

    python benchmarks/findings/avx2_dispatch/run.py --check
    python benchmarks/findings/avx2_dispatch/run.py -- \
        bgem3 bench --model CKPT --engine keras --engine onnxruntime ...

oneDNN (TensorFlow), XNNPACK (TFLite), MLAS (ONNX Runtime) and torch choose their kernels from CPUID at
run time, so under this wrapper they run the AVX2 kernels an AVX2-only CPU (AMD EPYC Zen 2/3, older
Xeons) would run. That lets an AVX-512 machine measure the AVX2 code paths side by side with the other
engines. The cores are still this machine's: the figures show how the AVX2 kernels compare, not what an
AMD EPYC would measure. Needs Linux, gcc and CPUID faulting ("cpuid_fault" in /proc/cpuinfo); the
shim (cpuid_mask.c) is compiled once into --build-dir. /proc/cpuinfo itself is the kernel's and does not
change: bgem3's own choices that read it (compute_dtype="auto" for bfloat16, `bgem3 doctor`) still see the
real CPU, so benchmark bfloat16 under the shim with an explicit compute dtype ("bfloat16:float32").
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIM_SOURCE = HERE / "cpuid_mask.c"
PROBE_SOURCE = HERE / "cpuid_probe.c"
DEFAULT_BUILD_DIR = Path.home() / ".cache" / "bgem3_embeddings" / "avx2_dispatch"


class DispatchError(RuntimeError):
    """This machine cannot run the wrapper (the message says why)."""


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The kernel's view of the CPU flags (not affected by the shim).

    Not bgem3_embeddings.devices.read_cpu_flags: importing the package sets TF_ENABLE_ONEDNN_OPTS in this
    process's environment (bgem3_embeddings/backends/tensorflow/onednn.py), which the wrapped command would
    then inherit.
    """
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def require_support() -> None:
    """Raise DispatchError unless CPUID faulting and a C compiler are available."""
    if not sys.platform.startswith("linux") or os.uname().machine != "x86_64":
        raise DispatchError(f"needs Linux on x86-64, this is {sys.platform} {os.uname().machine}")
    if "cpuid_fault" not in cpu_flags():
        raise DispatchError("no CPUID faulting on this CPU or hypervisor (no cpuid_fault in /proc/cpuinfo)")
    if shutil.which("gcc") is None:
        raise DispatchError("gcc not found: it compiles the CPUID shim (apt install gcc)")


def _compile(source: Path, target: Path, shared: bool) -> Path:
    """gcc `source` into `target` unless `target` is newer; returns `target`."""
    if target.is_file() and target.stat().st_mtime >= source.stat().st_mtime:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    flags = ["-shared", "-fPIC"] if shared else []
    tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
    command = ["gcc", "-O2", *flags, "-o", str(tmp), str(source)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise DispatchError(f"gcc failed on {source.name}: {result.stderr.strip().splitlines()[-1]}")
    os.replace(tmp, target)
    return target


def build_shim(build_dir: Path = DEFAULT_BUILD_DIR) -> Path:
    """Path of the compiled shim (compiled on first use)."""
    return _compile(SHIM_SOURCE, build_dir / "cpuid_mask.so", shared=True)


def environment_with_shim(shim: Path, environ: dict[str, str] | None = None) -> dict[str, str]:
    """`environ` with the shim first in LD_PRELOAD (inherited by the command's child processes)."""
    env = dict(os.environ if environ is None else environ)
    env["LD_PRELOAD"] = " ".join(p for p in (str(shim), env.get("LD_PRELOAD", "")) if p)
    return env


def environment_without_shim(environ: dict[str, str] | None = None) -> dict[str, str]:
    """`environ` with any CPUID shim dropped from LD_PRELOAD (for a native run inside a masked one)."""
    env = dict(os.environ if environ is None else environ)
    kept = [p for p in env.get("LD_PRELOAD", "").split() if Path(p).name != "cpuid_mask.so"]
    if kept:
        env["LD_PRELOAD"] = " ".join(kept)
    else:
        env.pop("LD_PRELOAD", None)
    return env


def probe(build_dir: Path = DEFAULT_BUILD_DIR, masked: bool = True) -> dict[str, int]:
    """CPUID as a program sees it, with or without the shim: {"avx2": 1, "avx512f": 0, ...}."""
    program = _compile(PROBE_SOURCE, build_dir / "cpuid_probe", shared=False)
    env = environment_with_shim(build_shim(build_dir)) if masked else environment_without_shim()
    out = subprocess.run([str(program)], capture_output=True, text=True, env=env, check=True).stdout
    return {name: int(value) for name, value in (line.split() for line in out.splitlines())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD_DIR, help="where the shim is built")
    parser.add_argument("--check", action="store_true", help="print CPUID features with and without the shim")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        require_support()
        if args.check:
            native, masked = probe(args.build_dir, masked=False), probe(args.build_dir, masked=True)
            for name in native:
                print(f"{name:12s} native {native[name]}  under the shim {masked[name]}")
            if not masked["faulting"]:
                raise DispatchError("the kernel refused CPUID faulting here (seccomp or hypervisor)")
            if masked["avx512f"] or masked["avx512_vnni"] or masked["amx_int8"] or masked["avx_vnni"]:
                raise DispatchError("the shim did not hide the AVX-512 / VNNI / AMX features")
            return 0
        if not command:
            raise DispatchError("no command given: run.py -- COMMAND [ARGS...]")
        env = environment_with_shim(build_shim(args.build_dir))
    except DispatchError as error:
        print(f"avx2_dispatch: {error}", file=sys.stderr)
        return 2
    try:
        os.execvpe(command[0], command, env)  # replaces this process; returns only on failure
    except OSError as error:
        print(f"avx2_dispatch: cannot run {command[0]!r}: {error.strerror}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main())
