"""Reading files, directories and JSONL: errors name file and line; skip-invalid reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bgem3_qdrant.errors import SourceError
from bgem3_qdrant.sources import SourceStats, expand_paths, iter_documents


def test_directory_walk_globs_and_hidden(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / ".git").mkdir()
    (tmp_path / "a.md").write_text("A")
    (tmp_path / "sub" / "b.txt").write_text("B")
    (tmp_path / "c.py").write_text("C")
    (tmp_path / ".git" / "d.txt").write_text("D")
    names = [p.name for p in expand_paths([tmp_path])]
    assert names == ["a.md", "b.txt"]
    assert [p.name for p in expand_paths([tmp_path], include=["*.md"])] == ["a.md"]
    assert [p.name for p in expand_paths([tmp_path], exclude=["sub/*"])] == ["a.md"]
    with pytest.raises(SourceError, match="no such file"):
        expand_paths([tmp_path / "missing"])


def test_jsonl_records_and_ids(tmp_path: Path) -> None:
    f = tmp_path / "r.jsonl"
    f.write_text('{"id": 7, "text": "x", "metadata": {"k": 1}}\n\n{"text": "y"}\n', encoding="utf-8")
    docs = list(iter_documents([f]))
    assert [d.doc_id for d in docs] == ["7", f"{f.resolve()}:3"]
    assert docs[0].metadata == {"k": 1} and docs[1].line == 3


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"id": "a"}', "no 'text' field"),
        ('{"text": 5}', "must be a string"),
        ('{"text": "t", "metadata": [1]}', "'metadata' must be an object"),
        ('{"text": "t", "id": 1.5}', "'id' must be a string or an integer"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path: Path, line: str, reason: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps({"text": "ok"}) + "\n" + line + "\n", encoding="utf-8")
    it = iter_documents([f])
    assert next(it).text == "ok"
    with pytest.raises(SourceError) as err:
        next(it)
    assert err.value.line == 2 and f"{f}:2" in str(err.value) and reason in str(err.value)


def test_skip_invalid_reports_and_continues(tmp_path: Path) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_bytes(b'{"text": "a"}\n{oops\n{"text": "b\xff"}\n{"text": "c"}\n')
    seen: list[SourceError] = []
    stats = SourceStats()
    docs = list(iter_documents([f], on_invalid=seen.append, stats=stats))
    assert [d.text for d in docs] == ["a", "c"]
    assert [e.line for e in seen] == [2, 3]
    assert "not valid utf-8" in str(seen[1]) and len(stats.invalid) == 2


def test_wrong_encoding_and_bom(tmp_path: Path) -> None:
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café".encode("latin-1"))
    with pytest.raises(SourceError, match=r"latin.txt: not valid utf-8 text \(byte 0xe9 at offset 3\)"):
        list(iter_documents([latin]))
    assert next(iter_documents([latin], encoding="latin-1")).text == "café"
    bom = tmp_path / "bom.md"
    bom.write_bytes(b"\xef\xbb\xbfhello")
    assert next(iter_documents([bom])).text == "hello"


def test_flat_jsonl_keys_are_metadata(tmp_path: Path) -> None:
    f = tmp_path / "flat.jsonl"
    lines = [
        {"text": "bonjour", "lang": "fr", "year": 2020},
        {"doc_id": "d2", "text": "hallo", "lang": "de", "metadata": {"lang": "de-AT", "k": 1}},
        {"id": "d3", "text": "hi", "source": "https://example.org/hi", "tags": ["a"]},
    ]
    f.write_text("\n".join(json.dumps(r) for r in lines) + "\n", encoding="utf-8")
    a, b, c = iter_documents([f])
    assert a.metadata == {"lang": "fr", "year": 2020} and a.doc_id.endswith("flat.jsonl:1")
    assert b.doc_id == "d2" and b.metadata == {"lang": "de-AT", "k": 1}  # the metadata object wins
    assert c.source == "https://example.org/hi" and c.metadata == {"tags": ["a"]}
    both = tmp_path / "both.jsonl"
    both.write_text('{"id": 1, "doc_id": 2, "text": "x"}\n', encoding="utf-8")
    with pytest.raises(SourceError, match="not several"):
        list(iter_documents([both]))


def test_control_characters_are_refused_with_file_and_offset(tmp_path: Path) -> None:
    nul = tmp_path / "zeros.txt"
    nul.write_bytes("héllo ".encode() + b"\x00" * 3000)
    with pytest.raises(SourceError, match=r"zeros.txt: not text: control byte 0x00 at offset 7"):
        list(iter_documents([nul]))
    ok = tmp_path / "tabs.txt"
    ok.write_text("a\tb\r\nc\fd\n", encoding="utf-8")
    assert [d.text for d in iter_documents([ok])] == ["a\tb\r\nc\fd\n"]
    j = tmp_path / "bin.jsonl"
    j.write_text('{"text": "ok"}\n{"text": "a\\u0000b"}\n', encoding="utf-8")
    where = r"bin.jsonl:2: 'text' holds control character U\+0000 at character 1"
    with pytest.raises(SourceError, match=where):
        list(iter_documents([j]))


def test_jsonl_error_column_is_the_records_own(tmp_path: Path) -> None:
    f = tmp_path / "cut.jsonl"
    f.write_text('{"text": "a",\n', encoding="utf-8")
    with pytest.raises(SourceError, match=r"cut.jsonl:1: invalid JSON: .* \(column 14\)"):
        list(iter_documents([f]))
