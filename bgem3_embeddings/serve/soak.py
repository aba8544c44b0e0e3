"""`bgem3 bench-serve --soak SECONDS`: sustained mixed traffic against one `bgem3 serve` process.

`clients` threads send requests back to back for the whole duration, each request drawn from a weighted
mix of kinds (`--mix openai=3,tei=2,...`): OpenAI dense, TEI dense and sparse, TEI's root route and
/tokenize, all three outputs, and malformed requests that must be refused. Every answer's status is checked
against what that kind must get; the report gives requests, statuses, p50 / p99 latency of the answered
requests, the server's resident memory (VmRSS on Linux, `ps` elsewhere) sampled over time with the load
average where the OS has one, the memory drift
after warm-up (a least-squares line through the samples, in MB per 10 minutes), and the server's exit status
after SIGTERM.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# A request: (path, JSON body or raw bytes, the statuses it must get).
Request = tuple[str, Any, tuple[int, ...]]
Maker = Callable[[np.random.Generator], Request]

DEFAULT_MIX = "openai=3,tei=2,tei-sparse=2,tei-root=1,tokenize=1,all=2,bad=1"
OK = (200,)


def _texts(rng: np.random.Generator) -> list[str]:
    """1-4 texts: mostly short queries (3-16 words), now and then a passage (40-300 words)."""
    from bgem3_embeddings.bench.corpus import _draft_text

    out = []
    for _ in range(int(rng.integers(1, 5))):
        words = int(rng.integers(40, 301)) if rng.random() < 0.2 else int(rng.integers(3, 17))
        out.append(_draft_text(rng, words))
    return out


def _bad(rng: np.random.Generator) -> Request:
    """A malformed request, one of five: each is refused with the status its wire format gives."""
    which = int(rng.integers(5))
    if which == 0:
        return "/v1/embeddings", b'{"input": ["unterminated', (400,)
    if which == 1:
        return "/v1/embeddings", {"input": 5}, (422,)
    if which == 2:
        return "/embed", {"inputs": []}, (400,)
    if which == 3:
        return "/v1/bgem3/encode", {"input": ["x"], "return_colbert": True}, (422,)
    return "/embed_sparse", {"texts": ["x"]}, (422,)


KINDS: dict[str, Maker] = {
    "openai": lambda rng: ("/v1/embeddings", {"input": _texts(rng)}, OK),
    "tei": lambda rng: ("/embed", {"inputs": _texts(rng)}, OK),
    "tei-sparse": lambda rng: ("/embed_sparse", {"inputs": _texts(rng)}, OK),
    "tei-root": lambda rng: ("/", {"inputs": _texts(rng)[0]}, OK),
    "tokenize": lambda rng: ("/tokenize", {"inputs": _texts(rng)}, OK),
    "all": lambda rng: (
        "/v1/bgem3/encode",
        {
            "input": _texts(rng),
            "return_sparse": True,
            "return_colbert_vecs": True,
            "encoding_format": "base64",
        },
        OK,
    ),
    "bad": _bad,
}


def rss_mb(pid: int) -> tuple[float, float | None]:
    """(resident, peak resident) memory of a process in MB: VmRSS and VmHWM on Linux; elsewhere (macOS, BSD)
    the resident size `ps` reports and no peak (None: the caller keeps the highest it sampled). NaN when
    neither can be read (no such process, no `ps`)."""
    if sys.platform.startswith("linux"):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return math.nan, None
        found = re.findall(r"^(VmRSS|VmHWM):\s+(\d+)", status, re.M)
        values = {k: float(v) / 1024 for k, v in found}
        return values.get("VmRSS", math.nan), values.get("VmHWM")
    return _ps_rss_mb(pid), None


def _ps_rss_mb(pid: int) -> float:
    """The resident size `ps -o rss= -p PID` reports (KiB on macOS, the BSDs and Linux), in MB."""
    try:
        done = subprocess.run(
            ["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return math.nan
    text = done.stdout.strip()
    return float(text) / 1024 if done.returncode == 0 and text.isdigit() else math.nan


def load_average() -> float | None:
    """The machine's 1-minute load average; None where the OS has none (Windows)."""
    getloadavg = getattr(os, "getloadavg", None)
    if getloadavg is None:
        return None
    try:
        return float(getloadavg()[0])
    except OSError:  # "load average unobtainable"
        return None


def parse_mix(text: str) -> dict[str, int]:
    """ "openai=3,bad=1" -> {"openai": 3, "bad": 1}; ValueError naming the option for anything else."""
    mix: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, _, weight = part.partition("=")
        name = name.strip()
        if name not in KINDS or not weight.strip().isdigit():
            raise ValueError(
                f"--mix takes KIND=WEIGHT pairs, comma-separated, KIND one of {', '.join(KINDS)}; "
                f"not {part!r}"
            )
        mix[name] = int(weight)
    if not mix or sum(mix.values()) == 0:
        raise ValueError("--mix needs at least one kind with a weight above 0")
    return mix


def slope_with_error(x: Sequence[float], y: Sequence[float]) -> tuple[float, float] | None:
    """Least-squares slope of y over x and its standard error (units of y per unit of x); None with fewer
    than 3 points or no spread in x. The soak's drift and benchmarks/findings/soak_windows.py both read it."""
    if len(x) < 3:
        return None
    t = np.asarray(x, dtype=np.float64)
    values = np.asarray(y, dtype=np.float64)
    spread = float(np.sum((t - t.mean()) ** 2))
    if spread == 0.0:
        return None
    (slope, _intercept), residuals, *_ = np.polyfit(t, values, 1, full=True)
    residual_ss = float(residuals[0]) if len(residuals) else 0.0
    return float(slope), float(np.sqrt(residual_ss / (len(t) - 2) / spread))


@dataclass
class Sample:
    """The server's memory and the machine's load at one moment of the soak."""

    seconds: float
    requests: int
    rss_mb: float  # NaN: not readable
    load: float | None  # 1-minute load average of the machine (None: the OS has none)


@dataclass
class SoakResult:
    duration_s: float
    clients: int
    mix: dict[str, int]
    statuses: Counter[str] = field(default_factory=Counter)  # "kind status" -> count
    unexpected: list[str] = field(default_factory=list)  # the first few unexpected answers
    unexpected_count: int = 0
    latencies_ms: list[float] = field(default_factory=list, repr=False)  # answered as expected
    samples: list[Sample] = field(default_factory=list)
    exit_code: int | None = None
    seconds: float = 0.0

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    def percentile(self, q: float) -> float | None:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else None

    def drift_fit(self, warmup_s: float) -> tuple[float, float] | None:
        """(slope, its standard error) of VmRSS after `warmup_s`, both in MB per 10 minutes; None: too few
        samples. The error says how far the sawtooth of transient buffers lets the slope be read: a drift
        within the target is shown only when the slope plus two standard errors is."""
        after = [s for s in self.samples if s.seconds >= warmup_s and not math.isnan(s.rss_mb)]
        fit = slope_with_error([s.seconds for s in after], [s.rss_mb for s in after])
        return None if fit is None else (fit[0] * 600, fit[1] * 600)

    def warmup_s(self) -> float:
        """A fifth of the run, at most five minutes: the first allocations of every code path."""
        return min(self.duration_s / 5, 300.0)

    def format(self, header: str) -> str:
        p50, p99 = self.percentile(50), self.percentile(99)
        fit = self.drift_fit(self.warmup_s())
        rate = self.requests / max(self.seconds, 1e-9)
        mix = ",".join(f"{k}={w}" for k, w in self.mix.items())
        first = f" (first: {self.unexpected[0]})" if self.unexpected else ""
        lines = [
            header,
            "",
            f"{self.requests} requests in {self.seconds:.0f} s ({rate:.0f}/s) from {self.clients} clients, "
            f"mix {mix}",
            "statuses: " + ", ".join(f"{k} {n}" for k, n in sorted(self.statuses.items())),
            f"unexpected: {self.unexpected_count}{first}",
            f"latency of answered requests: p50 {_ms(p50)} ms, p99 {_ms(p99)} ms",
            f"server exit status after SIGTERM: {self.exit_code}",
            "",
            f"{'t (s)':>7} {'requests':>9} {'VmRSS MB':>9} {'load 1m':>8}",
        ]
        lines += [
            f"{s.seconds:>7.0f} {s.requests:>9} {_num(s.rss_mb, 1):>9} {_num(s.load, 2):>8}"
            for s in self.samples
        ]
        if fit is None:
            lines.append("RSS drift: not enough readable samples after the warm-up")
        else:
            after = [s for s in self.samples if s.seconds >= self.warmup_s() and not math.isnan(s.rss_mb)]
            lines.append(
                f"RSS after the {self.warmup_s():.0f} s warm-up: {after[0].rss_mb:.1f} -> "
                f"{after[-1].rss_mb:.1f} MB, drift {fit[0]:+.2f} +/- {2 * fit[1]:.2f} MB per 10 minutes "
                f"(least squares over {len(after)} samples; +/- two standard errors)"
            )
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        fit = self.drift_fit(self.warmup_s())
        return {
            "duration_s": self.duration_s,
            "seconds": self.seconds,
            "clients": self.clients,
            "mix": self.mix,
            "requests": self.requests,
            "statuses": dict(self.statuses),
            "unexpected": self.unexpected_count,
            "unexpected_examples": self.unexpected,
            "p50_ms": self.percentile(50),
            "p99_ms": self.percentile(99),
            "samples": [
                {**s.__dict__, "rss_mb": None if math.isnan(s.rss_mb) else s.rss_mb} for s in self.samples
            ],
            "warmup_s": self.warmup_s(),
            "drift_mb_per_10min": None if fit is None else fit[0],
            "drift_stderr_mb_per_10min": None if fit is None else fit[1],
            "exit_code": self.exit_code,
        }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _num(value: float | None, digits: int) -> str:
    """A figure of the report; '-' for one that could not be read (None or NaN)."""
    return "-" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def run_soak(
    url: str,
    pid: int,
    duration_s: float,
    clients: int,
    mix: dict[str, int],
    sample_every_s: float = 10.0,
    seed: int = 0,
) -> SoakResult:
    """Drive the server at `url` (process `pid`) for `duration_s`; the result holds every figure."""
    import httpx

    result = SoakResult(duration_s=duration_s, clients=clients, mix=dict(mix))
    kinds = [k for k, w in mix.items() if w > 0]
    weights = np.asarray([mix[k] for k in kinds], dtype=float)
    weights /= weights.sum()
    lock = threading.Lock()
    start = time.monotonic()
    deadline = start + duration_s

    def client(n: int) -> None:
        rng = np.random.default_rng(seed * 1000 + n)
        latencies: list[float] = []
        with httpx.Client(base_url=url, timeout=120) as c:
            while time.monotonic() < deadline:
                kind = kinds[int(rng.choice(len(kinds), p=weights))]
                path, body, expected = KINDS[kind](rng)
                t0 = time.perf_counter()
                try:
                    if isinstance(body, bytes):
                        r = c.post(path, content=body, headers={"Content-Type": "application/json"})
                    else:
                        r = c.post(path, json=body)
                    status = str(r.status_code)
                    ok = r.status_code in expected
                    detail = r.text[:160]
                except httpx.HTTPError as err:
                    status, ok, detail = type(err).__name__, False, str(err)[:160]
                elapsed = (time.perf_counter() - t0) * 1000
                if ok:
                    latencies.append(elapsed)
                with lock:
                    result.statuses[f"{kind} {status}"] += 1
                    if not ok:
                        result.unexpected_count += 1
                        if len(result.unexpected) < 5:
                            result.unexpected.append(f"{kind} {path} -> {status}: {detail}")
        with lock:
            result.latencies_ms.extend(latencies)

    def sample() -> None:
        with lock:
            done = result.requests
        result.samples.append(Sample(time.monotonic() - start, done, rss_mb(pid)[0], load_average()))

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    sample()
    for t in threads:
        t.start()
    while time.monotonic() < deadline:
        time.sleep(max(0.0, min(sample_every_s, deadline - time.monotonic())))
        sample()
    for t in threads:
        t.join(180)
    result.seconds = time.monotonic() - start
    return result


def stop_server(proc: Any, timeout_s: float = 60) -> int | None:
    """SIGTERM, then the exit status (None if it did not exit in time)."""
    proc.send_signal(signal.SIGTERM)
    try:
        return int(proc.wait(timeout_s))
    except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: reported as None, the caller kills it
        return None


def write_json(path: Any, header: str, result: SoakResult) -> None:
    path.write_text(json.dumps({"header": header, **result.to_json()}, indent=2) + "\n")
