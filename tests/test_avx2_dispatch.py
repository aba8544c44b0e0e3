"""benchmarks/findings/avx2_dispatch hides AVX-512 / VNNI / AMX from CPUID and keeps AVX2 (needs cpuid_fault,
gcc)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "findings" / "avx2_dispatch" / "run.py"


def _load_run():
    spec = importlib.util.spec_from_file_location("avx2_dispatch_run", RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run = _load_run()


def _supported() -> str | None:
    try:
        run.require_support()
    except run.DispatchError as error:
        return str(error)
    return None


needs_support = pytest.mark.skipif(_supported() is not None, reason=f"avx2_dispatch: {_supported()}")


@needs_support
def test_shim_hides_avx512_vnni_amx_and_keeps_avx2(tmp_path: Path) -> None:
    native = run.probe(tmp_path, masked=False)
    masked = run.probe(tmp_path, masked=True)
    if not masked["faulting"]:  # the flag is there but this sandbox refuses arch_prctl(ARCH_SET_CPUID)
        pytest.skip("CPUID faulting refused in this process")
    assert native["faulting"] == 0
    flags = run.cpu_flags()
    # The probe reads CPUID directly: without the shim it agrees with the kernel's flags.
    assert native["avx512f"] == int("avx512f" in flags)
    assert native["avx2"] == int("avx2" in flags)
    assert masked["avx512f"] == masked["avx512_vnni"] == masked["amx_int8"] == masked["avx_vnni"] == 0
    for kept in ("avx", "avx2", "fma"):
        assert masked[kept] == native[kept], kept


@needs_support
def test_command_runs_under_the_shim_and_children_inherit_it(tmp_path: Path) -> None:
    probe = run._compile(run.PROBE_SOURCE, tmp_path / "cpuid_probe", shared=False)
    # A Python child that runs the probe as a grandchild: LD_PRELOAD travels with the environment.
    code = f"import subprocess as s; print(s.run([{str(probe)!r}], capture_output=True, text=True).stdout)"
    # -X faulthandler installs its own SIGSEGV handler (pytest does too): the shim must keep working.
    out = subprocess.run(
        [sys.executable, str(RUN), "--build-dir", str(tmp_path), "--", sys.executable, "-X", "faulthandler",
         "-c", "import numpy; " + code],
        capture_output=True, text=True, check=True,
    ).stdout
    if "faulting 0" in out:
        pytest.skip("CPUID faulting refused in this process")
    assert "avx512f 0" in out and "avx2 " + str(int("avx2" in run.cpu_flags())) in out


@needs_support
def test_a_genuine_crash_still_reaches_faulthandler(tmp_path: Path) -> None:
    crash = "import ctypes; ctypes.string_at(0)"  # reads address 0: SIGSEGV, not a CPUID
    command = [sys.executable, str(RUN), "--build-dir", str(tmp_path), "--", sys.executable, "-X",
               "faulthandler", "-c", crash]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == -11, result  # killed by SIGSEGV, as without the shim
    assert "Fatal Python error: Segmentation fault" in result.stderr


def test_missing_command_is_one_line_and_exit_2(tmp_path: Path) -> None:
    command = [sys.executable, str(RUN), "--build-dir", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("avx2_dispatch: "), result.stderr


def test_environment_puts_the_shim_first_in_ld_preload() -> None:
    env = run.environment_with_shim(Path("/x/cpuid_mask.so"), {"LD_PRELOAD": "/y/other.so", "A": "1"})
    assert env["LD_PRELOAD"] == "/x/cpuid_mask.so /y/other.so" and env["A"] == "1"
    assert run.environment_with_shim(Path("/x/s.so"), {})["LD_PRELOAD"] == "/x/s.so"
    both = {"LD_PRELOAD": "/x/cpuid_mask.so /y/other.so"}
    assert run.environment_without_shim(both) == {"LD_PRELOAD": "/y/other.so"}
    assert run.environment_without_shim({"LD_PRELOAD": "/x/cpuid_mask.so", "A": "1"}) == {"A": "1"}
