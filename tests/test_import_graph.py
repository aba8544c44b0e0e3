"""No import circle in any package (the core and the three integrations), type-checking imports included.

A module importing one that imports it back (even inside a function, or only for type checking) hides
which step depends on which; docs/architecture.md shows each package's layout as a one-way flow.
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


def import_graph(package: Path) -> dict[str, set[str]]:
    """module -> the modules of the same package it imports: absolute, relative, inside functions and
    under TYPE_CHECKING alike."""
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
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
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
