"""The documentation's relative links resolve, and the README stays a short newcomer's path.

Links are checked as GitHub renders them: a relative link must name an existing file (or folder), and a
`#anchor` must match a heading of the target page, slugged the way GitHub slugs headings.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250
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


def test_readme_links_every_topic_page() -> None:
    """Every one-topic page exists and the README points a newcomer at it."""
    linked = {Path(t.partition("#")[0]).name for t in relative_links(ROOT / "README.md")}
    missing = [page for page in TOPIC_PAGES if not (ROOT / "docs" / page).is_file() or page not in linked]
    assert missing == []
