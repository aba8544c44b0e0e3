"""The `bgem3-qdrant` command: ingest, search, errors, bench."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bgem3_qdrant.cli import app
from bgem3_qdrant.errors import BGEM3QdrantError
from bgem3_qdrant.tools.bench import run_bench

from bgem3_embeddings.cli_support import run_cli


class Result:
    def __init__(self, exit_code: int, output: str) -> None:
        self.exit_code, self.output = exit_code, output


class Runner:
    """The command as `main()` runs it (run_cli: one-line errors, exit codes), in this process."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys

    def invoke(self, _app: Any, args: list[str]) -> Result:
        with pytest.raises(SystemExit) as exit_info:
            run_cli(app, expected=(BGEM3QdrantError,), argv=args, start_tensorflow=False)
        out = self.capsys.readouterr()
        return Result(int(exit_info.value.code or 0), out.err + out.out)


def test_cli_ingest_search_and_errors(
    tmp_path: Path, tiny_checkpoint: Path, corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runner = Runner(capsys)
    store = str(tmp_path / "qd")
    common = ["--model", str(tiny_checkpoint), "--path", store]
    res = runner.invoke(
        app,
        [
            "ingest",
            str(corpus),
            "-c",
            "kb",
            "--chunk-size",
            "24",
            "--chunk-overlap",
            "4",
            "--no-progress",
            *common,
        ],
    )
    assert res.exit_code == 0, res.output
    assert "6 files, 9 documents" in res.output and "tokens/s" in res.output
    res = runner.invoke(
        app,
        ["ingest", str(corpus), "-c", "kb", "--chunk-size", "24", "--chunk-overlap", "4", "--json", *common],
    )
    summary = json.loads(res.output.strip().splitlines()[-1])
    assert summary["encoded"] == 0 and summary["unchanged"] == summary["chunks"]

    res = runner.invoke(
        app,
        [
            "search",
            "Les vecteurs ColBERT servent seulement",
            "-c",
            "kb",
            "--mode",
            "hybrid",
            "--filter",
            "topic=rerank",
            *common,
        ],
    )
    assert res.exit_code == 0, res.output
    assert res.output.startswith("1. [") and "rrf=" in res.output
    assert {line.split()[2] for line in res.output.splitlines() if line[:1].isdigit()} == {"q-2", "q-3"}
    res = runner.invoke(app, ["search", "ColBERT", "-c", "kb", "--json", "-f", "lang=fr", *common])
    hits = json.loads(res.output)["hits"]
    assert {h["doc_id"] for h in hits} == {"q-3"} and set(hits[0]["scores"]) == {"dense", "sparse", "colbert"}

    res = runner.invoke(app, ["search", "x", "-c", "missing", *common])
    assert res.exit_code == 1 and "collection 'missing' does not exist" in res.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": \n')
    res = runner.invoke(app, ["ingest", str(bad), "-c", "kb", *common])
    assert res.exit_code == 1 and f"{bad}:2: invalid JSON" in res.output
    res = runner.invoke(app, ["ingest", str(bad), "-c", "kb", "--skip-invalid", *common])
    assert res.exit_code == 0 and "1 invalid skipped" in res.output and f"skipped: {bad}:2" in res.output
    res = runner.invoke(app, ["ingest", str(tmp_path / "nowhere"), "-c", "kb", *common])
    assert res.exit_code == 1 and "no such file or directory" in res.output


def test_bench_reports_both_rates(encoder: Any, corpus: Path) -> None:
    result = run_bench(encoder, [corpus], chunk_size=24, chunk_overlap=4, batch_size=8)
    assert result["tokens"] > 0 and result["encoder_only_tokens_per_s"] > 0
    assert 0 < result["end_to_end_over_encoder_only"] <= 1.5


def test_skipped_lines_are_listed_once(tmp_path: Path, tiny_checkpoint: Path) -> None:
    from tests.support import run_module

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": \n{"text": "also fine"}\n', encoding="utf-8")
    done = run_module(
        "bgem3_qdrant", "ingest", str(bad), "-c", "kb", "--skip-invalid", "--no-progress",
        "--model", str(tiny_checkpoint), "--path", str(tmp_path / "store"),
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(f"{bad}:2") == 1, done.stderr
    assert "1 invalid skipped" in done.stdout and "2 encoded" in done.stdout
