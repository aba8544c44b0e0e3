"""The README's install lines cover its own quick starts (issue 58, item 5): its Python blocks run as a user
runs them (tests/docs_blocks.py, BAAI/bge-m3 the tiny checkpoint), then every installed distribution whose
modules they, or this project's code, imported must be one those `pip install` lines install, with their
extras (a quick start that needs an extra the lines leave out, as LangChain's and LlamaIndex's needed
[qdrant], fails here).
The platform and backend lines (`[metal]`, `[torch]`, `[jax]`) are choices, not what a quick start needs."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from bgem3_embeddings.install_hint import CLONE_FOLDERS
from tests.docs_blocks import ROOT
from tests.support import user_env
from tests.test_docs_python_blocks import HUB_ID, hub_cache

CHOICES = {"metal", "metal-plugin", "torch", "jax"}
_BLOCK = re.compile(r"^## Install\n.*?```bash\n(.*?)```", re.S | re.M)
# Run in a user's process: the README's blocks, watching which modules their code and this project's own
# code import (a library's own optional imports, made only when a package happens to be installed, are not
# needs), then the distribution each of those modules came from.
LOADED = """
import json, sys, traceback
from importlib import metadata
from pathlib import Path
from tests.docs_blocks import ROOT, all_blocks, run_pages
OURS = ("README.md", "/bgem3_embeddings/", "/bgem3_qdrant/", "/langchain_bgem3/", "/embeddings/bgem3/")
wanted = set()
class Watch:
    def find_spec(self, name, path=None, target=None):
        frames = [f for f in traceback.extract_stack()[:-1] if "importlib" not in f.filename]
        if frames and any(part in frames[-1].filename for part in OURS):
            wanted.add(name)
        return None
sys.meta_path.insert(0, Watch())
results = run_pages([b for b in all_blocks() if (ROOT / b.path).resolve() == Path(sys.argv[2]).resolve()])
owners = {}
for dist in metadata.distributions():
    for file in dist.files or ():
        if file.suffix == ".py":
            owners[str(file.locate())] = dist.metadata["Name"]
files = {getattr(sys.modules.get(name), "__file__", None) for name in wanted}
loaded = sorted({owners[f] for f in files if f in owners})
json.dump({"results": results, "loaded": loaded}, open(sys.argv[1], "w"))
"""


def readme_installs(readme: Path) -> list[tuple[str, set[str]]]:
    """(distribution, extras) for each `pip install -e FOLDER[extras]` line of the README's Install block."""
    match = _BLOCK.search(readme.read_text(encoding="utf-8"))
    assert match, "README.md has no ```bash block under ## Install"
    by_folder = {str(Path(folder)): name for name, folder in CLONE_FOLDERS.items()}
    installs = []
    for line in match.group(1).splitlines():
        words = shlex.split(line, comments=True)
        for target in (w for w in words[2:] if not w.startswith("-")):
            folder, _, extras = target.partition("[")
            found = {e.strip() for e in extras.rstrip("]").split(",") if e.strip()}
            if not found & CHOICES:
                installs.append((by_folder[str(Path(folder))], found))
    return installs


def closure(installs: list[tuple[str, set[str]]]) -> set[str]:
    """Every distribution those installs bring, from the installed metadata (markers evaluated here)."""
    seen: set[tuple[str, str]] = set()
    todo = [(name, extra) for name, extras in installs for extra in ("", *extras)]
    names = set()
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        names.add(canonicalize_name(name))
        for spec in metadata.requires(name) or []:
            requirement = Requirement(spec)
            if requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
                if not extra and requirement.marker is not None and "extra" in str(requirement.marker):
                    continue
                todo += [(requirement.name, e) for e in ("", *requirement.extras)]
    return names


def test_the_readme_install_lines_cover_its_quick_starts(tiny_checkpoint: Path, tmp_path: Path) -> None:
    readme = ROOT / "README.md"
    installs = readme_installs(readme)
    out = tmp_path / "loaded.json"
    env = {
        "HF_HUB_CACHE": str(hub_cache(tmp_path / "hub", {HUB_ID: tiny_checkpoint})),
        "HF_ENDPOINT": "http://127.0.0.1:9",  # no hub: the tiny checkpoint, filed as BAAI/bge-m3
        "HOME": str(tmp_path),
        "BGEM3_WEIGHTS_CACHE": "off",
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-c", LOADED, str(out), str(readme)]
    done = subprocess.run(command, cwd=ROOT, env=user_env(env), capture_output=True, text=True, timeout=600)
    assert out.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text(encoding="utf-8"))
    failed = {k: v for k, v in report["results"].items() if v["status"] != "passed"}
    assert report["results"] and not failed, failed
    extra = {canonicalize_name(n) for n in report["loaded"]} - closure(installs)
    assert not extra, f"the README's quick starts need {sorted(extra)}; its install lines do not install them"
