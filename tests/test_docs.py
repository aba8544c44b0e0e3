"""The documentation's relative links resolve, and the README stays a short newcomer's path.

Links are checked as GitHub renders them: a relative link must name an existing file (or folder), and a
`#anchor` must match a heading of the target page, slugged the way GitHub slugs headings.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.optional import skip_or_fail

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250
# The README is the front door (what it is, the two commands, install, a quick start per integration, links):
# the rest lives in the guides (issue 59).
README_MAX_WORDS = 1200
# A guide a user reads for one task stays short; history goes to docs/design/ or the commit messages.
PAGE_MAX_WORDS = 4000
# Reference pages written from the code (docstrings, --help, the OpenAPI schema), not by hand: no word limit.
GENERATED_PAGES = ("reference",)
# The one-topic pages the README's depth moved into (issue 15).
TOPIC_PAGES = (
    "architecture.md",
    "checkpoints.md",
    "performance.md",
    "precision-and-devices.md",
    "qdrant.md",
    "langchain.md",
    "llamaindex.md",
    "export.md",
    "verification.md",
)

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) or [text](target "title"); images too. Nested brackets in the text are not used here.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_INLINE_CODE = re.compile(r"`[^`]*`")


def markdown_files() -> list[Path]:
    """README.md, every page under docs/ and the integration packages' READMEs."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    files += sorted((ROOT / "integrations").glob("*/README.md"))
    return files


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, in_fence = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append(line)
    return lines


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.

    >>> github_slug("Qdrant: ingest documents, search them with hybrid + ColBERT (`bgem3-qdrant`)")
    'qdrant-ingest-documents-search-them-with-hybrid--colbert-bgem3-qdrant'
    """
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading renders as its text
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file; repeated headings get -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    result = set()
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def relative_links(path: Path) -> list[str]:
    """Link targets that are not URLs (http:, https:, mailto:), outside code blocks and inline code."""
    targets = []
    for line in _prose_lines(path.read_text(encoding="utf-8")):
        for target in _LINK.findall(_INLINE_CODE.sub("", line)):
            if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                targets.append(target)
    return targets


def broken_links(path: Path) -> list[str]:
    """Each relative link of `path` whose file or anchor does not exist, with the reason."""
    problems = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{target}: no file {dest}")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            problems.append(f"{target}: no heading #{anchor} in {dest.name}")
    return problems


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    assert broken_links(path) == []


def test_checker_finds_broken_links(tmp_path: Path) -> None:
    """The checker itself: a missing file and a missing anchor are reported, good links are not."""
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading: yes\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n[ok](other.md#a-code-heading-yes) [self](#page) [web](https://example.com/x.md)\n"
        "[gone](missing.md) [bad anchor](other.md#nope)\n\n```\n[in code](ignored.md)\n```\n",
        encoding="utf-8",
    )
    problems = broken_links(page)
    assert len(problems) == 2, problems
    assert problems[0].startswith("missing.md: no file")
    assert problems[1] == "other.md#nope: no heading #nope in other.md"


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move depth to docs/"


def words(path: Path) -> int:
    """Words of a markdown file as `wc -w` counts them (code blocks too: a reader scrolls past them)."""
    return len(path.read_text(encoding="utf-8").split())


def test_readme_is_under_its_word_limit() -> None:
    count = words(ROOT / "README.md")
    assert count < README_MAX_WORDS, f"README.md has {count} words; move depth to the guides under docs/"


def long_pages(docs: Path, limit: int = PAGE_MAX_WORDS) -> list[str]:
    """Each page under `docs` (generated reference pages aside) over `limit` words, with its count."""
    return [
        f"{page.relative_to(docs)}: {words(page)} words"
        for page in sorted(docs.rglob("*.md"))
        if page.relative_to(docs).parts[0] not in GENERATED_PAGES and words(page) > limit
    ]


def test_no_page_is_over_its_word_limit() -> None:
    """No guide, performance page or design note over 4,000 words: split it by task (issue 59)."""
    assert long_pages(ROOT / "docs") == []


def test_word_limit_checker_finds_a_long_page(tmp_path: Path) -> None:
    """The checker itself: a page over the limit is named, one at it is not, a generated reference page
    is left out."""
    (tmp_path / "reference").mkdir()
    (tmp_path / "long.md").write_text("word " * 11, encoding="utf-8")
    (tmp_path / "short.md").write_text("word " * 10, encoding="utf-8")
    (tmp_path / "reference" / "cli.md").write_text("word " * 50, encoding="utf-8")
    assert long_pages(tmp_path, limit=10) == ["long.md: 11 words"]


def test_readme_links_every_topic_page() -> None:
    """Every one-topic page exists and the README points a newcomer at it."""
    linked = {Path(t.partition("#")[0]).name for t in relative_links(ROOT / "README.md")}
    missing = [page for page in TOPIC_PAGES if not (ROOT / "docs" / page).is_file() or page not in linked]
    assert missing == []


# The module maps of docs/architecture.md: (package folder, the section that maps it, folders left out).
# bgem3_embeddings/serve/ is left out: its row names its modules, and it changes often.
MAPPED_PACKAGES = (
    ("bgem3_embeddings", "### bgem3-embeddings (the core)", ("serve",)),
    ("integrations/qdrant/bgem3_qdrant", "### bgem3-qdrant", ()),
)


def _section(text: str, heading: str) -> str:
    """The text from `heading` to the next heading of the same level."""
    start = text.index(heading + "\n")
    end = text.find("\n### ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def unmapped_modules(package: Path, section: str, skip: tuple[str, ...] = ()) -> list[str]:
    """The modules of `package` (relative paths) that the map `section` does not name.

    A top-level module is named as `name.py` (or `.../name.py`); one in a folder either by its path
    (`folder/name.py`) or, in the row of `folder/`, as `name` or `name.py`.
    """
    rows = [line for line in section.splitlines() if line.startswith("|")]
    missing = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if path.name == "__init__.py" or (len(rel.parts) > 1 and rel.parts[0] in skip):
            continue
        if re.search(rf"[`/]{re.escape(rel.as_posix())}`", section):
            continue
        folder = rel.parent.as_posix()
        if folder != "." and any(
            re.search(rf"[`/]{re.escape(folder)}/`", row.split("|")[1])
            and re.search(rf"`{re.escape(path.stem)}(\.py)?`", row)
            for row in rows
        ):
            continue
        missing.append(rel.as_posix())
    return missing


@pytest.mark.parametrize("package,heading,skip", MAPPED_PACKAGES, ids=[p[0] for p in MAPPED_PACKAGES])
def test_architecture_map_names_every_module(package: str, heading: str, skip: tuple[str, ...]) -> None:
    section = _section((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"), heading)
    assert unmapped_modules(ROOT / package, section, skip) == []


def test_map_checker_finds_an_unnamed_module(tmp_path: Path) -> None:
    """The checker itself: a module named nowhere, or only in another folder's row, is reported."""
    for rel in ("top.py", "other.py", "ui/app.py", "ui/errors.py", "tools/bench.py", "__init__.py"):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_text("", encoding="utf-8")
    section = "| `top.py` | x |\n| `ui/` | `app` -> `errors` |\n| `tools/` | nothing |\n"
    assert unmapped_modules(tmp_path, section) == ["other.py", "tools/bench.py"]


def _default_of(source: Path, function: str, argument: str) -> str:
    """The default of `argument` in the first `def function` of a Python file, as source text."""
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            args = node.args
            pairs = list(zip(args.args[len(args.args) - len(args.defaults) :], args.defaults, strict=True))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
            return next(ast.unparse(default) for arg, default in pairs if arg.arg == argument)
    raise AssertionError(f"no def {function} in {source}")


def test_core_api_states_the_weight_defaults_of_the_code() -> None:
    """docs/CORE_API.md's compute_score default is the code's (None = FlagEmbedding's 1/1/1), and explain's
    default is scoring.DEFAULT_MODE_WEIGHTS (the model card's 0.4/0.2/0.4)."""
    doc = (ROOT / "docs" / "CORE_API.md").read_text(encoding="utf-8")
    encoder, m3_api = ROOT / "bgem3_embeddings" / "encoder.py", ROOT / "bgem3_embeddings" / "m3_api.py"
    score_doc = re.search(r"enc\.compute_score\(.*?weights_for_different_modes=([^)]*)\)", doc, re.S)
    assert score_doc is not None
    code_default = _default_of(encoder, "compute_score", "weights_for_different_modes")
    assert score_doc.group(1) == code_default == "None"
    explain_doc = re.search(r"enc\.explain\(.*?weights=(\([^)]*\))", doc, re.S)
    assert explain_doc is not None
    assert _default_of(m3_api, "explain", "weights") == "DEFAULT_MODE_WEIGHTS"
    scoring = ast.parse((ROOT / "bgem3_embeddings" / "scoring.py").read_text(encoding="utf-8"))
    card = next(
        ast.literal_eval(node.value)
        for node in scoring.body
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "DEFAULT_MODE_WEIGHTS"
    )
    assert ast.literal_eval(explain_doc.group(1)) == card == (0.4, 0.2, 0.4)


def test_readme_encode_example_output_stays_out_of_git_status() -> None:
    """The file the README's `bgem3 encode ... -o FILE` writes, run from the clone, is ignored by git."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        skip_or_fail("not a git checkout", ".ci/run runs in a clone")
    outputs = re.findall(r"^bgem3 encode .* -o (\S+)", (ROOT / "README.md").read_text(encoding="utf-8"), re.M)
    assert outputs, "the README has no `bgem3 encode ... -o FILE` example"
    for output in outputs:
        ignored = subprocess.run(["git", "check-ignore", "-q", output], cwd=ROOT, check=False)
        assert ignored.returncode == 0, f"{output} would show up in git status: add it to .gitignore"


def unindexed_benchmarks(folder: Path, index: str) -> list[str]:
    """Scripts under `folder` (.py and .c, recursively) that `index` does not name as `path`, and paths it
    names in backticks that are no file there: the index and the folder in step both ways."""
    scripts = {
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.suffix in (".py", ".c") and "__pycache__" not in p.parts
    }
    named = set(re.findall(r"`([\w/.-]+\.(?:py|c))`", index))
    missing = [f"not in the index: {s}" for s in sorted(scripts - named)]
    return missing + [f"no such script: {s}" for s in sorted(named - scripts) if not (folder / s).is_file()]


def test_benchmarks_readme_indexes_every_script() -> None:
    """benchmarks/README.md maps each script to its question and the docs holding its figures (issue 59)."""
    index = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert unindexed_benchmarks(ROOT / "benchmarks", index) == []


def test_benchmark_index_checker_finds_both_kinds(tmp_path: Path) -> None:
    for rel in ("a.py", "findings/b.py", "tool/c.c", "__pycache__/d.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("", encoding="utf-8")
    index = "| q | `a.py` | x |\n| q | `findings/gone.py` | x |\n| q | `tool/c.c` |\n"
    assert unindexed_benchmarks(tmp_path, index) == [
        "not in the index: findings/b.py",
        "no such script: findings/gone.py",
    ]
