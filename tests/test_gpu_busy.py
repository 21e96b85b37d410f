"""The GPU busy statistics of tools.gpu_busy on hand-made kernel traces: the union of kernel intervals, the
idle gaps binned by length, the longer gaps attributed to the kernels around them and to the host phases
that overlapped them; and the engine's host phases in a real profiler trace (CPU engine)."""

from __future__ import annotations

import json
import math
import threading

import pytest
import torch

from omni_tts.engine.metrics import GC_PHASE
from omni_tts.tools import gpu_busy


def _trace(*events: tuple[float, float, str, int]) -> dict:
    return {"traceEvents": [{"cat": "kernel", "ts": s, "dur": d, "name": n, "args": {"stream": st}}
                            for s, d, n, st in events] + [{"cat": "cpu_op", "ts": 0, "dur": 99_999}]}


def test_union_of_kernel_intervals():
    assert gpu_busy.union_seconds([(5, 6), (0, 2), (1, 3), (2.5, 2.7)]) == 4
    trace = _trace((0, 2, "a", 7), (1, 3, "b", 9))
    assert gpu_busy.kernels(trace) == [(0, 2, "a", 7), (1, 4, "b", 9)]
    assert gpu_busy.kernel_intervals(gpu_busy.kernels(trace)) == {7: [(0, 2)], 9: [(1, 4)]}


def test_idle_gaps_are_binned_by_length_between_overlapping_kernels():
    """Gaps between the union of intervals (us): overlapping and nested kernels leave none; each gap lands in
    the bin of its length."""
    iv = [(0, 10), (5, 8), (10.05, 20), (19, 30), (530, 600), (2600, 2700), (20_000, 20_001)]
    g = gpu_busy.idle_gaps(iv)
    assert {k: v["count"] for k, v in g.items() if k != "total_s"} == {
        "lt_0.1ms": 1, "lt_1ms": 1, "lt_10ms": 1, "ge_10ms": 1}
    assert math.isclose(g["lt_1ms"]["s"], 500e-6) and math.isclose(g["ge_10ms"]["s"], 17_300e-6)
    assert math.isclose(g["total_s"], (0.05 + 500 + 2000 + 17_300) / 1e6)
    assert gpu_busy.idle_gaps([])["total_s"] == 0


def test_gaps_are_named_by_the_kernel_that_ended_last_and_the_next_to_start():
    """A long kernel on another stream that outlasts a later-starting one is the gap's 'before'; a gap that
    another stream's kernel fills is no gap; gaps under the bound are left out; pairs add up, most idle
    time first; kernels that tie in time sort whatever their streams."""
    ks = gpu_busy.kernels(_trace(
        (0, 500, "void codec_conv<float, 4>(float*)", 2),  # ends last: borders the first gap
        (10, 20, "step_tail", 1),
        (800, 10, "step_head", 1),        # gap of 300 us after codec_conv
        (810, 5, "step_tail", 1),
        (900, 200, "codec_conv", 2),      # fills what would be a gap on stream 1
        (1000, 10, "step_head", 1),
        (1150, 10, "step_tail", 1),        # 40 us after codec_conv: under the bound
        (2160, 10, "step_head", 1),       # 1 ms after step_tail
        (2500, 10, "step_head", 1)))      # 330 us after step_head
    borders = gpu_busy.gap_borders(ks, min_ms=0.1)
    assert [(p["before"], p["after"], p["count"]) for p in borders] == [
        ("step_tail @ 1", "step_head @ 1", 1), ("step_head @ 1", "step_head @ 1", 1),
        ("codec_conv @ 2", "step_head @ 1", 1)]
    assert math.isclose(borders[0]["max_ms"], 1.0) and math.isclose(borders[2]["s"], 300e-6)
    assert gpu_busy.gap_borders(ks, min_ms=0.1, top=1) == borders[:1]
    twice = gpu_busy.gap_borders(ks + [(5000, 5010, "step_head", 1), (5000, 5010, "step_head", None)], min_ms=0.1)
    assert twice[0]["before"] == "step_head @ 1" and twice[0]["count"] == 2


def test_short_kernel_names():
    """PyTorch's kernels share a few names for every op: the op inside their template arguments tells them
    apart (past the generic wrappers); other names keep their own."""
    copy = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
            "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda(long)#1}>"
            "(at::TensorIteratorBase&)::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<>)")
    mul = ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor"
           "<float, float, float, at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&)"
           "::{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<>)")
    assert gpu_busy.short_name(copy) == "elementwise_kernel[direct_copy_kernel_cuda]"
    assert gpu_busy.short_name(mul) == "elementwise_kernel[MulFunctor]"
    assert gpu_busy.short_name("void at::native::vectorized_elementwise_kernel<8, at::native::FillFunc>(int)") == (
        "vectorized_elementwise_kernel[FillFunc]")
    assert gpu_busy.short_name("void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long>(int)") == (
        "indexSelectLargeIndex")
    assert gpu_busy.short_name("void at::native::vectorized_gather_kernel<16, long>(char*, long*)") == (
        "vectorized_gather_kernel")
    assert gpu_busy.short_name("_proj_kernel") == "_proj_kernel"
    assert gpu_busy.short_name("x" * 80, width=10) == "x" * 10


def test_report_lists_the_gaps_and_their_borders():
    ks = gpu_busy.kernels(_trace((0, 10, "a", 1), (2010, 10, "b", 1)))
    iv = [(s, e) for s, e, _, _ in ks]
    text = gpu_busy.report({"concurrency": 4, "gpu_busy_share": 0.5, "wall_s": 1.0, "busiest_stream_share": 0.5,
                            "idle_gaps": gpu_busy.idle_gaps(iv), "gap_borders": gpu_busy.gap_borders(ks),
                            "host_phases": gpu_busy.gap_phases(ks, [(0, 1010, "take"), (500, 600, "admit")])})
    assert "c=4: GPU busy 50.0 %" in text and "lt 10ms 1 (0.002 s)" in text
    assert "0.002 s in 1 gaps (longest 2.00 ms): a @ 1 -> b @ 1\n" in text
    borders = gpu_busy.gap_borders(ks, ranges=[(0, 1010, "take"), (500, 600, "admit")])
    assert "a @ 1 -> b @ 1; host: take 0.001, admit 0.000" in gpu_busy.report(
        {"concurrency": 4, "gpu_busy_share": 0.5, "wall_s": 1.0, "busiest_stream_share": 0.5,
         "idle_gaps": gpu_busy.idle_gaps(iv), "gap_borders": borders})
    assert "the host during the 0.002 s of gaps >= 0.1 ms: take 0.001 s, admit 0.000 s; in no phase 0.001 s" in text


def test_host_phases_during_gaps_add_up_per_phase_and_leave_the_rest_unnamed():
    """Each phase counts the idle time it overlapped, once even where its ranges overlap (two threads
    preparing); phases of different threads may both count a stretch; a kernel of another stream shortens
    a gap; a gap of exactly the bound counts, shorter ones and time outside the gaps count nothing; what no
    phase covered is `no_phase_s`. The log's clock (ns) becomes the trace's (us after its base)."""
    base = 1_000_000_000
    trace = {**_trace((0, 100, "a", 1), (0, 150, "codec", 2), (20, 30, "small", 3), (600, 100, "b", 1),
                      (700, 50, "c", 1), (760, 100, "d", 1), (960, 10, "e", 1)), "baseTimeNanoseconds": base}
    log = [(base + 1000 * s, base + 1000 * e, name, tid) for s, e, name, tid in [
        (50, 300, "take", 1),        # 150 us of the 150-600 gap
        (250, 350, "admit", 1),      # 100 us, 50 shared with take
        (400, 550, "prepare", 2),    # 150 us
        (450, 500, "prepare", 3),    # inside the one above
        (740, 770, "launch", 1),     # over a 10 us gap: under the bound
        (900, 1000, "audio", 4)]]    # 60 us of the 860-960 gap: 100 us, the bound
    ranges = gpu_busy.host_ranges(trace, log)
    assert ranges[0] == (50, 300, "take") and len(ranges) == 6
    got = gpu_busy.gap_phases(gpu_busy.kernels(trace), ranges, min_ms=0.1)
    assert math.isclose(got["gaps_s"], 550e-6)
    assert list(got["by_phase"]) == ["take", "prepare", "admit", "audio", "launch"]
    assert [round(v * 1e6) for v in got["by_phase"].values()] == [150, 150, 100, 60, 0]
    assert math.isclose(got["no_phase_s"], (550 - 200 - 150 - 60) * 1e-6)  # 150-350, 400-550, 900-960 covered
    assert gpu_busy.gap_phases([], ranges)["gaps_s"] == 0.0

    # per pair of border kernels: the phases over that pair's gaps only, those that overlapped them
    borders = gpu_busy.gap_borders(gpu_busy.kernels(trace), min_ms=0.1, ranges=ranges)
    assert [(p["before"], p["after"]) for p in borders] == [("codec @ 2", "b @ 1"), ("d @ 1", "e @ 1")]
    assert [{n: round(t * 1e6) for n, t in p["phases"].items()} for p in borders] == [
        {"take": 150, "prepare": 150, "admit": 100}, {"audio": 60}]
    assert "phases" not in gpu_busy.gap_borders(gpu_busy.kernels(trace), min_ms=0.1)[0]


def test_logged_phases_land_on_the_profilers_clock_and_an_engine_logs_each_thread(engine, tmp_path):
    """A phase logged on this thread holds, on the trace's clock, the op the profiler recorded inside it;
    a request served while the phases are recorded logs the engine's threads (prompt preparation,
    admission, launches, taking frames, code-to-wave), launches one after another; nothing is logged
    outside `recording_phases`."""
    from _engine import TIMEOUT, case_params, golden_case
    from torch.profiler import ProfilerActivity, profile

    from omni_tts.engine.metrics import phase, recording_phases

    with recording_phases() as log, profile(activities=[ProfilerActivity.CPU]) as prof:
        with phase("probe"):
            torch.ones(64).cumsum(0)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    (start, end, _), = [r for r in gpu_busy.host_ranges(trace, log) if r[2] == "probe"]
    op = next(e for e in trace["traceEvents"] if e.get("name") == "aten::cumsum")
    assert start <= op["ts"] and op["ts"] + op["dur"] <= end

    with recording_phases() as log:
        engine.synthesize(case_params(golden_case("custom_voice", 0)), timeout=TIMEOUT)
    with phase("after"):
        pass
    assert {"prepare", "admit", "launch", "take", "sync", "audio"} == {
        p[2] for p in log if not p[2].startswith(GC_PHASE)}
    assert threading.get_native_id() in {p[3] for p in log if p[2] == "prepare"}  # the OS ids traces use
    with recording_phases() as outer:
        with recording_phases() as inner, phase("inner"):
            pass
        with phase("outer"):
            pass
    assert [p[2] for p in inner if not p[2].startswith(GC_PHASE)] == ["inner"]
    assert [p[2] for p in outer if not p[2].startswith(GC_PHASE)] == ["outer"]
    assert len({p[3] for p in log}) >= 3  # the caller's, the scheduler's and the audio stage's threads
    takes = [p for p in log if p[2] == "take"]
    assert all(any(t[0] <= w[0] and w[1] <= t[1] and t[3] == w[3] for t in takes) for w in log if w[2] == "sync")
    launches = sorted(p[:2] for p in log if p[2] == "launch")
    assert len(launches) >= 2 and all(a[1] <= b[0] for a, b in zip(launches, launches[1:]))


def test_a_collection_while_phases_are_recorded_is_logged_as_its_generation_and_only_then():
    """A garbage collection is host work that stops every thread: while phases are recorded each one is
    logged as "gc <generation>" on the thread that ran it, and the gc hook goes when the block ends."""
    import gc

    from omni_tts.engine.metrics import recording_phases

    hooks = list(gc.callbacks)
    with recording_phases() as log:
        gc.collect(1)
        gc.collect()
    assert gc.callbacks == hooks
    collections = [p for p in log if p[2].startswith(GC_PHASE)]
    mine = [p[2] for p in collections if p[3] == threading.get_native_id()]  # other threads may collect too
    assert "gc 1" in mine and "gc 2" in mine[mine.index("gc 1"):]
    assert all(start <= end for start, end, _, _ in collections)
    gc.collect()
    assert collections == [p for p in log if p[2].startswith(GC_PHASE)]
    summary = gpu_busy.collections(log)
    assert summary["gc 2"]["count"] == sum(p[2] == "gc 2" for p in collections) >= 1
    assert summary["gc 2"]["s"] == pytest.approx(sum(e - s for s, e, n, _ in collections if n == "gc 2") / 1e9)
    text = gpu_busy.report({"concurrency": 1, "gpu_busy_share": 0.5, "wall_s": 1.0, "busiest_stream_share": 0.5,
                            "idle_gaps": {"total_s": 0.0}, "gc": summary})
    assert f"gc 2 x{summary['gc 2']['count']}" in text
