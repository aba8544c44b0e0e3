"""No import circle in any package (the core and the three integrations), type-checking imports included;
and the core's backends entered in one direction.

A module importing one that imports it back (even inside a function, or only for type checking) hides
which step depends on which; docs/architecture.md shows each package's layout as a one-way flow.

The backends (`bgem3_embeddings/backends/`): outside code -> `backends` (the choice, its `__init__`) -> a room
(`tensorflow`, `jax`, `torch`) -> `portable`. No module under backends/ imports the choice; no room imports
another room; `portable` imports nothing of the package but `portable` and `keras_backend` (a leaf). At run
time (type-checking imports left out) nothing a room imports leads, through the rest of the package, back
to the choice or into another room, but for the one route named in `RUNTIME_EXCEPTIONS`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [
    ROOT / "bgem3_embeddings",
    ROOT / "integrations/qdrant/bgem3_qdrant",
    ROOT / "integrations/langchain/langchain_bgem3",
    ROOT / "integrations/llama-index/llama_index/embeddings/bgem3",
]


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside `if TYPE_CHECKING:` blocks."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for statement in node.body:
                inside.update(id(n) for n in ast.walk(statement))
    return inside


def import_graph(package: Path, runtime_only: bool = False) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports: absolute, relative, inside functions and
    under TYPE_CHECKING alike (`runtime_only`: TYPE_CHECKING imports left out)."""
    modules: dict[str, Path] = {}
    for f in package.rglob("*.py"):
        parts = list(f.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = f
    prefix = ".".join(package.relative_to(package.parent).parts)
    top = package.parent
    while (top / "__init__.py").is_file() or top.name in ("llama_index", "embeddings"):
        prefix = f"{top.name}.{prefix}"
        top = top.parent
    # Modules named from the package root (e.g. llama_index.embeddings.bgem3.x) map onto the local names.
    strip = prefix.rsplit(".", 1)[0] + "." if "." in prefix else ""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        type_only = _type_checking_nodes(tree) if runtime_only else set()
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parent = base[: len(base) - (node.level - 1)]
                    target = ".".join(parent + ([node.module] if node.module else []))
                else:
                    target = (node.module or "").removeprefix(strip)
                targets = [target, *(f"{target}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name.removeprefix(strip) for a in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_no_import_circle(package: Path) -> None:
    graph = import_graph(package)
    assert len(graph) > 3 and any(graph.values()), "the graph was not read"
    assert cycles(graph) == []


def test_checker_finds_a_circle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    type_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n"
    (pkg / "sub" / "b.py").write_text(type_only)
    (pkg / "c.py").write_text("def f():\n    from . import a\n")
    graph = import_graph(pkg)
    assert graph["pkg.c"] == {"pkg", "pkg.a"}  # importing from a package runs its __init__ too
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]


CORE = ROOT / "bgem3_embeddings"
CHOICE = "bgem3_embeddings.backends"
ROOMS = ("tensorflow", "jax", "torch")
PORTABLE_MAY_IMPORT = ("bgem3_embeddings.backends.portable", "bgem3_embeddings.backends.keras_backend")
# (module, the module it imports): run-time edges left out of the one-way walk, each with its reason.
RUNTIME_EXCEPTIONS = {
    # precision="int8" converts the whole float32 model through `bgem3 export`'s TFLite path (export.serving
    # builds the model's serving signature): it sits above the model, called by the encoder with a builder.
    ("bgem3_embeddings.backends.tensorflow.int8", "bgem3_embeddings.export.serving"),
    ("bgem3_embeddings.backends.tensorflow.int8", "bgem3_embeddings.export.tflite"),
}


def room_of(module: str) -> str | None:
    """'choice', a room's name, 'portable', 'keras_backend', or None outside backends/."""
    parts = module.split(".")
    if parts[:2] != CHOICE.split("."):
        return None
    return "choice" if len(parts) == 2 else parts[2]


def direction_breaks(graph: dict[str, set[str]], runtime: dict[str, set[str]]) -> list[str]:
    """Each import that walks the backends the wrong way, as 'importer -> imported (rule)'."""
    breaks = []
    for module, imported in sorted(graph.items()):
        here = room_of(module)
        if here is None or here == "choice":
            continue
        for target in sorted(imported):
            there = room_of(target)
            if there == "choice":
                breaks.append(f"{module} -> {target} (nothing under backends/ imports the choice)")
            elif here == "portable" and not target.startswith(PORTABLE_MAY_IMPORT):
                breaks.append(f"{module} -> {target} (portable imports only portable and keras_backend)")
            elif here in ROOMS and there in ROOMS and there != here:
                breaks.append(f"{module} -> {target} (a room imports no other room)")
    for module in sorted(runtime):
        here = room_of(module)
        if here not in ROOMS:
            continue
        seen: set[str] = set()
        stack = [t for t in runtime[module] if (module, t) not in RUNTIME_EXCEPTIONS]
        while stack:
            target = stack.pop()
            if target in seen:
                continue
            seen.add(target)
            there = room_of(target)
            if there == "choice" or (there in ROOMS and there != here):
                breaks.append(f"{module} ~> {target} (reached at run time through the rest of the package)")
                continue
            stack.extend(t for t in runtime[target] if (target, t) not in RUNTIME_EXCEPTIONS)
    return sorted(breaks)


def test_backends_are_entered_in_one_direction() -> None:
    graph, runtime = import_graph(CORE), import_graph(CORE, runtime_only=True)
    rooms = {room_of(m) for m in graph} - {None}
    assert {"choice", "portable", "keras_backend", *ROOMS} <= rooms, "the backends' rooms were not found"
    assert direction_breaks(graph, runtime) == []


def test_direction_checker_finds_each_wrong_way(tmp_path: Path) -> None:
    """The checker itself, on a small copy of the layout: each rule broken once is reported."""
    files = {
        "__init__.py": "",
        "model.py": "",
        "devices.py": "from bgem3_embeddings.backends.torch import kernels\n",
        "backends/__init__.py": "from bgem3_embeddings.backends.jax import runner\n",
        "backends/keras_backend.py": "",
        "backends/portable/__init__.py": "",
        "backends/portable/kernels.py": "from bgem3_embeddings.backends.keras_backend import x\n"
        "from bgem3_embeddings import model\n",
        "backends/jax/__init__.py": "",
        "backends/jax/runner.py": "from bgem3_embeddings.backends.portable import kernels\n"
        "from bgem3_embeddings import devices\n",
        "backends/torch/__init__.py": "",
        "backends/torch/kernels.py": "from bgem3_embeddings import backends\n",
        "backends/tensorflow/__init__.py": "",
        "backends/tensorflow/runner.py": "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from bgem3_embeddings.backends.jax import runner\n",
    }
    package = tmp_path / "bgem3_embeddings"
    for rel, text in files.items():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(text)
    breaks = direction_breaks(import_graph(package), import_graph(package, runtime_only=True))
    short = [b.replace("bgem3_embeddings.", "").split(" (")[0] for b in breaks]
    assert short == [  # `from a.b import c` imports the package a.b and its module a.b.c
        "backends.jax.runner ~> backends.torch",  # another room, through devices, at run time
        "backends.jax.runner ~> backends.torch.kernels",
        "backends.portable.kernels -> bgem3_embeddings",  # portable imports only portable and keras_backend
        "backends.portable.kernels -> model",
        "backends.tensorflow.runner -> backends.jax",  # another room, even for type checking
        "backends.tensorflow.runner -> backends.jax.runner",
        "backends.torch.kernels -> backends",  # the choice
        "backends.torch.kernels ~> backends",  # the choice, at run time
    ]
