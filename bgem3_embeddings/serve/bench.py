"""`bgem3 bench-serve`: the server against in-process `encode`, side by side, in one run.

Two workloads, built with the checkpoint's own tokenizer: short queries (8-16 tokens, `encode_queries`) and
passages of 256-512 tokens (`encode_corpus`). In this process the encoder runs them (a) one text per call,
for single-text latency, and (b) all in one call, the best throughput `encode` gets. Then a `bgem3 serve`
process on the same checkpoint and precision gets them from 1, 4 and 16 concurrent clients (threads here,
one text per request, `/v1/bgem3/encode` with base64 numbers), and the report gives texts/s, tokens/s,
p50 / p95 latency per request and the server's resident memory (VmRSS / VmHWM, one model for all clients).

Clients and server share the machine: on a small one the clients' own CPU time is part of the figures.

`--soak SECONDS` instead drives one server with a mix of requests for that long and reports statuses,
latency and the server's memory over time (`soak.py`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from bgem3_embeddings.checkpoint.files import DEFAULT_MODEL_ID
from bgem3_embeddings.cli_options import PrecisionOpt
from bgem3_embeddings.serve.soak import (
    DEFAULT_MIX,
    KINDS,
    load_average,
    parse_mix,
    rss_mb,
    run_soak,
    stop_server,
    write_json,
)

QUERY_TOKENS = (8, 16)
PASSAGE_TOKENS = (256, 512)
START_TIMEOUT_S = 900


@dataclass
class Row:
    """One measured configuration."""

    engine: str  # "in-process" or "server"
    workload: str  # "queries" or "passages"
    clients: int  # concurrent clients (in-process: 1)
    how: str  # "one per call", "one call", "one per request"
    texts: int
    tokens: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    server_rss_mb: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def texts_per_s(self) -> float:
        return self.texts / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float | None:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else None

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k != "latencies_ms"}
        out.update(
            tokens_per_s=self.tokens_per_s,
            texts_per_s=self.texts_per_s,
            p50_ms=self.percentile(50),
            p95_ms=self.percentile(95),
        )
        return out


def make_texts(tokenizer: Any, n: int, tokens: tuple[int, int], seed: int) -> list[str]:
    """n texts of `tokens` (low, high) tokens each, special tokens included, cut at token boundaries."""
    from bgem3_embeddings.bench.corpus import _draft_text

    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(n):
        target = int(rng.integers(tokens[0], tokens[1] + 1)) - 2  # room for <s> and </s>
        words = max(2, target)
        while True:
            draft = _draft_text(rng, words)
            offsets = tokenizer(draft, add_special_tokens=False, return_offsets_mapping=True)[
                "offset_mapping"
            ]
            if len(offsets) >= target:
                break
            words *= 2
        texts.append(draft[: offsets[target - 1][1]].strip())
    return texts


# ---------------------------------------------------------------------------- in-process
def in_process(encoder: Any, texts: list[str], workload: str, outputs: dict[str, bool]) -> list[Row]:
    """One text per call (latency) and all texts in one call (throughput), after a warm-up."""
    method = encoder.encode_queries if workload == "queries" else encoder.encode_corpus
    tokens = sum(len(ids) for ids in encoder.tokenize(texts, 8192))
    for text in texts[:3]:
        method([text], **outputs)
    method(texts[: min(len(texts), 32)], **outputs)
    latencies = []
    start = time.perf_counter()
    for text in texts:
        t0 = time.perf_counter()
        method([text], **outputs)
        latencies.append((time.perf_counter() - t0) * 1000)
    single = Row(
        "in-process", workload, 1, "one per call", len(texts), tokens, time.perf_counter() - start, latencies
    )
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        method(texts, **outputs)
        best = min(best, time.perf_counter() - t0)
    return [single, Row("in-process", workload, 1, "one call", len(texts), tokens, best)]


# ---------------------------------------------------------------------------- server
@contextlib.contextmanager
def server_process(
    model: str, precision: str, extra: list[str], source: Path | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`bgem3 serve --port 0` in its own process; yields (process, url) once /health says ok.

    `source`: a checkout of another commit whose `bgem3_embeddings` the server runs instead of this one
    (a baseline measured beside the current code, same interpreter and packages)."""
    import httpx

    log = tempfile.NamedTemporaryFile("w+b", suffix=".log", delete=False)  # noqa: SIM115 - read while it runs
    cmd = [
        sys.executable,
        "-m",
        "bgem3_embeddings.cli",
        "serve",
        "--model",
        model,
        "--precision",
        precision,
        "--port",
        "0",
        "--log-level",
        "warning",
        *extra,
    ]
    env = None
    if source is not None:  # `-m` puts the working directory first on sys.path: run from the checkout
        env = {**os.environ, "PYTHONPATH": str(source)}
        if Path(model).exists():  # a local checkpoint named relative to here
            cmd[cmd.index("--model") + 1] = str(Path(model).resolve())
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, cwd=source, env=env)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        url = None
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited: {Path(log.name).read_text(errors='replace')[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start in time")
            if url is None:
                found = re.search(r"on (http://[\d.]+:\d+)", Path(log.name).read_text(errors="replace"))
                url = found.group(1) if found else None
            else:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                        break
            time.sleep(0.2)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        os.unlink(log.name)


def through_server(
    url: str, texts: list[str], workload: str, clients: int, outputs: dict[str, bool], max_length: int
) -> Row:
    """`clients` threads, each sending one text per request until the texts are done."""
    import httpx

    latencies: list[float] = []
    tokens = 0
    lock = threading.Lock()
    next_index = iter(range(len(texts)))
    errors: list[str] = []

    def client() -> None:
        nonlocal tokens
        with httpx.Client(base_url=url, timeout=600) as c:
            while True:
                with lock:
                    i = next(next_index, None)
                if i is None:
                    return
                body = {"input": [texts[i]], "max_length": max_length, "encoding_format": "base64", **outputs}
                t0 = time.perf_counter()
                r = c.post("/v1/bgem3/encode", json=body)
                elapsed = (time.perf_counter() - t0) * 1000
                if r.status_code != 200:
                    errors.append(r.text[:200])
                    return
                with lock:
                    latencies.append(elapsed)
                    tokens += int(r.json()["usage"]["total_tokens"])

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"the server answered an error: {errors[0]}")
    return Row("server", workload, clients, "one per request", len(texts), tokens, seconds, latencies)


# ---------------------------------------------------------------------------- report
def format_report(rows: list[Row], header: str) -> str:
    lines = [
        header,
        "",
        f"{'workload':<9} {'engine':<11} {'clients':>7} {'how':<15} {'texts/s':>9} "
        f"{'tokens/s':>10} {'p50 ms':>8} {'p95 ms':>8} {'vs one call':>11} {'server RSS MB':>13}",
    ]
    for workload in ("queries", "passages"):
        best = next((r for r in rows if r.workload == workload and r.how == "one call"), None)
        for r in (r for r in rows if r.workload == workload):
            p50, p95 = r.percentile(50), r.percentile(95)
            ratio = f"{r.tokens_per_s / best.tokens_per_s:.2f}x" if best and best.tokens_per_s else "-"
            lines.append(
                f"{workload:<9} {r.engine:<11} {r.clients:>7} {r.how:<15} {r.texts_per_s:>9.1f} "
                f"{r.tokens_per_s:>10.0f} {p50 if p50 is not None else float('nan'):>8.1f} "
                f"{p95 if p95 is not None else float('nan'):>8.1f} {ratio:>11} "
                f"{r.server_rss_mb if r.server_rss_mb is not None else float('nan'):>13.0f}"
            )
    return "\n".join(lines)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def bench_serve(
    model: Annotated[
        str, typer.Option("--model", "-m", help="Hub id or local checkpoint.", envvar="BGEM3_MODEL")
    ] = DEFAULT_MODEL_ID,
    precision: PrecisionOpt = "float32",
    clients: Annotated[str, typer.Option(help="Concurrent clients, comma-separated.")] = "1,4,16",
    queries: Annotated[int, typer.Option(min=16, help="Short queries (8-16 tokens).")] = 256,
    passages: Annotated[int, typer.Option(min=16, help="Passages (256-512 tokens).")] = 64,
    outputs: Annotated[str, typer.Option(help="all (dense + sparse + ColBERT) or dense.")] = "all",
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures here.")] = None,
    soak: Annotated[
        float,
        typer.Option(
            min=0,
            help="Soak instead: SECONDS of mixed traffic from the largest --clients; statuses, p50/p99, "
            "server RSS over time.",
        ),
    ] = 0.0,
    mix: Annotated[str, typer.Option(help="Soak: KIND=WEIGHT,... (kinds: " + ", ".join(KINDS) + ").")] = (
        DEFAULT_MIX
    ),
    sample_every: Annotated[float, typer.Option(min=0.5, help="Soak: seconds between RSS samples.")] = 10.0,
) -> None:
    """Throughput and p50/p95 latency of `bgem3 serve` at 1, 4 and 16 clients next to in-process encode;
    or, with --soak, the server under sustained mixed traffic."""
    from bgem3_embeddings.cli_support import check_inputs, start_tensorflow_quietly
    from bgem3_embeddings.serve.cli import check_serve_extra

    check_serve_extra()  # the server it starts needs it
    check_inputs(model)
    if outputs not in ("all", "dense"):
        raise typer.BadParameter("all or dense", param_hint="--outputs")
    try:
        levels = [int(c) for c in clients.split(",") if c.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise typer.BadParameter(
            f"positive integers, comma-separated, not {clients!r}", param_hint="--clients"
        )
    if soak > 0:
        try:
            weights = parse_mix(mix)
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--mix") from err
        _soak(model, precision, soak, max(levels), weights, sample_every, json_out)
        return
    wanted = {
        "return_dense": True,
        "return_sparse": outputs == "all",
        "return_colbert_vecs": outputs == "all",
    }
    start_tensorflow_quietly()
    from bgem3_embeddings.encoder import BGEM3Encoder

    encoder = BGEM3Encoder(model, precision=precision, show_progress=False)
    workloads = {
        "queries": make_texts(encoder.tokenizer, queries, QUERY_TOKENS, seed=1),
        "passages": make_texts(encoder.tokenizer, passages, PASSAGE_TOKENS, seed=2),
    }
    lengths = {"queries": encoder.query_max_length, "passages": encoder.passage_max_length}
    rows: list[Row] = []
    for workload, texts in workloads.items():
        typer.echo(f"in-process: {workload}", err=True)
        rows += in_process(encoder, texts, workload, wanted)
    size = f"hidden {encoder.hidden_size}, {encoder.config.num_hidden_layers} layers"
    del encoder  # the server gets the machine's memory and cores to itself from here
    with server_process(model, precision, []) as (proc, url):
        pid = proc.pid
        for workload, texts in workloads.items():
            through_server(url, texts[:16], workload, 4, wanted, lengths[workload])  # warm-up
            for level in levels:
                typer.echo(f"server: {workload}, {level} clients", err=True)
                row = through_server(url, texts, workload, level, wanted, lengths[workload])
                row.server_rss_mb = rss_mb(pid)[0]
                rows.append(row)
        # off Linux no peak is readable: the highest of the samples
        peak = rss_mb(pid)[1] or max((r.server_rss_mb or 0.0) for r in rows)
    header = (
        f"bgem3 bench-serve: {model} ({size}, {precision}), outputs {outputs}; CPU {cpu_model()}, "
        f"{os.cpu_count()} cores; server peak RSS {peak:.0f} MB"
    )
    typer.echo(format_report(rows, header))
    if json_out is not None:
        json_out.write_text(
            json.dumps(
                {"header": header, "rows": [r.to_dict() for r in rows], "server_peak_rss_mb": peak}, indent=2
            )
        )


def _load_text() -> str:
    load = load_average()
    return "-" if load is None else f"{load:.2f}"


def _soak(
    model: str,
    precision: str,
    seconds: float,
    clients: int,
    weights: dict[str, int],
    sample_every: float,
    json_out: Path | None,
) -> None:
    """`bench-serve --soak`: one server, `clients` threads of mixed traffic, then SIGTERM."""
    typer.echo(f"soak: starting bgem3 serve on {model}", err=True)
    with server_process(model, precision, []) as (proc, url):
        typer.echo(f"soak: {seconds:.0f} s, {clients} clients on {url}", err=True)
        result = run_soak(url, proc.pid, seconds, clients, weights, sample_every_s=sample_every)
        result.exit_code = stop_server(proc)
    header = (
        f"bgem3 bench-serve --soak: {model} ({precision}); CPU {cpu_model()}, {os.cpu_count()} cores, "
        f"load average at the end {_load_text()}"
    )
    typer.echo(result.format(header))
    if json_out is not None:
        write_json(json_out, header, result)
    if result.unexpected_count or result.exit_code != 0:
        raise typer.Exit(1)
