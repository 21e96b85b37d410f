"""How busy the GPU is under the engine's closed loop, and where it idles.

torch.profiler's kernel trace over a run of tools.load.run_load: the union of the kernels' intervals over
the wall time, for all streams and for the busiest one; the idle gaps between them by length, so many
short gaps (the host between launches) tell apart from a few long ones (waits between waves of requests:
admission, prefill, a last chunk's decode); and the kernels that border the longer gaps (the one that
ended last before a gap and the first after it, by name and stream), which say which hand-over idles: a
frame's graph waiting for the host, the code-to-wave stream waiting for codes, a wave's last chunk.
The engine's host work logged by phase in the same run (admission, a frame's launch, taking a frame's
results, code-to-wave, a prompt's preparation, the heap trim, each garbage collection: engine.metrics.phase)
says what its threads did during those gaps, over them all and per pair of border kernels. A gap inside
"sync" (the scheduler waiting for a frame's results) is one where the frame was done but the thread had
not run again yet: it waited for the interpreter lock or the OS, not for the GPU.

Owns reading the trace and the gap statistics; the load is tools.load's. CUDA only.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from omni_tts.engine.testing import GC_PHASE, recording_phases

GAP_BINS_MS = (0.1, 1.0, 10.0)  # idle gaps shorter than each bound, and the rest
BORDER_MIN_MS = 0.1  # gaps shorter than this are a graph's own kernel boundaries: not attributed
BORDER_TOP = 8  # kernel pairs kept, the most idle time first

Kernel = tuple[float, float, str, Any]  # start us, end us, name, stream
HostRange = tuple[float, float, str]  # start us, end us, phase


def kernels(trace: dict[str, Any]) -> list[Kernel]:
    """Chrome-trace kernel events -> [(start_us, end_us, name, stream)]."""
    return [(e["ts"], e["ts"] + e["dur"], e.get("name", "?"), e.get("args", {}).get("stream"))
            for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"]


def host_ranges(trace: dict[str, Any], log: Iterable[tuple[int, int, str, int]]) -> list[HostRange]:
    """`recording_phases`' log on the trace's clock (its ts are microseconds after baseTimeNanoseconds, of
    the clock time.time_ns reads) -> [(start_us, end_us, phase)]."""
    base = trace["baseTimeNanoseconds"]
    return [((start - base) / 1000, (end - base) / 1000, name) for start, end, name, _ in log]


def kernel_intervals(ks: Iterable[Kernel]) -> dict[Any, list[tuple[float, float]]]:
    """`kernels`' list -> {stream: [(start_us, end_us)]}."""
    out: dict[Any, list[tuple[float, float]]] = {}
    for start, end, _, stream in ks:
        out.setdefault(stream, []).append((start, end))
    return out


def merged(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of [start, end) intervals as disjoint intervals, in order."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    return sum(b - a for a, b in merged(intervals))


def gaps(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The gaps [end, start) between the union of [start, end) intervals, in order."""
    spans = merged(intervals)
    return [(end, start) for (_, end), (start, _) in zip(spans, spans[1:])]


def idle_gaps(intervals: Iterable[tuple[float, float]]) -> dict[str, Any]:
    """Gaps (in us) between the union of [start, end) intervals, from the first start to the last end ->
    {"total_s", and per bin of GAP_BINS_MS: "lt_<ms>" / "ge_<ms>": {"count", "s"}}."""
    edges = [b * 1000 for b in GAP_BINS_MS]
    names = [f"lt_{b:g}ms" for b in GAP_BINS_MS] + [f"ge_{GAP_BINS_MS[-1]:g}ms"]
    bins = {n: {"count": 0, "s": 0.0} for n in names}
    for end, start in gaps(intervals):
        slot = bins[names[bisect.bisect_right(edges, start - end)]]
        slot["count"] += 1
        slot["s"] += (start - end) / 1e6
    return {"total_s": sum(v["s"] for v in bins.values()), **bins}


def short_name(name: str, width: int = 60) -> str:
    """A kernel's name without its return type, namespaces, template arguments and parameters, at most
    `width` long; a PyTorch kernel (at::native) adds in brackets the op its template arguments carry
    (`elementwise_kernel[direct_copy_kernel_cuda]`), since its own name is the same for every op."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    cut = min((i for i in (name.find("<"), name.find("(")) if i > 0), default=len(name))
    base, rest = name[:cut], name[cut:]
    if base.startswith("at::native::"):
        base = base.removeprefix("at::native::")
        op = next((o for o in _NATIVE_OP.findall(rest) if o not in _NATIVE_WRAPPERS), "")
        base = f"{base}[{op}]" if op else base
    return base[:width]


_NATIVE_OP = re.compile(r"at::native::(?:\w+::)*?(\w+)(?![\w:])")  # the last part of each at::native name
_NATIVE_WRAPPERS = frozenset({"gpu_kernel_impl", "gpu_kernel_impl_nocast", "gpu_index_kernel", "BinaryFunctor",
                              "UnaryFunctor", "AUnaryFunctor", "BUnaryFunctor", "OpaqueType", "ReduceOp",
                              "func_wrapper_t"})


def gap_borders(ks: Iterable[Kernel], min_ms: float = BORDER_MIN_MS, top: int = BORDER_TOP,
                ranges: Iterable[HostRange] | None = None) -> list[dict[str, Any]]:
    """Idle gaps of at least `min_ms` grouped by the kernels around them: the one that ended last before
    the gap (any stream) and the first to start after it -> the `top` pairs by idle time, each {"before",
    "after" ("name @ stream"), "count", "s", "max_ms"}; with the host's `ranges`, also "phases": the
    seconds of the pair's gaps each phase overlapped (those that did, most first)."""
    pairs: dict[tuple[str, str], dict[str, Any]] = {}
    spans: dict[tuple[str, str], list[tuple[float, float]]] = {}
    last: Kernel | None = None
    for k in sorted(ks, key=lambda k: (k[0], k[1])):  # by time only: streams may not compare
        if last is not None and k[0] > last[1]:
            gap_ms = (k[0] - last[1]) / 1000
            if gap_ms >= min_ms:
                key = (f"{short_name(last[2])} @ {last[3]}", f"{short_name(k[2])} @ {k[3]}")
                p = pairs.setdefault(key, {"before": key[0], "after": key[1], "count": 0, "s": 0.0, "max_ms": 0.0})
                p["count"] += 1
                p["s"] += gap_ms / 1000
                p["max_ms"] = max(p["max_ms"], gap_ms)
                spans.setdefault(key, []).append((last[1], k[0]))
        if last is None or k[1] > last[1]:
            last = k
    out = sorted(pairs.items(), key=lambda kv: -kv[1]["s"])[:top]
    if ranges is not None:
        by_name = _by_phase(ranges)
        for key, p in out:
            p["phases"] = {n: t for n, t in _phase_seconds(spans[key], by_name).items() if t > 0}
    return [p for _, p in out]


def _overlap_us(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the intersection of two lists of disjoint, ordered intervals."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def _by_phase(ranges: Iterable[HostRange]) -> dict[str, list[tuple[float, float]]]:
    """Host ranges -> {phase: its ranges merged (several threads' overlaps counted once)}."""
    by_name: dict[str, list[tuple[float, float]]] = {}
    for start, end, name in ranges:
        by_name.setdefault(name, []).append((start, end))
    return {n: merged(iv) for n, iv in by_name.items()}


def _phase_seconds(idle: list[tuple[float, float]], by_name: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """Seconds of the disjoint, ordered intervals `idle` each phase overlapped, most first."""
    shares = {n: _overlap_us(idle, iv) / 1e6 for n, iv in by_name.items()}
    return dict(sorted(shares.items(), key=lambda p: -p[1]))


def gap_phases(ks: Iterable[Kernel], ranges: Iterable[HostRange], min_ms: float = BORDER_MIN_MS
               ) -> dict[str, Any]:
    """What the host did during the idle gaps of at least `min_ms`: {"gaps_s", "by_phase": {phase: seconds
    of those gaps it overlapped (phases of several threads overlap each other)}, "no_phase_s": seconds no
    phase overlapped}, phases by overlap, most first."""
    idle = [(end, start) for end, start in gaps((k[0], k[1]) for k in ks) if start - end >= min_ms * 1000]
    by_name = _by_phase(ranges)
    every = merged(iv for ivs in by_name.values() for iv in ivs)
    total = sum(b - a for a, b in idle)
    return {"gaps_s": total / 1e6, "by_phase": _phase_seconds(idle, by_name),
            "no_phase_s": (total - _overlap_us(idle, every)) / 1e6}


def collections(log: Iterable[tuple[int, int, str, int]]) -> dict[str, dict[str, float]]:
    """`recording_phases`' garbage collections -> {"gc <generation>": {"count", "s", "max_ms"}}."""
    out: dict[str, dict[str, float]] = {}
    for start, end, name, _ in log:
        if name.startswith(GC_PHASE):
            g = out.setdefault(name, {"count": 0, "s": 0.0, "max_ms": 0.0})
            g["count"] += 1
            g["s"] += (end - start) / 1e9
            g["max_ms"] = max(g["max_ms"], (end - start) / 1e6)
    return dict(sorted(out.items()))


def busy_share(engine: Any, concurrency: int, requests: int, make: Callable[[int], Any]) -> dict[str, Any]:
    """The closed loop at `concurrency` under the profiler: share of wall time with a kernel running, the
    idle gaps, the kernels around them and what the engine's host did during them."""
    from torch.profiler import ProfilerActivity, profile

    from omni_tts.tools.load import run_load

    run_load(engine, concurrency, concurrency, make)  # warm-up, excluded
    torch.cuda.synchronize()
    with recording_phases() as logged, profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        records, _ = run_load(engine, concurrency, requests, make)
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t0) * 1e6
    log = list(logged)  # a phase still ending on another thread may append to the list
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    ks, ranges = kernels(trace), host_ranges(trace, log)
    streams = kernel_intervals(ks)
    per_stream = {str(s): union_seconds(iv) / wall_us for s, iv in streams.items()}
    every = [iv for ivs in streams.values() for iv in ivs]
    return {"concurrency": concurrency, "requests": requests, "served": len(records), "wall_s": wall_us / 1e6,
            "gpu_busy_share": union_seconds(every) / wall_us,
            "busiest_stream_share": max(per_stream.values(), default=0.0), "by_stream": per_stream,
            "idle_gaps": idle_gaps(every), "gap_borders": gap_borders(ks, ranges=ranges),
            "host_phases": gap_phases(ks, ranges), "gc": collections(log)}


def report(b: dict[str, Any], borders: int = 5) -> str:
    """busy_share's result as text: the share, the gaps by length and the pairs of kernels that idle most."""
    by_length = ", ".join(f"{k.replace('_', ' ')} {v['count']} ({v['s']:.3f} s)"
                          for k, v in b["idle_gaps"].items() if k != "total_s")
    lines = [f"c={b['concurrency']}: GPU busy {100 * b['gpu_busy_share']:.1f} % of {b['wall_s']:.2f} s "
             f"(busiest stream {100 * b['busiest_stream_share']:.1f} %); idle gaps: {by_length}"]
    lines += [f"  {p['s']:.3f} s in {p['count']} gaps (longest {p['max_ms']:.2f} ms): {p['before']} -> {p['after']}"
              + (f"; host: {', '.join(f'{n} {t:.3f}' for n, t in p['phases'].items())}" if p.get("phases") else "")
              for p in b.get("gap_borders", [])[:borders]]
    if h := b.get("host_phases"):
        phases = ", ".join(f"{n} {t:.3f} s" for n, t in h["by_phase"].items())
        lines.append(f"  the host during the {h['gaps_s']:.3f} s of gaps >= {BORDER_MIN_MS} ms: "
                     f"{phases or 'no phase'}; in no phase {h['no_phase_s']:.3f} s")
    if "gc" in b:
        lines.append("  garbage collections: " + (", ".join(
            f"{n} x{g['count']} ({g['s']:.3f} s, longest {g['max_ms']:.1f} ms)" for n, g in b["gc"].items()) or "none"))
    return "\n".join(lines)
