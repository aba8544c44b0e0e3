"""The `bgem3` CLI: encode to JSONL, and verify's comparison logic with injected expectations."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from bgem3_embeddings.cli import app
from bgem3_embeddings.cli_support import CommandError
from bgem3_embeddings.verify import SENTENCES_1, SENTENCES_2, ReferenceNumbers, format_report, run_checks
from tests.reference_m3 import ReferenceM3
from tests.tolerances import UNIT_VECTORS

runner = CliRunner()


def plain(output: str) -> str:
    """CLI output without rich's box drawing and line wrapping."""
    return " ".join(output.replace("│", " ").replace("╭", " ").replace("╰", " ").replace("─", "").split())


def test_encode_writes_jsonl_with_the_chosen_outputs(
    tiny_checkpoint: Path, tiny_encoder: Any, tmp_path: Path
) -> None:
    source = tmp_path / "texts.jsonl"
    source.write_text(json.dumps({"text": "What is BGE M3?"}) + "\n\n" + json.dumps({"text": "BM25"}) + "\n")
    out = tmp_path / "out.jsonl"
    result = runner.invoke(
        app,
        [
            "encode",
            "extra text",
            "--file",
            str(source),
            "--output",
            str(out),
            "--model",
            str(tiny_checkpoint),
            "--sparse",
            "--colbert",
            "--device",
            "cpu",
        ],
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["text"] for r in records] == ["extra text", "What is BGE M3?", "BM25"]
    expected = tiny_encoder.encode([r["text"] for r in records], return_sparse=True, return_colbert_vecs=True)
    for r, dense, sparse, colbert in zip(
        records, expected["dense_vecs"], expected["lexical_weights"], expected["colbert_vecs"], strict=True
    ):
        np.testing.assert_allclose(r["dense"], dense, **UNIT_VECTORS)
        assert r["sparse"].keys() == sparse.keys()
        np.testing.assert_allclose(r["colbert"], colbert, **UNIT_VECTORS)


def test_encode_reports_a_bad_jsonl_line(tiny_checkpoint: Path, tmp_path: Path) -> None:
    source = tmp_path / "texts.jsonl"
    source.write_text('{"text": "fine"}\n{"txt": "no text field"}\n')
    result = runner.invoke(app, ["encode", "--file", str(source), "--model", str(tiny_checkpoint)])
    assert result.exit_code != 0
    # rich wraps the box at any character: a long temporary path (pytest-xdist's) splits the file name
    assert "texts.jsonl:2" in plain(result.output).replace(" ", "") and "'text'" in plain(result.output)


def test_encode_with_a_folder_that_is_no_checkpoint(tmp_path: Path) -> None:
    """The error reaches run_cli as it is (tests/test_cli_errors.py checks the line a user sees)."""
    result = runner.invoke(app, ["encode", "hello", "--model", str(tmp_path)])
    assert result.exit_code != 0
    # checked before anything loads (cli_support.check_inputs): an expected error, named with its option
    assert isinstance(result.exception, CommandError)
    assert "is not a BGE-M3 checkpoint" in str(result.exception) and "(--model)" in str(result.exception)


def _expectations_from_reference(checkpoint: Path) -> ReferenceNumbers:
    """What the published table would say for these weights, computed by the independent torch reference."""
    ref = ReferenceM3(checkpoint)  # with transformers' own tokenizer
    e1, e2 = ref.encode(SENTENCES_1), ref.encode(SENTENCES_2)
    by_token = {ref.tokenizer.decode([int(k)]).strip(): v for k, v in e1["lexical_weights"][0].items()}
    pairs = [(q, p) for q in SENTENCES_1 for p in SENTENCES_2]
    scores = ref.compute_score(pairs, [0.4, 0.2, 0.4], max_passage_length=128)
    return ReferenceNumbers(
        dense_similarity=(e1["dense_vecs"] @ e2["dense_vecs"].T).tolist(),
        lexical_weights_by_token=by_token,
        lexical_score_s1_0_s2_0=ref.lexical_score(e1["lexical_weights"][0], e2["lexical_weights"][0]),
        lexical_score_s1_0_s1_1=ref.lexical_score(e1["lexical_weights"][0], e1["lexical_weights"][1]),
        colbert_score_s1_0_s2_0=ref.colbert_score(e1["colbert_vecs"][0], e2["colbert_vecs"][0]),
        colbert_score_s1_0_s2_1=ref.colbert_score(e1["colbert_vecs"][0], e2["colbert_vecs"][1]),
        compute_score={k: v for k, v in scores.items() if k != "sparse+dense"},
    )


def test_verify_passes_when_the_numbers_agree(tiny_checkpoint: Path, tiny_encoder: Any) -> None:
    expected = _expectations_from_reference(tiny_checkpoint)
    assert expected.lexical_weights_by_token, "need some lexical weights for the check to mean anything"
    checks = run_checks(tiny_encoder, expected, tolerance=1e-5)
    assert len(checks) == 4 + len(expected.lexical_weights_by_token) + 4 + 16
    assert all(c.ok for c in checks), format_report(checks)
    assert f"{len(checks)} of {len(checks)} checks within tolerance" in format_report(checks)


def test_verify_reports_each_difference(tiny_checkpoint: Path, tiny_encoder: Any) -> None:
    good = _expectations_from_reference(tiny_checkpoint)
    token = next(iter(good.lexical_weights_by_token))
    bad = dataclasses.replace(
        good,
        colbert_score_s1_0_s2_1=good.colbert_score_s1_0_s2_1 + 0.01,
        lexical_weights_by_token={**good.lexical_weights_by_token, token: 5.0, "notatoken": 0.1},
    )
    checks = run_checks(tiny_encoder, bad, tolerance=1e-3)
    failed = {c.name for c in checks if not c.ok}
    assert failed == {
        "colbert score s1[0]·s2[1]",
        f"lexical weight of {token!r} in s1[0]",
        "lexical weight of 'notatoken' in s1[0]",
    }
    report = format_report(checks)
    assert "FAILED" in report and "colbert score s1[0]·s2[1]" in report


def test_verify_names_weights_that_are_not_baais_in_one_message(tiny_checkpoint: Path) -> None:
    """As a user runs it on the tiny checkpoint: one line saying these are not BAAI's weights (their
    fingerprint, the sizes that differ) and that the published numbers apply only to those; exit 1."""
    from bgem3_embeddings.checkpoint.files import resolve_checkpoint
    from bgem3_embeddings.checkpoint.fingerprint import checkpoint_fingerprint

    result = subprocess.run(
        [sys.executable, "-m", "bgem3_embeddings.cli", "verify", "--model", str(tiny_checkpoint)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stdout + result.stderr
    fingerprint = checkpoint_fingerprint(resolve_checkpoint(str(tiny_checkpoint)))
    assert result.stderr.startswith(
        f"error: {tiny_checkpoint} does not hold BAAI's BGE-M3 weights (fingerprint {fingerprint[:16]}; "
    )
    assert "hidden_size 32, BAAI's 1024" in result.stderr
    assert "apply only to BAAI/bge-m3's weights" in result.stderr and "FAILED" not in result.stderr


def test_verify_of_same_sized_foreign_weights_says_so_first(
    tiny_checkpoint: Path, tiny_encoder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Weights of BAAI's sizes whose outputs are another model's (the tiny sizes declared BAAI's here):
    the first line says so with the fingerprint, then the table, and the verdict counts the failures."""
    from bgem3_embeddings import verify

    sizes = {name: getattr(tiny_encoder.config, name) for name in verify.SHAPE_FIELDS}
    monkeypatch.setattr(verify, "BAAI_SHAPE", sizes)
    result = runner.invoke(app, ["verify", "--model", str(tiny_checkpoint), "--device", "cpu"])
    assert result.exit_code == 1, result.output
    first, *rest = result.stdout.splitlines()
    assert first.startswith(f"these weights (fingerprint {tiny_encoder.fingerprint()[:16]}) do not behave")
    assert "apply only to BAAI/bge-m3's weights" in first
    assert rest[0].startswith("check ") and "dense similarity s1[0]·s2[0]" in rest[1]
    assert re.search(r"FAILED: \d+ checks \(the rows marked NO\)$", rest[-1]), rest[-1]


@pytest.mark.parametrize("args", [["encode"], ["encode", "x", "--precision", "fp8", "--model", "."]])
def test_encode_argument_errors(args: list[str], tiny_checkpoint: Path) -> None:
    if "--model" in args:
        args[args.index("--model") + 1] = str(tiny_checkpoint)
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "no texts given" in plain(result.output) or "unknown precision" in plain(result.output)


def test_encode_with_half_weights_and_float32_matmuls(tiny_checkpoint: Path, tiny_encoder: Any) -> None:
    base = ["encode", "What is BGE M3?", "--model", str(tiny_checkpoint), "--device", "cpu"]
    result = runner.invoke(app, [*base, "--precision", "bfloat16", "--compute-dtype", "float32"])
    assert result.exit_code == 0, result.output
    dense = np.array(json.loads(result.stdout.splitlines()[-1])["dense"])
    expected = tiny_encoder.encode(["What is BGE M3?"])["dense_vecs"][0]
    assert 0.999 < float(dense @ expected) < 1.0  # bf16-rounded weights: close to fp32, not identical
    bad = runner.invoke(app, [*base, "--precision", "bfloat16", "--compute-dtype", "float16"])
    assert bad.exit_code == 2
    assert "compute_dtype 'float16' is not possible with bfloat16 weights" in plain(bad.output)


def test_verify_command_accepts_int8(
    tiny_checkpoint: Path, tiny_encoder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """int8 runs the same checks (with its own default tolerance, shown in the report)."""
    from bgem3_embeddings import verify

    sizes = {name: getattr(tiny_encoder.config, name) for name in verify.SHAPE_FIELDS}
    monkeypatch.setattr(verify, "BAAI_SHAPE", sizes)  # the tiny sizes pass for BAAI's: the checks run
    result = runner.invoke(
        app, ["verify", "--model", str(tiny_checkpoint), "--device", "cpu", "--precision", "int8"]
    )
    assert result.exit_code == 1, result.output  # tiny random weights: the numbers differ
    assert "dense similarity s1[0]·s2[0]" in result.output and "FAILED" in result.output
    assert "within tolerance 0.02;" in result.output, result.output


def test_a_cut_text_is_said_once_with_its_counts(tiny_checkpoint: Path, tiny_encoder: Any) -> None:
    """Issue 58, item 7: `bgem3 encode` past --max-length and `bgem3 explain` past the query's 512 tokens
    say how many tokens the text had and how many were read, once."""
    long = "sourdough starter " * 400
    whole = len(tiny_encoder.tokenizer.encode_batch([long], 10**6)[0])
    model = ["--model", str(tiny_checkpoint), "--device", "cpu"]
    result = runner.invoke(app, ["encode", long, "short", "--max-length", "64", *model])
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == (
        f"warning: 1 of 2 texts have more tokens than the model reads (text 1: {whole:,}): only the first 64 "
        "of each were used (max length) (--max-length)"
    )
    assert len(result.stdout.splitlines()) == 2
    quiet = runner.invoke(app, ["encode", "short", *model])
    assert quiet.exit_code == 0 and quiet.stderr == "", quiet.stderr

    result = runner.invoke(app, ["explain", long, "a passage about sourdough", *model])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stdout.splitlines() if line.startswith("note:")]
    assert notes == [
        f"note: the query has {whole:,} tokens, more than the model reads: only its first 512 were used "
        "(max length)"
    ]
    as_json = json.loads(runner.invoke(app, ["explain", long, "p", "--json", *model]).stdout)
    assert as_json["query"]["truncated"] and as_json["query"]["token_count"] == whole


def test_an_empty_text_is_one_usage_line(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """Issue 58, item 10: the rule every text a user sends follows (query_text.is_blank), before any model
    loads: `bgem3 encode ""` as a user runs it, then the other commands' texts and a --file line."""
    from tests.support import assert_clean_failure, run_module

    said = "is empty (or only whitespace): give some text"
    done = run_module("bgem3_embeddings.cli", "encode", "", "--model", str(tiny_checkpoint))
    assert_clean_failure(done, 2, f"the text {said}", "TEXTS")
    assert done.stdout == ""
    model = ["--model", str(tiny_checkpoint)]
    source = tmp_path / "texts.jsonl"
    source.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": " \t"}) + "\n")
    for args, phrase in [
        (["encode", "fine", "  ", *model], f"text 2 {said}"),
        (["encode", "--file", str(source), *model], f"{source}:2: its text {said}"),
        (["rerank", "tea", "green tea", "\n", *model], f"passage 2 {said}"),
        (["explain", "tea", " ", *model], f"the passage {said}"),
    ]:
        result = runner.invoke(app, args)
        squeezed = plain(result.output).replace(" ", "")  # rich wraps the line anywhere
        assert result.exit_code == 2 and phrase.replace(" ", "") in squeezed, (args, result.output)
