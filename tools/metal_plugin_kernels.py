"""Regenerate tests/data/metal_plugin_kernels.json: what tensorflow-metal-plugin registers, from its sdist.

    python tools/metal_plugin_kernels.py               # pip downloads the newest sdist from PyPI
    python tools/metal_plugin_kernels.py --sdist FILE  # a tensorflow_metal_plugin-X.Y.Z.tar.gz already here

The plugin registers its kernels when TensorFlow loads it (`RegisterAllMetalKernels`, through TensorFlow's
kernel C API), in C++ that builds op names and dtypes in loops over tables. Rather than parse that, this
script compiles exactly those functions (every `Register*` function of `src/.../metal/kernels/*.mm`, their
function-pointer arguments replaced by nullptr: nothing Objective-C or Metal is compiled) against the
installed TensorFlow's own C headers and a stub of the kernel-builder calls that records each
registration, runs the program, and writes what it recorded. Needs a C++17 compiler (g++ or clang++) and
TensorFlow installed; the file names the plugin version, the sdist's sha256 and the TensorFlow it read.

Part of the plugin registers only where TensorFlow exports the kernel C API for resource variables
(`ResourceVariableApiAvailable`, a dlsym check): released TensorFlow 2.20 and 2.21 do not (the plugin's
README). The script looks for those symbols in the installed TensorFlow's libraries and compiles the
check's answer in.

The same file records TensorFlow's own DEVICE_DEFAULT kernels from the installed TensorFlow's registry:
what a PluggableDevice runs without registering anything (Identity, Reshape, ReadVariableOp, While, and
int32 arithmetic kept in host memory). tests/test_metal_ops.py checks our graphs against both lists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "tests" / "data" / "metal_plugin_kernels.json"
PACKAGE = "tensorflow-metal-plugin"
KERNEL_DIR = "src/tensorflow/core/common_runtime/metal/kernels"
# The plugin registers these only when the installed TensorFlow exports them (metal_kernel_util.mm).
RESOURCE_VARIABLE_SYMBOLS = (
    "TF_AssignRefVariable",
    "TF_GetInputTensorFromVariable",
    "TF_MaybeLockVariableInputMutexesInOrder",
    "TF_ReleaseVariableInputLockHolder",
    "TF_OpKernelConstruction_GetAttrTensorShape",
    "TF_OpKernelContext_ForwardRefInputToRefOutput",
)

# Records what the plugin's Register* functions would hand to TensorFlow. One line per registration:
# REG <tab> kernel name <tab> op <tab> attr=dtype,... <tab> host-memory args (comma-separated).
STUB_API = r"""
#include <cstdio>
#include <string>
#include <utility>
#include <vector>
#include "tensorflow/c/kernels.h"
#include "tensorflow/c/tf_status.h"

struct TSL_Status { TF_Code code = TF_OK; std::string message; };  // TF_Status is a typedef of it
struct TF_KernelBuilder {
  std::string op;
  std::vector<std::pair<std::string, int>> constraints;
  std::vector<std::string> host_memory;
};

extern "C" {
TF_Status* TF_NewStatus(void) { return new TF_Status(); }
void TF_DeleteStatus(TF_Status* s) { delete s; }
void TF_SetStatus(TF_Status* s, TF_Code code, const char* msg) { s->code = code; s->message = msg; }
TF_Code TF_GetCode(const TF_Status* s) { return s->code; }
const char* TF_Message(const TF_Status* s) { return s->message.c_str(); }
TF_KernelBuilder* TF_NewKernelBuilder(const char* op_name, const char* device_name,
                                      void* (*)(TF_OpKernelConstruction*),
                                      void (*)(void*, TF_OpKernelContext*), void (*)(void*)) {
  if (std::string(device_name) != "GPU") std::fprintf(stderr, "unexpected device %s\n", device_name);
  auto* b = new TF_KernelBuilder();
  b->op = op_name;
  return b;
}
void TF_KernelBuilder_TypeConstraint(TF_KernelBuilder* b, const char* attr, TF_DataType type, TF_Status*) {
  b->constraints.emplace_back(attr, static_cast<int>(type));
}
void TF_KernelBuilder_HostMemory(TF_KernelBuilder* b, const char* arg) { b->host_memory.push_back(arg); }
void TF_DeleteKernelBuilder(TF_KernelBuilder* b) { delete b; }
void TF_RegisterKernelBuilder(const char* name, TF_KernelBuilder* b, TF_Status* s) {
  std::printf("REG\t%s\t%s\t", name, b->op.c_str());
  for (size_t i = 0; i < b->constraints.size(); ++i)
    std::printf("%s%s=%d", i ? "," : "", b->constraints[i].first.c_str(), b->constraints[i].second);
  std::printf("\t");
  for (size_t i = 0; i < b->host_memory.size(); ++i)
    std::printf("%s%s", i ? "," : "", b->host_memory[i].c_str());
  std::printf("\n");
  s->code = TF_OK;
  delete b;
}
}

namespace tensorflow { namespace metal {
void RegisterAllMetalKernels();
bool ResourceVariableApiAvailable() { return RESOURCE_VARIABLE_API; }
} }

int main() { tensorflow::metal::RegisterAllMetalKernels(); return 0; }
"""

# What every extracted translation unit sees in place of the plugin's headers.
PRELUDE = r"""
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>
#include "tensorflow/c/kernels.h"
#include "tensorflow/c/tf_status.h"
#define LOG(severity) std::cerr
namespace tensorflow { namespace metal {
inline constexpr char kMetalDeviceType[] = "GPU";
bool ResourceVariableApiAvailable();
DECLARATIONS
} }
"""

REGISTER_FUNCTION = re.compile(r"^(?:static\s+)?(?:inline\s+)?void\s+(Register\w*)\s*\(", re.M)
# `&Name` or `&Name<...>` used as a value: the address of a create/compute/delete function. Parameter
# declarations (`const std::string& name`) and `&&` do not match: the name must start upper-case and the
# `&` must not follow an identifier character.
FUNCTION_POINTER = re.compile(r"(?<![\w&])&(?!&)\s*([A-Z]\w*)(\s*<[^<>;()]*>)?")


class RegenerateError(RuntimeError):
    """The sdist could not be read or compiled: names the step and what to do."""


def strip_comments(source: str) -> str:
    """C++ source without comments (string and character literals kept intact)."""
    out: list[str] = []
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c in "\"'":
            j = i + 1
            while j < n and source[j] != c:
                j += 2 if source[j] == "\\" else 1
            out.append(source[i : j + 1])
            i = j + 1
        elif source.startswith("//", i):
            i = source.find("\n", i)
            i = n if i < 0 else i
        elif source.startswith("/*", i):
            end = source.find("*/", i + 2)
            i = n if end < 0 else end + 2
            out.append(" ")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def function_at(source: str, start: int) -> str:
    """The function definition beginning at `start`, through its matching closing brace."""
    # The body opens after the parameter list, whose default arguments may hold braces ({"T"}).
    depth, i = 0, source.index("(", start)
    while True:
        depth += {"(": 1, ")": -1}.get(source[i], 0)
        if depth == 0:
            break
        i += 1
    depth, i = 0, source.index("{", i)
    while True:
        c = source[i]
        if c in "\"'":  # skip literals, which may hold braces
            j = i + 1
            while source[j] != c:
                j += 2 if source[j] == "\\" else 1
            i = j
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return source[start : i + 1]
        i += 1


def registration_unit(source: str) -> tuple[str, list[str]]:
    """The Register* functions of one kernels/*.mm file as C++ (helpers in an anonymous namespace), and
    the names of its public RegisterMetal* functions."""
    text = strip_comments(source)
    helpers, public = [], []
    names = []
    for match in REGISTER_FUNCTION.finditer(text):
        body = FUNCTION_POINTER.sub("nullptr", function_at(text, match.start()))
        if match.group(1).startswith(("RegisterMetal", "RegisterAll")):
            public.append(body)
            names.append(match.group(1))
        else:
            helpers.append(body)
    unit = "namespace tensorflow { namespace metal {\nnamespace {\n" + "\n".join(helpers) + "\n}\n"
    unit += "\n".join(public) + "\n} }\n"
    return unit, names


def compile_and_run(kernel_dir: Path, include: str, resource_api: bool, work: Path) -> list[str]:
    """Compile every registration unit with the recording stub; return the program's REG lines."""
    compiler = shutil.which(os.environ.get("CXX", "")) or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        raise RegenerateError("no C++ compiler found: install g++ or clang++, or set CXX")
    units, declared = [], []
    for path in sorted(kernel_dir.glob("*.mm")):
        unit, names = registration_unit(path.read_text(encoding="utf-8"))
        if "Register" in unit:
            units.append((path.stem, unit))
            declared += names
    if "RegisterAllMetalKernels" not in declared:
        raise RegenerateError(
            f"RegisterAllMetalKernels not found under {kernel_dir}: not the expected layout"
        )
    prelude = PRELUDE.replace("DECLARATIONS", "\n".join(f"void {name}();" for name in declared))
    (work / "prelude.h").write_text(prelude, encoding="utf-8")
    sources = []
    for stem, unit in units:
        path = work / f"{stem}.cc"
        path.write_text('#include "prelude.h"\n' + unit, encoding="utf-8")
        sources.append(str(path))
    stub = work / "stub_api.cc"
    stub.write_text(STUB_API.replace("RESOURCE_VARIABLE_API", "true" if resource_api else "false"))
    binary = work / "registrations"
    command = [
        compiler,
        "-std=c++17",
        "-w",
        f"-I{include}",
        f"-I{work}",
        *sources,
        str(stub),
        "-o",
        str(binary),
    ]
    build = subprocess.run(command, capture_output=True, text=True)
    if build.returncode != 0:
        raise RegenerateError(f"compiling the plugin's registration code failed:\n{build.stderr[-4000:]}")
    run = subprocess.run([str(binary)], capture_output=True, text=True, check=True)
    return [line for line in run.stdout.splitlines() if line.startswith("REG\t")]


def parse_registrations(lines: list[str], dtype_name: Any) -> list[dict[str, Any]]:
    """REG lines -> [{"kernel", "op", "constraints": [[attr, dtype]], "host_memory": [...]}], sorted."""
    kernels = []
    for line in lines:
        _, name, op, constraints, host = line.split("\t")
        pairs = [c.split("=") for c in constraints.split(",") if c]
        kernels.append(
            {
                "kernel": name,
                "op": op,
                "constraints": [[attr, dtype_name(int(value))] for attr, value in pairs],
                "host_memory": [h for h in host.split(",") if h],
            }
        )
    return sorted(kernels, key=lambda k: (k["op"], k["kernel"]))


def tensorflow_default_kernels() -> list[dict[str, Any]]:
    """The installed TensorFlow's DEVICE_DEFAULT registrations (any non-CPU device gets them)."""
    import tensorflow as tf
    from tensorflow.python.framework import kernels

    found = []
    for kernel in kernels.get_all_registered_kernels().kernel:
        if kernel.device_type != "DEFAULT":
            continue
        constraints = [
            [c.name, sorted(tf.dtypes.as_dtype(t).name for t in c.allowed_values.list.type)]
            for c in kernel.constraint
        ]
        found.append(
            {"op": kernel.op, "constraints": constraints, "host_memory": sorted(kernel.host_memory_arg)}
        )
    return sorted(found, key=lambda k: (k["op"], json.dumps(k["constraints"])))


def resource_variable_api(tf_lib: str) -> bool:
    """Whether any of the installed TensorFlow's shared libraries exports all six resource-variable symbols
    (what the plugin's dlsym check asks)."""
    nm = shutil.which("nm")
    if nm is None:
        raise RegenerateError("`nm` (binutils) is needed to read TensorFlow's exported symbols")
    exported: set[str] = set()
    for path in Path(tf_lib).rglob("*.so*"):
        out = subprocess.run([nm, "-D", "--defined-only", str(path)], capture_output=True, text=True)
        exported |= {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}
    return all(name in exported for name in RESOURCE_VARIABLE_SYMBOLS)


def download_sdist(dest: Path) -> Path:
    """`pip download --no-deps --no-binary :all: tensorflow-metal-plugin` into dest; the .tar.gz path."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "-d",
        str(dest),
        PACKAGE,
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    found = sorted(dest.glob("tensorflow_metal_plugin-*.tar.gz"))
    if result.returncode != 0 or not found:
        raise RegenerateError(f"pip could not download the {PACKAGE} sdist:\n{result.stderr[-2000:]}")
    return found[-1]


def read_sdist(sdist: Path, work: Path) -> tuple[Path, str, str]:
    """Extract the sdist; (its root, the plugin version from PKG-INFO, the pinned TensorFlow)."""
    with tarfile.open(sdist) as archive:
        archive.extractall(work, filter="data")
    roots = [p for p in work.iterdir() if p.is_dir() and (p / "PKG-INFO").exists()]
    if len(roots) != 1:
        raise RegenerateError(f"{sdist}: expected one package folder with PKG-INFO")
    root = roots[0]
    info = (root / "PKG-INFO").read_text(encoding="utf-8")
    name = re.search(r"^Name: (.+)$", info, re.M)
    version = re.search(r"^Version: (.+)$", info, re.M)
    if name is None or version is None or name.group(1).strip() != PACKAGE:
        raise RegenerateError(f"{sdist}: not a {PACKAGE} sdist")
    pin = (root / "TF_SUPPORTED_VERSION").read_text(encoding="utf-8").strip()
    return root, version.group(1).strip(), pin


def dump(value: Any, indent: str = "") -> str:
    """JSON with one kernel per line: readable, and a regeneration's diff shows what changed."""
    if isinstance(value, dict) and any(isinstance(v, (dict, list)) for v in value.values()):
        inner = indent + " "
        items = [f"{inner}{json.dumps(k)}: {dump(v, inner).strip()}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}" + ("" if indent else "\n")
    if isinstance(value, list) and value and isinstance(value[0], dict):
        inner = indent + " "
        return "[\n" + ",\n".join(inner + json.dumps(v) for v in value) + "\n" + indent + "]"
    return json.dumps(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", type=Path, help="a downloaded tensorflow_metal_plugin-*.tar.gz")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)

    import tensorflow as tf

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sdist = args.sdist or download_sdist(work / "download")
        digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
        root, version, pin = read_sdist(sdist, work / "src")
        resource_api = resource_variable_api(tf.sysconfig.get_lib())
        build = work / "build"
        build.mkdir()
        lines = compile_and_run(root / KERNEL_DIR, tf.sysconfig.get_include(), resource_api, build)
    registrations = parse_registrations(lines, lambda value: tf.dtypes.as_dtype(value).name)
    ops = len({k["op"] for k in registrations})
    defaults = tensorflow_default_kernels()
    result: dict[str, Any] = {
        "generated_by": "tools/metal_plugin_kernels.py",
        "plugin": {
            "name": PACKAGE,
            "version": version,
            "sdist": sdist.name,
            "sdist_sha256": digest,
            "tensorflow_pin": pin,
            "resource_variable_api": resource_api,
            "ops": ops,
            "kernels": registrations,
        },
        "tensorflow_default": {
            "version": tf.__version__,
            "kernels": defaults,
        },
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(dump(result), encoding="utf-8")
    print(
        f"wrote {args.output}: {PACKAGE} {version} (TensorFlow pin {pin}), {len(registrations)} kernels for "
        f"{ops} ops (resource-variable C API {'present' if resource_api else 'absent'}); "
        f"{len(defaults)} DEVICE_DEFAULT kernels of TensorFlow {tf.__version__}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
