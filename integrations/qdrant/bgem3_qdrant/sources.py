"""Reading documents from text/Markdown files, directories and JSONL, with errors naming file and line."""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import SourceError
from .wording import counted

logger = logging.getLogger(__name__)

DEFAULT_INCLUDE: tuple[str, ...] = ("*.txt", "*.md", "*.markdown", "*.jsonl", "*.ndjson")
JSONL_SUFFIXES = {".jsonl", ".ndjson"}
# JSONL keys with a meaning of their own (besides the text field); every other top-level key is metadata.
# A BEIR corpus.jsonl line (`_id`, `title`, `text`) is read as is: `_id` is the document id, the title is
# joined to the text as BEIR does (`beir_text`).
BEIR_ID_KEY = "_id"
BEIR_TITLE_KEY = "title"
ID_KEYS = ("id", "doc_id", BEIR_ID_KEY)
SOURCE_KEY = "source"
METADATA_KEY = "metadata"
# Said by every error that `--skip-invalid` (IngestOptions.skip_invalid) would have gone past.
SKIP_INVALID = "--skip-invalid skips unreadable files and bad JSONL lines (each reported) and goes on"
# Other files named in the error for a folder with nothing to ingest.
OTHERS_SHOWN = 3
# Control characters that are whitespace; any other (NUL, escape, ...) means binary input, not text.
WHITESPACE_CONTROLS = frozenset("\t\n\r\f\v\x1c\x1d\x1e\x1f\x85")


def beir_text(title: str | None, text: str) -> str:
    """A BEIR document's text as BEIR's retrieval models encode it: title, a space, text, stripped
    (beir.retrieval.models.SentenceBERT.encode_corpus).

    >>> beir_text("BGE M3", "An embedding model. "), beir_text("", " Text")
    ('BGE M3 An embedding model.', 'Text')
    """
    return (f"{title} {text}" if title is not None else text).strip()


def control_character(text: str) -> int | None:
    """Index of the first control character in `text` that is not whitespace, or None.

    >>> control_character("a\tb"), control_character("ab\x00")
    (None, 2)
    """
    for i, ch in enumerate(text):
        if unicodedata.category(ch) == "Cc" and ch not in WHITESPACE_CONTROLS:
            return i
    return None


@dataclass
class Document:
    """One document to chunk. `doc_id` identifies it across runs (part of every point id)."""

    doc_id: str
    source: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    line: int | None = None  # JSONL line number, for messages


@dataclass
class SourceStats:
    """What reading saw: counted while iterating. `notes`: folders in which no file was read."""

    files: int = 0
    documents: int = 0
    invalid: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


OnInvalid = Callable[[SourceError], None]


def _matches(rel: str, patterns: Iterable[str]) -> bool:
    """Glob match on the file name, or on the relative path for patterns containing '/'."""
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(rel if "/" in p else name, p) for p in patterns)


def read_kinds(include: Iterable[str]) -> str:
    """What the `include` globs read, for messages: `.txt, .md, .markdown, .jsonl and .ndjson files`.

    >>> read_kinds(DEFAULT_INCLUDE), read_kinds(["notes/*.rst"])
    ('.txt, .md, .markdown, .jsonl and .ndjson files', "files matching 'notes/*.rst' (--glob)")
    """
    include = tuple(include)
    if include == DEFAULT_INCLUDE:
        kinds = [p.removeprefix("*") for p in include]
        return f"{', '.join(kinds[:-1])} and {kinds[-1]} files"
    return f"files matching {', '.join(map(repr, include))} (--glob)"


def nothing_to_ingest(
    paths: list[Path], include: tuple[str, ...], others: list[str], other_count: int
) -> SourceError:
    """The one line for input paths in which no file is read: what is read, what was found instead
    (`others`: the first names of the `other_count` files not read)."""
    where = ", ".join(map(str, paths))
    if other_count:
        shown = ", ".join(others) + (", ..." if other_count > len(others) else "")
        found = f"found only {counted(other_count, 'other file')} ({shown})"
    else:
        found = "found no file"
    return SourceError(
        where,
        f"nothing to ingest: ingest reads {read_kinds(include)}, {found}; convert them to one of these, "
        "or read other text files with --glob PATTERN",
    )


def expand_paths(
    paths: Iterable[str | os.PathLike[str]],
    include: Iterable[str] = DEFAULT_INCLUDE,
    exclude: Iterable[str] = (),
    notes: list[str] | None = None,
) -> list[Path]:
    """Files to read, in a stable order: given files as they are, directories walked recursively.

    Hidden files and folders (".git") inside directories are skipped; `include`/`exclude` globs
    apply to files found in directories, not to files named explicitly. A folder in which no file is read
    is said in `notes` (when given); SourceError when no file at all is read (`nothing_to_ingest`).
    """
    include, exclude = tuple(include), tuple(exclude)
    roots = [Path(p) for p in paths]
    files: list[Path] = []
    others: list[str] = []  # the first files not read, for the message when nothing is
    other_count = 0
    for p in roots:
        if p.is_dir():
            found = []
            for root, dirs, names in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in names:
                    if name.startswith("."):
                        continue
                    full = Path(root) / name
                    rel = full.relative_to(p).as_posix()
                    if _matches(rel, include) and not _matches(rel, exclude):
                        found.append(full)
                    else:
                        other_count += 1
                        if len(others) < OTHERS_SHOWN:
                            others.append(name)
            if not found:
                logger.info("%s: no file read (ingest reads %s)", p, read_kinds(include))
                if notes is not None:
                    notes.append(f"{p}: nothing read there (ingest reads {read_kinds(include)})")
            files.extend(sorted(found))
        elif p.exists():
            files.append(p)
        else:
            raise SourceError(str(p), "no such file or directory")
    if roots and not files:
        raise nothing_to_ingest(roots, include, others, other_count)
    return files


def _read_text(path: Path, encoding: str) -> str:
    """Whole file as text; a clear SourceError for unreadable files and wrong encodings."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SourceError(str(path), f"cannot read: {e.strerror or e}") from e
    codec = "utf-8-sig" if encoding.lower().replace("_", "-") == "utf-8" else encoding
    try:
        # utf-8-sig also accepts (and drops) a byte order mark.
        text = data.decode(codec)
    except UnicodeDecodeError as e:
        raise SourceError(
            str(path),
            f"not valid {encoding} text (byte 0x{data[e.start]:02x} at offset {e.start}): not a text file, "
            "or text in another encoding (--encoding)",
        ) from e
    bad = control_character(text)
    if bad is not None:
        offset = len(data) - len(text[bad:].encode(codec.replace("-sig", "")))
        raise SourceError(
            str(path),
            f"not text: control byte 0x{ord(text[bad]):02x} at offset {offset} (a binary file?); "
            "leave it out with --exclude or convert it to text",
        )
    return text


def _jsonl_documents(
    path: Path, encoding: str, text_field: str, on_invalid: OnInvalid | None, stats: SourceStats
) -> Iterator[Document]:
    """Documents of a JSONL file, streamed: one object per line with `text`, optional `id`, `metadata`."""
    source = str(path.resolve())
    utf8 = encoding.lower().replace("_", "-") == "utf-8"
    seen: set[str] = set()
    try:
        f = path.open("rb")
    except OSError as e:
        raise SourceError(str(path), f"cannot read: {e.strerror or e}") from e
    with f:
        # JSONL is line-oriented: splitting the bytes on newlines before decoding is safe for UTF-8
        # and lets a decoding error name its exact line.
        for lineno, raw in enumerate(f, start=1):
            try:
                try:
                    line = raw.decode(("utf-8-sig" if lineno == 1 else "utf-8") if utf8 else encoding)
                except UnicodeDecodeError as e:
                    raise SourceError(
                        str(path),
                        f"not valid {encoding} text (byte 0x{raw[e.start]:02x} at column {e.start + 1})",
                        lineno,
                    ) from e
                if not line.strip():
                    continue
                doc = _parse_record(line, source, str(path), lineno, text_field)
            except SourceError as e:
                if on_invalid is None:
                    raise SourceError(e.path, e.reason, e.line, SKIP_INVALID) from e
                stats.invalid.append(str(e))
                on_invalid(e)
                continue
            if doc.doc_id in seen:
                logger.warning(
                    "%s:%d: id %r seen before in this file; the last one wins", path, lineno, doc.doc_id
                )
            seen.add(doc.doc_id)
            yield doc


def _parse_record(line: str, source: str, display: str, lineno: int, text_field: str) -> Document:
    """One JSONL line as a Document, or a SourceError naming file and line."""
    try:
        rec = json.loads(line.rstrip("\r\n"))  # the line's end is not part of the record (error columns)
    except json.JSONDecodeError as e:
        raise SourceError(display, f"invalid JSON: {e.msg} (column {e.colno})", lineno) from e
    if not isinstance(rec, dict):
        raise SourceError(display, f"expected a JSON object, got {type(rec).__name__}", lineno)
    if text_field not in rec:
        raise SourceError(display, f"no {text_field!r} field", lineno)
    text = rec[text_field]
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise SourceError(display, f"{text_field!r} must be a string, got {type(text).__name__}", lineno)
    bad = control_character(text)
    if bad is not None:
        raise SourceError(
            display,
            f"{text_field!r} holds control character U+{ord(text[bad]):04X} at character {bad} "
            "(binary data, not text)",
            lineno,
        )
    ids = [k for k in ID_KEYS if rec.get(k) is not None]
    if len(ids) > 1:
        raise SourceError(display, "give the document id as 'id', 'doc_id' or '_id', not several", lineno)
    rid = rec[ids[0]] if ids else None
    if rid is not None and (isinstance(rid, bool) or not isinstance(rid, str | int)):
        raise SourceError(
            display, f"{ids[0]!r} must be a string or an integer, got {type(rid).__name__}", lineno
        )
    meta = rec.get(METADATA_KEY)
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise SourceError(display, f"'metadata' must be an object, got {type(meta).__name__}", lineno)
    rec_source = rec.get(SOURCE_KEY)
    if rec_source is not None and not isinstance(rec_source, str):
        raise SourceError(display, f"'source' must be a string, got {type(rec_source).__name__}", lineno)
    reserved = {text_field, *ID_KEYS, SOURCE_KEY, METADATA_KEY}
    if ids == [BEIR_ID_KEY]:  # a BEIR corpus line: the title is part of the text, not metadata
        title = rec.get(BEIR_TITLE_KEY)
        if title is not None and not isinstance(title, str):
            raise SourceError(display, f"'title' must be a string, got {type(title).__name__}", lineno)
        bad = control_character(title or "")
        if title and bad is not None:
            raise SourceError(
                display, f"'title' holds control character U+{ord(title[bad]):04X} at character {bad}", lineno
            )
        text = beir_text(title, text)
        reserved.add(BEIR_TITLE_KEY)
    # Other top-level keys are metadata too ({"text": ..., "lang": "fr"}); the `metadata` object wins.
    flat = {k: v for k, v in rec.items() if k not in reserved}
    # Records without an id are identified by file and line: editing lines above them changes it.
    doc_id = str(rid) if rid is not None else f"{source}:{lineno}"
    return Document(
        doc_id=doc_id, source=rec_source or source, text=text, metadata={**flat, **meta}, line=lineno
    )


def iter_documents(
    paths: Iterable[str | os.PathLike[str]],
    *,
    include: Iterable[str] = DEFAULT_INCLUDE,
    exclude: Iterable[str] = (),
    encoding: str = "utf-8",
    text_field: str = "text",
    on_invalid: OnInvalid | None = None,
    stats: SourceStats | None = None,
) -> Iterator[Document]:
    """Documents from files, directories and JSONL, lazily and in a stable order.

    Without `on_invalid`, the first bad file or JSONL line raises SourceError; with it, the error is
    passed to `on_invalid`, recorded in `stats.invalid` and reading goes on.
    """
    stats = stats if stats is not None else SourceStats()
    for path in expand_paths(paths, include, exclude, stats.notes):
        stats.files += 1
        try:
            if path.suffix.lower() in JSONL_SUFFIXES:
                for doc in _jsonl_documents(path, encoding, text_field, on_invalid, stats):
                    stats.documents += 1
                    yield doc
            else:
                text = _read_text(path, encoding)
                source = str(path.resolve())
                stats.documents += 1
                yield Document(doc_id=source, source=source, text=text, metadata={})
        except SourceError as e:
            # Whole-file problems (unreadable, wrong encoding) land here too.
            if e.line is not None:  # a JSONL line's, raised above as it should be
                raise
            if on_invalid is None:
                raise SourceError(e.path, e.reason, e.line, SKIP_INVALID) from e
            stats.invalid.append(str(e))
            on_invalid(e)
