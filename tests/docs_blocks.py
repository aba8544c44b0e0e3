"""The ```python blocks of the README and docs/, extracted, and run as a reader runs a page: top to bottom in
one Python session per page, in a fresh folder.

    python -m tests.docs_blocks RESULTS.json [PAGE...]   # every page, or these; RESULTS: {"file:line": ...}

A page's blocks share one namespace (a later block may use what an earlier one imported or built, as in a
notebook), and top-level `await` works as in `python -m asyncio` or a notebook. Each page runs in its own
empty folder holding links to the checkout's docs/ and examples/ (what blocks read), so what blocks write
(./qdrant_data, out/) goes nowhere near the checkout. The runner names no model: the caller points the Hugging
Face cache at a tiny checkpoint filed as BAAI/bge-m3 (offline), so blocks run as written, and passes the
address of a running `bgem3 serve` in DOCS_SERVER_URL, put in place of the docs' http://127.0.0.1:8000.

A block that cannot run here carries, on the line before its fence, `<!-- not run by
tests/test_docs_python_blocks.py: REASON -->`: the reason is in the docs next to the block.
"""

from __future__ import annotations

import ast
import asyncio
import gc
import inspect
import json
import os
import re
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER_IN_DOCS = "http://127.0.0.1:8000"
SERVER_ENV = "DOCS_SERVER_URL"
SKIP = re.compile(r"^\s*<!--\s*not run by tests/test_docs_python_blocks\.py:\s*(.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(\s*)```python\s*$")
_LINKED = ("docs", "examples")  # what blocks read, relative to the clone


@dataclass(frozen=True)
class Block:
    path: Path  # relative to ROOT
    line: int  # of the opening fence, 1-based
    code: str
    skip: str | None  # the reason given next to the block, or None

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def doc_pages() -> list[Path]:
    """README.md, every page under docs/ and the integration packages' READMEs (new pages included)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return pages + sorted((ROOT / "integrations").glob("*/README.md"))


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")), len(lines))
        indent = len(fence.group(1))
        code = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = SKIP.match(before)
        found.append(Block(page.relative_to(ROOT), i + 1, code, marker.group(1) if marker else None))
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for page in doc_pages() for block in blocks_of(page)]


def run_block(block: Block, namespace: dict[str, object]) -> None:
    code = block.code.replace(SERVER_IN_DOCS, os.environ.get(SERVER_ENV, SERVER_IN_DOCS))
    compiled = compile(code, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(compiled, namespace)  # noqa: S307 - the project's own documentation
    if inspect.iscoroutine(result):  # the block awaits at top level
        asyncio.run(result)


def run_pages(blocks: list[Block]) -> dict[str, dict[str, object]]:
    """Each page's blocks in order, in one namespace and a fresh folder; after a failure, the page's later
    blocks are reported as not run (they may need what the failed one built)."""
    results: dict[str, dict[str, object]] = {}
    by_page: dict[Path, list[Block]] = {}
    for block in blocks:
        by_page.setdefault(block.path, []).append(block)
    home = Path.cwd()
    for page_blocks in by_page.values():
        with tempfile.TemporaryDirectory(prefix="docs-page-") as folder:
            for name in _LINKED:
                (Path(folder) / name).symlink_to(ROOT / name)
            os.chdir(folder)
            namespace: dict[str, object] = {"__name__": "__main__"}
            failed = None
            for block in page_blocks:
                if block.skip is not None:
                    results[block.id] = {"status": "skipped", "reason": block.skip}
                    continue
                if failed is not None:
                    results[block.id] = {"status": "not run", "reason": f"{failed} failed before it"}
                    continue
                print(f"== {block.id}", flush=True)
                try:
                    run_block(block, namespace)
                    results[block.id] = {"status": "passed"}
                except BaseException:  # noqa: BLE001 - reported, with the block's own line numbers
                    results[block.id] = {"status": "failed", "error": traceback.format_exc(limit=-4)}
                    failed = block.id
            namespace.clear()
            gc.collect()  # stores and clients a page left open close before the next page
            os.chdir(home)
    return results


def main() -> None:
    pages = set(sys.argv[2:])
    results = run_pages([block for block in all_blocks() if not pages or str(block.path) in pages])
    Path(sys.argv[1]).write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
