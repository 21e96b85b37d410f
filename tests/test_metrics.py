"""Metric records and their arithmetic: per-request TTFP / E2E / RTF, engine counters, the bench summary.
(The engine's own records on real requests are checked in test_engine.py.)"""

from __future__ import annotations

import math
import queue
import threading

import pytest
import torch

from omni_tts.engine.metrics import EngineStats, RequestMetrics, gpu_memory, now, summarize


def rec(i: int, ttfp_s: float, e2e_s: float, samples: int, status: str = "done", t0: float = 100.0,
        sr: int = 24000) -> RequestMetrics:
    m = RequestMetrics(i, "eager", t0, sample_rate=sr)
    m.first_audio_at, m.finished_at, m.audio_samples, m.status = t0 + ttfp_s, t0 + e2e_s, samples, status
    m.frames = samples // 1920
    return m


def test_request_metrics_properties():
    m = RequestMetrics(7, "default", accepted_at=10.0)
    assert (m.ttfp_ms, m.queue_ms, m.e2e_ms, m.rtf, m.audio_s, m.status) == (None, None, None, None, 0.0, "running")
    m.started_at, m.first_audio_at = 10.02, 10.05
    assert m.queue_ms == pytest.approx(20.0)
    assert m.ttfp_ms == pytest.approx(50.0) and m.e2e_ms is None and m.rtf is None
    m.finished_at, m.audio_samples = 12.0, 48000
    assert m.e2e_ms == pytest.approx(2000.0) and m.audio_s == 2.0 and m.rtf == pytest.approx(1.0)
    d = m.as_dict()
    assert d["request_id"] == 7 and d["mode"] == "default" and d["ttfp_ms"] == pytest.approx(50.0)
    assert d["e2e_ms"] == pytest.approx(2000.0) and d["audio_s"] == 2.0 and d["rtf"] == pytest.approx(1.0)
    assert d["queue_ms"] == pytest.approx(20.0)
    assert m.first_codes_ms is None and m.first_chunk_ms is None  # not known until the first frame is read
    m.first_codes_at = 10.035
    assert m.first_codes_ms == pytest.approx(15.0) and m.as_dict()["first_chunk_ms"] == pytest.approx(15.0)
    assert m.queue_ms + m.first_codes_ms + m.first_chunk_ms == pytest.approx(m.ttfp_ms)


def test_rtf_is_none_without_audio_and_uses_the_sample_rate():
    m = rec(1, 0.1, 0.5, 0)
    assert m.rtf is None and m.audio_s == 0.0
    m = rec(2, 0.1, 0.5, 16000, sr=16000)
    assert m.audio_s == 1.0 and m.rtf == pytest.approx(0.5)


def test_now_is_monotonic():
    a = now()
    assert now() >= a


def test_summarize_counts_only_finished_requests():
    recs = [rec(1, 0.010, 1.0, 48000), rec(2, 0.030, 2.0, 24000), rec(3, 0.020, 3.0, 72000),
            rec(4, 0.500, 9.0, 24000, status="cancelled"), rec(5, 0.900, 9.0, 0, status="error")]
    for r, wait in zip(recs, (0.004, 0.001, 0.002, 0.3, 0.5)):
        r.started_at = r.accepted_at + wait
    s = summarize(recs, wall_s=4.0)
    assert s["requests"] == 3.0 and s["med_queue_ms"] == pytest.approx(2.0)
    assert s["med_ttfp_ms"] == pytest.approx(20.0) and s["p90_ttfp_ms"] == pytest.approx(30.0)
    assert s["med_e2e_ms"] == pytest.approx(2000.0)
    assert s["mean_rtf"] == pytest.approx((1.0 / 2 + 2.0 / 1 + 3.0 / 3) / 3)
    assert s["req_per_s"] == pytest.approx(0.75)
    assert s["audio_s"] == pytest.approx(6.0) and s["audio_s_per_s"] == pytest.approx(1.5) and s["wall_s"] == 4.0


def test_summarize_p90_picks_the_nearest_rank():
    recs = [rec(i, 0.001 * (i + 1), 1.0, 24000) for i in range(10)]  # ttfp 1..10 ms
    s = summarize(recs, wall_s=1.0)
    assert s["p90_ttfp_ms"] == pytest.approx(9.0) and s["med_ttfp_ms"] == pytest.approx(5.5)


def test_summarize_of_nothing_is_nan_not_an_error():
    s = summarize([rec(1, 0.1, 1.0, 0, status="cancelled")], wall_s=0.0)
    assert s["requests"] == 0.0 and s["audio_s"] == 0.0
    for k in ("med_ttfp_ms", "p90_ttfp_ms", "med_e2e_ms", "mean_rtf", "req_per_s", "audio_s_per_s"):
        assert math.isnan(s[k]), k


def test_engine_stats_occupancy_and_history():
    st = EngineStats(history=3)
    assert st.mean_occupancy() == 0.0 and st.steps_per_s() == 0.0
    for b in (1, 2, 3, 2):
        st.on_step(b)
    assert st.steps == 4 and st.busy_slots_sum == 8 and st.mean_occupancy() == 2.0
    assert st.steps_per_s() > 0
    recs = [rec(i, 0.1, 1.0, 24000) for i in range(5)]
    for r in recs:
        st.on_finish(r)
    assert st.recent_requests() == recs[2:] and st.recent_requests(2) == recs[3:]


def test_engine_stats_counts_every_step_from_many_threads():
    st = EngineStats()

    def work():
        for _ in range(500):
            st.on_step(2)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert st.steps == 2000 and st.busy_slots_sum == 4000


def test_gpu_memory_is_empty_off_cuda():
    assert gpu_memory(None) == {} and gpu_memory("cpu") == {} and gpu_memory(torch.device("cpu"), 123) == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_memory_on_cuda_reports_the_pool_share():
    x = torch.empty(1 << 20, device="cuda")  # noqa: F841 (held while measuring)
    mem = gpu_memory("cuda", pool_bytes=1 << 20, tree_pool_bytes=1 << 21, codec_pool_bytes=1 << 22)
    assert mem["codec_graph_pool_gib"] == pytest.approx((1 << 22) / (1 << 30))
    assert mem["allocated_gib"] > 0 and mem["reserved_gib"] >= mem["allocated_gib"]
    assert mem["graph_pool_gib"] == pytest.approx((1 << 20) / (1 << 30))
    assert mem["tree_pool_gib"] == pytest.approx((1 << 21) / (1 << 30))
    assert 0 < mem["graph_pool_share"] <= 1


def test_a_request_is_counted_before_its_caller_sees_it_end():
    """The engine's counters (on_finish) run before the handle reports done or its stream ends, so a client
    that has its whole response never reads a count that lacks it."""
    from omni_tts.config import SynthesisParams
    from omni_tts.engine.request import RequestHandle

    handle = RequestHandle(3, SynthesisParams(text="hi"), RequestMetrics(3, "eager", now()))
    seen = []

    def ended_stream() -> bool:
        try:
            return handle.take(timeout=0) is None
        except queue.Empty:
            return False

    handle.on_finish = lambda m: seen.append((m.status, handle.done, ended_stream()))
    handle.complete([], "done")
    assert seen == [("done", False, False)]  # not done, and the stream's end not yet queued
    assert ended_stream()
    assert handle.done and handle.result(timeout=1).metrics.status == "done"
