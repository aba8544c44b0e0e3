"""`bgem3 bench-serve --soak` as a user runs it: a short soak of a real `bgem3 serve` process on the tiny
checkpoint named by BGEM3_MODEL (bench-serve reads it as every command does), every request of the mix
answered with its expected status, the report's figures, the server's exit status after SIGTERM."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.optional import require_module

require_module("fastapi", reason="the server needs the serve extra")

from bgem3_embeddings.serve.soak import KINDS, SoakResult, parse_mix  # noqa: E402
from tests.support import assert_clean_failure, run_module  # noqa: E402


def test_a_short_soak(tiny_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    mix = "openai=1,tei-root=1,tokenize=1,all=1,bad=2"
    done = run_module(
        "bgem3_embeddings.cli", "bench-serve", "--soak", "12", "--clients", "3", "--mix", mix,
        "--sample-every", "2", "--json", str(out),
        env={"BGEM3_MODEL": str(tiny_checkpoint)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert str(tiny_checkpoint) in done.stdout  # the model came from BGEM3_MODEL
    assert "unexpected: 0" in done.stdout and "server exit status after SIGTERM: 0" in done.stdout
    figures = json.loads(out.read_text())
    assert figures["unexpected"] == 0 and figures["exit_code"] == 0
    # a few requests per client even on a loaded 2-vCPU machine (fewer than 20 in 8 s were seen at load 15)
    assert figures["requests"] == sum(figures["statuses"].values()) >= 12
    kinds = {key.split()[0] for key in figures["statuses"]}
    assert kinds == {"openai", "tei-root", "tokenize", "all", "bad"}, figures["statuses"]
    assert {key for key in figures["statuses"] if key.startswith("bad")} <= {"bad 400", "bad 422"}
    assert figures["p50_ms"] is not None and figures["p99_ms"] >= figures["p50_ms"] > 0
    samples = figures["samples"]
    assert len(samples) >= 4 and all(s["rss_mb"] > 50 for s in samples)
    assert [s["requests"] for s in samples] == sorted(s["requests"] for s in samples)


def test_bad_mix_is_one_line() -> None:
    done = run_module("bgem3_embeddings.cli", "bench-serve", "--soak", "5", "--mix", "openai=1,nope=2")
    assert_clean_failure(done, 2, "--mix", "'nope=2'", "openai")


def test_drift_is_the_slope_after_warm_up() -> None:
    from bgem3_embeddings.serve.soak import Sample

    result = SoakResult(duration_s=1000, clients=1, mix=parse_mix("openai=1"))
    # 100 MB in the first 200 s (warm-up), then +1 MB per 100 s: 6 MB per 10 minutes
    result.samples = [
        Sample(t, t, 500 + min(t, 200) / 2 + max(t - 200, 0) / 100, 0.0) for t in range(0, 1001, 50)
    ]
    assert result.warmup_s() == 200
    fit = result.drift_fit(result.warmup_s())
    assert fit is not None and fit[0] == pytest.approx(6.0)
    assert fit == pytest.approx((6.0, 0.0), abs=1e-9)  # a straight line: no error
    assert set(parse_mix("openai=3,bad=1")) <= set(KINDS)


def test_drift_error_is_the_slopes_standard_error() -> None:
    """The +/- of the report is scipy's standard error of a least-squares slope (sawtooth on a slow rise)."""
    from scipy.stats import linregress

    from bgem3_embeddings.serve.soak import Sample

    rng = np.random.default_rng(0)
    times = np.arange(0.0, 1800.0, 2.0)
    rss = 1100 + times / 600 * 0.5 + 25 * ((times % 10) / 10) + rng.normal(0, 3, times.size)
    result = SoakResult(duration_s=1800, clients=1, mix=parse_mix("openai=1"))
    result.samples = [Sample(float(t), int(t), float(r), 0.0) for t, r in zip(times, rss, strict=True)]
    after = times >= result.warmup_s()
    reference = linregress(times[after], rss[after])
    slope, stderr = result.drift_fit(result.warmup_s()) or (None, None)
    assert slope == pytest.approx(reference.slope * 600, rel=1e-9)
    assert stderr == pytest.approx(reference.stderr * 600, rel=1e-9)
    assert 0 < stderr < 1  # 2 s samples over 25 minutes read the slope to well under 1 MB per 10 minutes
    report = result.format("soak")
    assert f"drift {slope:+.2f} +/- {2 * stderr:.2f} MB per 10 minutes" in report
    assert result.to_json()["drift_stderr_mb_per_10min"] == pytest.approx(stderr)


def test_heap_trimmer_runs_at_most_once_per_interval() -> None:
    import sys

    from bgem3_embeddings.serve.memory import HeapTrimmer

    trimmer = HeapTrimmer(every_s=10)
    if not sys.platform.startswith("linux"):
        assert not trimmer.available and not trimmer.maybe_trim(100.0)
        return
    assert trimmer.available
    assert [trimmer.maybe_trim(t) for t in (100.0, 105.0, 109.9, 110.0, 111.0)] == [
        True,
        False,
        False,
        True,
        False,
    ]


def test_the_soak_reads_rss_and_load_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on macOS (no /proc: RSS from `ps`) and Windows (no os.getloadavg): the soak still samples the
    server's memory, the report and JSON say '-' / null for the load, and the drift is read from the RSS."""
    import os
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from bgem3_embeddings.serve import soak

    class Ok(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.delattr(os, "getloadavg")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        result = soak.run_soak(url, os.getpid(), 3.0, 2, parse_mix("openai=1"), sample_every_s=0.25)
    finally:
        server.shutdown()
    assert result.unexpected_count == 0 and result.requests > 0
    own_rss = soak._ps_rss_mb(os.getpid())
    assert len(result.samples) >= 8
    assert all(0.5 * own_rss < s.rss_mb < 2 * own_rss for s in result.samples), result.samples
    assert all(s.load is None for s in result.samples)
    assert soak.rss_mb(os.getpid())[1] is None  # no peak off Linux
    report = result.format("soak")
    assert "drift" in report and "not enough readable samples" not in report
    rows = [line.split() for line in report.splitlines()]
    rows = [row for row in rows if len(row) == 4 and row[0].isdigit()]  # t, requests, VmRSS, load
    assert len(rows) == len(result.samples) and all(row[-1] == "-" for row in rows)
    figures = result.to_json()
    assert figures["drift_mb_per_10min"] is not None
    assert all(s["load"] is None and s["rss_mb"] > 0 for s in figures["samples"])


def test_unreadable_rss_is_shown_not_zero() -> None:
    from bgem3_embeddings.serve.soak import Sample, rss_mb

    assert np.isnan(rss_mb(2**22 + 12345)[0])  # no such process
    result = SoakResult(duration_s=100, clients=1, mix=parse_mix("openai=1"))
    result.samples = [Sample(float(t), t, float("nan"), 1.0) for t in range(0, 101, 10)]
    assert result.drift_fit(result.warmup_s()) is None
    report = result.format("soak")
    assert "RSS drift: not enough readable samples after the warm-up" in report
    assert json.loads(json.dumps(result.to_json()))["samples"][0]["rss_mb"] is None
