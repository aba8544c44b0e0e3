"""Kernel time from a profiler's Chrome trace: which kernels ran, grouped by kind, how busy the device was.

Reads the two traces benchmarks/gpu_profile.py writes, in the Chrome trace event format both profilers use:

- JAX's `jax.profiler` trace (`create_perfetto_trace=True`): a GPU's kernels are complete events ("ph": "X")
  on a process named "/device:GPU:N ..."; XLA's own op name is in the event's args where the profiler puts it.
- PyTorch's `torch.profiler` `export_chrome_trace`: GPU kernels are events of category "kernel" (copies and
  sets "gpu_memcpy" / "gpu_memset").

Where a trace holds no GPU event (a run on the CPU, as `make test` runs it) the host's op events stand in:
XLA:CPU's thunks, PyTorch's outermost `aten::` ops. The summary says which it read.

Each selected event keeps only its outermost occurrence per thread (an event inside another of the same
thread is already counted); busy time is the union of the selected intervals, so work on two streams at once
counts once. Device idle = wall time - busy time: host overhead the device waited through.

    >>> kind_of("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64")
    'gemm'
    >>> kind_of("void at::native::vectorized_layer_norm_kernel<c10::Half, float>")
    'norm / reduce'
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# First match wins, on the lower-cased kernel name and XLA op name. The order matters: a cuDNN attention
# kernel names "gemm"-like tiles, a GELU fusion can name "add".
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("flash", "fmha", "attention", "sdpa", "softmax", "cudnn")),
    ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "cublas", "matmul", "wgmma", "linear", "addmm", "mkl")),
    ("gelu", ("gelu", "erf")),
    ("norm / reduce", ("layer_norm", "layernorm", "native_layer_norm", "reduce", "norm")),
    (
        "copy / convert",
        ("memcpy", "memset", "copy", "convert", "transpose", "cast", "to_copy", "concatenate"),
    ),
    ("other elementwise", ("fusion", "elementwise", "add", "mul", "div", "select", "broadcast", "where")),
)
OTHER = "other"
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# Lines of a JAX GPU trace that repeat the kernels' time under another name.
DERIVED = ("xla ops", "xla modules", "steps", "framework", "tensorflow", "source")
# XLA:CPU's bookkeeping events on its threads, which are not ops.
HOST_BOOKKEEPING = ("ThreadpoolListener", "end: ", "SlinkyThreadPool", "ThunkExecutor", "CommonPjRt", "$")


@dataclass(frozen=True)
class Event:
    name: str
    op: str  # XLA's op name where the profiler gives one, else ""
    module: str  # XLA's module (jit_encoder_stack, ...) where the profiler gives one, else ""
    start_us: float
    duration_us: float
    lane: tuple[Any, Any]  # (pid, tid): one stream or thread
    lane_name: str  # that stream's or thread's name in the trace, "" where it has none


def kind_of(name: str, op: str = "") -> str:
    """The kind of work a kernel does, from its name (and XLA op name): one of KINDS or OTHER."""
    text = f"{name} {op}".lower()
    for kind, needles in KINDS:
        if any(n in text for n in needles):
            return kind
    return OTHER


ARITHMETIC = {"add", "multiply", "subtract", "divide", "maximum", "minimum", "negate", "select", "compare",
              "exponential", "rsqrt", "sqrt", "tanh", "abs", "power", "clamp"}  # fmt: skip


def body_kind(opcodes: str) -> str:
    """The kind of an XLA fusion from the opcodes its computation holds (`fusion_bodies`): its name, made
    from its root op, says little (an "add_convert_fusion" can be a LayerNorm's tail)."""
    ops = set(opcodes.split())
    if ops & {"dot", "convolution"}:
        return "gemm"
    if "custom-call" in ops:
        return OTHER
    if "erf" in ops or {"exponential", "divide", "select"} <= ops and "reduce" not in ops:
        return "gelu"  # erf, or jax.nn.gelu's erfc expanded
    if {"exponential", "reduce"} <= ops:
        return "attention"  # a softmax: XLA's own attention
    if "reduce" in ops:
        return "norm / reduce"
    if ops & ARITHMETIC:
        return "other elementwise"
    return "copy / convert"


_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\{\s*$")
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(?:[a-z0-9]+\[[^\]]*\](?:\{[^}]*\})?\s+)?([a-z][a-z0-9\-]*)\("
)
_CALLS = re.compile(r"calls=%?([\w.\-]+)")


def opcodes(hlo_text: str) -> list[str]:
    """The opcode of every instruction of an HLO module's text, in order (fusions' computations included)."""
    return [m.group(2) for line in hlo_text.splitlines() if (m := _INSTRUCTION.match(line)) is not None]


_GEMM_CALL = re.compile(r'custom_call_target="__cublas\$(?:lt\$)?(?:gemm|matmul)\w*"')


def matmul_count(hlo_text: str) -> int:
    """How many matrix multiplications an optimized HLO program runs: its `dot` instructions (fusions'
    computations included, XLA:CPU's and Triton's GEMMs) plus the cuBLAS GEMMs XLA:GPU rewrote dots into.

    cuDNN's fused attention is a custom call of its own and does not count.
    """
    dots = sum(1 for op in opcodes(hlo_text) if op == "dot")
    return dots + len(_GEMM_CALL.findall(hlo_text))


def fusion_bodies(hlo_text: str) -> dict[str, str]:
    """Each fusion (or other calling instruction) of an optimized HLO module -> the opcodes its computation
    holds, space-separated: what a kernel named after the fusion does ("multiply ... erf ..." is a GELU).

    Keys are the instruction's name with '.' and '_' both ways, as kernel names write it.
    """
    opcodes: dict[str, set[str]] = defaultdict(set)
    callers: list[tuple[str, str]] = []
    current = ""
    for line in hlo_text.splitlines():
        if (match := _COMPUTATION.match(line)) is not None:
            current = match.group(1)
            continue
        if (match := _INSTRUCTION.match(line)) is None:
            continue
        opcodes[current].add(match.group(2))
        if (called := _CALLS.search(line)) is not None:
            callers.append((match.group(1), called.group(1)))
    bodies = {}
    for name, computation in callers:
        body = " ".join(sorted(opcodes.get(computation, set()) - {"parameter", "constant", "broadcast"}))
        bodies[name] = bodies[name.replace(".", "_")] = body
    return bodies


def read_trace(path: Path) -> dict[str, Any]:
    """A Chrome trace, gzipped or not, as a dict with "traceEvents"."""
    raw = path.read_bytes()
    data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return data if isinstance(data, dict) else {"traceEvents": data}


def _names(events: list[dict], what: str) -> dict[Any, str]:
    key = (lambda e: e.get("pid")) if what == "process_name" else (lambda e: (e.get("pid"), e.get("tid")))
    return {
        key(e): str(e.get("args", {}).get("name", ""))
        for e in events
        if e.get("ph") == "M" and e.get("name") == what
    }


def _event(e: dict, threads: dict[Any, str]) -> Event:
    args = e.get("args") or {}
    op = str(args.get("hlo_op") or args.get("long_name") or args.get("tf_op") or "")
    module = str(args.get("hlo_module") or "")
    lane = (e.get("pid"), e.get("tid"))
    return Event(
        str(e["name"]), op, module, float(e["ts"]), float(e.get("dur", 0.0)), lane, threads.get(lane, "")
    )


def select_events(trace: dict[str, Any]) -> tuple[str, list[Event]]:
    """("gpu", the GPU's kernels) where the trace has any, else ("host", the host's ops)."""
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict)]
    complete = [e for e in events if e.get("ph") == "X" and "ts" in e and "name" in e]
    processes = _names(events, "process_name")
    threads = _names(events, "thread_name")
    gpu = [e for e in complete if e.get("cat") in GPU_CATEGORIES]  # PyTorch
    if not gpu:  # JAX: the device's processes; its stream lines, where it names them
        on_device = [e for e in complete if processes.get(e.get("pid"), "").startswith("/device:GPU")]
        lane = [threads.get((e.get("pid"), e.get("tid")), "").lower() for e in on_device]
        streams = [e for e, name in zip(on_device, lane, strict=True) if "stream" in name]
        # else every line but those the profiler derives from the kernels (XLA Ops, XLA Modules, Steps)
        gpu = streams or [e for e, name in zip(on_device, lane, strict=True) if not name.startswith(DERIVED)]
    if gpu:
        return "gpu", outermost([_event(e, threads) for e in gpu])
    host = [e for e in complete if e.get("cat") == "cpu_op" and str(e["name"]).startswith("aten::")]
    if not host:  # XLA:CPU: the thunks on its own threads
        host = [
            e
            for e in complete
            if threads.get((e.get("pid"), e.get("tid")), "").startswith("tf_XLA")
            and not str(e["name"]).startswith(HOST_BOOKKEEPING)
        ]
    return "host", outermost([_event(e, threads) for e in host])


def outermost(events: Iterable[Event]) -> list[Event]:
    """The events not inside another event of the same lane (nested ops counted once, at the top)."""
    kept: list[Event] = []
    ends: dict[tuple[Any, Any], float] = {}
    for event in sorted(events, key=lambda e: (e.lane, e.start_us, -e.duration_us)):
        if event.start_us + event.duration_us <= ends.get(event.lane, float("-inf")):
            continue
        kept.append(event)
        ends[event.lane] = max(ends.get(event.lane, float("-inf")), event.start_us + event.duration_us)
    return kept


def busy_us(events: Iterable[Event]) -> float:
    """The union of the events' intervals, in microseconds."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted((e.start_us, e.start_us + e.duration_us) for e in events):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summarize(
    trace: dict[str, Any],
    calls: int,
    wall_s: float,
    fusions: dict[str, str] | None = None,
    fusions_module: str = "",
    top: int = 20,
) -> dict[str, Any]:
    """Per call: busy and idle time, time per kind of kernel and per XLA module, and the `top` kernels.

    `fusions` (from `fusion_bodies` of the module named `fusions_module`) tells what an XLA kernel named
    after its fusion computes; fusion names repeat across modules, so events of other modules go without.
    """
    source, events = select_events(trace)
    lanes = Counter(e.lane_name or str(e.lane) for e in events)
    fusions = fusions or {}
    per_kind: dict[str, float] = defaultdict(float)
    per_module: dict[str, float] = defaultdict(float)
    per_kernel: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for e in events:
        known = not e.module or fusions_module in e.module
        body = (fusions.get(e.op) or fusions.get(e.name) or "") if known else ""
        if e.module:
            per_module[e.module] += e.duration_us
        kind = body_kind(body) if body else kind_of(e.name, e.op)
        per_kind[kind] += e.duration_us
        entry = per_kernel[(e.name, f"{e.op} {body}".strip(), kind)]
        entry[0] += 1
        entry[1] += e.duration_us
    busy = busy_us(events) / calls
    wall = wall_s * 1e6 / calls
    kernels = sorted(per_kernel.items(), key=lambda item: -item[1][1])[:top]
    return {
        "source": source,
        "events": len(events),
        "calls": calls,
        "wall_us_per_call": wall,
        "busy_us_per_call": busy,
        "idle_us_per_call": max(0.0, wall - busy) if source == "gpu" else None,
        "kinds_us_per_call": {k: v / calls for k, v in sorted(per_kind.items(), key=lambda kv: -kv[1])},
        "modules_us_per_call": {k: v / calls for k, v in sorted(per_module.items(), key=lambda kv: -kv[1])},
        "lanes": dict(lanes),  # the trace's lines read, with their event counts: what was counted
        "top_kernels": [
            {"name": name, "op": op, "kind": kind, "count_per_call": n / calls, "us_per_call": us / calls}
            for (name, op, kind), (n, us) in kernels
        ],
    }


def side_by_side(summaries: dict[str, dict[str, Any]], baseline: str) -> str:
    """Microseconds per call by kind of kernel, one column per engine, and each engine / the baseline."""
    engines = list(summaries)
    kinds = [k for k, _ in KINDS] + [OTHER]
    width = max(20, *(len(e) + 2 for e in engines))
    lines = [f"{'us per call':<20}" + "".join(f"{e:>{width}}" for e in engines) + f"{'ratio':>10}"]
    others = [e for e in engines if e != baseline]

    def row(label: str, values: dict[str, float | None]) -> str:
        cells = "".join(
            f"{'-' if values[e] is None else format(values[e], ',.0f'):>{width}}" for e in engines
        )
        base, ours = values.get(baseline), values.get(others[0]) if others else None
        ratio = f"{ours / base:.2f}x" if base and ours is not None else "-"
        return f"{label:<20}{cells}{ratio:>10}"

    for kind in kinds:
        values = {e: summaries[e]["kinds_us_per_call"].get(kind) for e in engines}
        if any(v for v in values.values()):
            lines.append(row(kind, values))
    for key, label in (("busy_us_per_call", "busy (union)"), ("idle_us_per_call", "device idle"),
                       ("wall_us_per_call", "wall")):  # fmt: skip
        lines.append(row(label, {e: summaries[e][key] for e in engines}))
    sources = ", ".join(f"{e}: {s['source']} events ({s['events']})" for e, s in summaries.items())
    lines.append(f"read from {sources}; ratio = {others[0] if others else '-'} / {baseline}")
    return "\n".join(lines)


def top_table(summary: dict[str, Any], engine: str) -> str:
    """One engine's kernels by time: microseconds per call, count per call, kind, name (and XLA op)."""
    modules = ", ".join(f"{m} {us:,.0f}" for m, us in summary["modules_us_per_call"].items())
    lines = [f"{engine}: top kernels by time ({summary['source']})"]
    if modules:
        lines.append(f"by XLA module, us per call: {modules}")
    lines.append(f"{'us/call':>9} {'n/call':>7}  {'kind':<18} name")
    for k in summary["top_kernels"]:
        name = k["name"] if len(k["name"]) <= 90 else k["name"][:87] + "..."
        op = f"  [{k['op'][:40]}]" if k["op"] else ""
        lines.append(f"{k['us_per_call']:>9,.0f} {k['count_per_call']:>7.1f}  {k['kind']:<18} {name}{op}")
    return "\n".join(lines)
