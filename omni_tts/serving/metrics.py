"""The engine's figures in Prometheus' text format, written with prometheus_client into a registry of this
app's own (two engines in one process never share one).

Owns the metric names: requests by mode and outcome (`omni_tts_requests_total`, from the engine's counters;
refusals at submit included), TTFP / E2E / RTF histograms and TTFP's parts (queued for a slot, to the first
frame's codes, to the first chunk: where first audio waits) (fed by the engine's finished-request
observer), and, read from the engine's snapshot at each scrape: waiting and
running requests per mode, frames made and frame steps per second, GPU memory allocated / reserved,
graph-pool bytes per mode, each mode's warm-up state and whether a shutdown drains. Knows nothing about
HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

MODE_STATES = ("queued", "warming", "ready", "failed", "unavailable")
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
RTF_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)
GIB = float(1 << 30)


class EngineMetrics:
    """One app's registry over one engine; `render()` is the /metrics body."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, engine: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.ttfp = Histogram("omni_tts_ttfp_seconds", "Time to first audio of finished requests, by mode",
                              ["mode"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("omni_tts_e2e_seconds", "Submit to last audio of finished requests, by mode",
                             ["mode"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.rtf = Histogram("omni_tts_rtf", "Real-time factor (E2E / audio seconds) of finished requests",
                             ["mode"], buckets=RTF_BUCKETS, registry=self.registry)
        self.ttfp_parts = Histogram("omni_tts_ttfp_part_seconds", "TTFP of finished requests in parts: queued "
                                    "(submit to a slot), first_codes (slot to the first frame's codes: prefill and "
                                    "one frame), first_chunk (those codes to the first audio chunk), by mode",
                                    ["mode", "part"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(_EngineCollector(engine))
        engine.stats.observers.append(self.observe)

    def observe(self, m: Any) -> None:
        """A request that ended (on an engine thread): its latencies, when it finished its clip."""
        if m.status != "done":
            return
        if m.ttfp_ms is not None:
            self.ttfp.labels(m.mode).observe(m.ttfp_ms / 1000)
        if m.e2e_ms is not None:
            self.e2e.labels(m.mode).observe(m.e2e_ms / 1000)
        if m.rtf is not None:
            self.rtf.labels(m.mode).observe(m.rtf)
        for part, ms in (("queued", m.queue_ms), ("first_codes", m.first_codes_ms), ("first_chunk", m.first_chunk_ms)):
            if ms is not None:
                self.ttfp_parts.labels(m.mode, part).observe(ms / 1000)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    """What the engine's counters and snapshot say at scrape time."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        snap, stats = self.engine.snapshot(), self.engine.stats
        requests = CounterMetricFamily("omni_tts_requests", "Requests by mode and outcome: how they ended "
                                       "(done, cancelled (client gone), error (deadline exceeded), ...) or refused "
                                       "(overloaded)",
                                       labels=["mode", "outcome"])
        for (mode, outcome), n in sorted(dict(stats.outcomes).items()):
            requests.add_metric([mode, outcome], n)
        yield requests
        yield _per_mode("omni_tts_waiting_requests", "Requests waiting for a slot, by mode", snap.waiting_by_mode)
        yield _per_mode("omni_tts_running_requests", "Requests in a slot, by mode", snap.active_by_mode)
        yield CounterMetricFamily("omni_tts_frames", "Audio frames made (rows over all frame steps)",
                                  value=snap.busy_slots_sum)
        yield GaugeMetricFamily("omni_tts_frame_steps_per_second", "Batched frame steps per second, lately",
                                value=snap.steps_per_s)
        yield GaugeMetricFamily("omni_tts_draining", "1 while a shutdown drains: new requests refused, accepted "
                                "ones finishing", value=float(self.engine.draining))
        yield from _memory(snap)
        yield from _modes(snap.modes)


def _per_mode(name: str, doc: str, values: dict[str, int]) -> GaugeMetricFamily:
    g = GaugeMetricFamily(name, doc, labels=["mode"])
    for mode, n in sorted(values.items()):
        g.add_metric([mode], n)
    return g


def _memory(snap: Any) -> Iterator[Metric]:
    mem = snap.memory or {}  # empty without CUDA
    for key, name, doc in (("allocated_gib", "allocated", "allocated by tensors"),
                           ("reserved_gib", "reserved", "reserved by the caching allocator")):
        if key in mem:
            yield GaugeMetricFamily(f"omni_tts_gpu_memory_{name}_bytes", f"GPU memory {doc}",
                                    value=mem[key] * GIB)
    pools = GaugeMetricFamily("omni_tts_graph_pool_bytes", "CUDA-graph pool bytes per mode, after its warm-up "
                              "(Inductor's graph-tree pool for reduce-overhead)", labels=["mode"])
    for mode, cap in sorted(snap.capture.items()):
        pools.add_metric([mode], float(cap.get("pool_bytes", 0) or 0) + float(cap.get("tree_pool_bytes", 0) or 0))
    yield pools
    if "codec_graph_pool_gib" in mem:
        yield GaugeMetricFamily("omni_tts_codec_graph_pool_bytes", "CUDA-graph pools of the codec's chunk graphs",
                                value=mem["codec_graph_pool_gib"] * GIB)


def _modes(modes: dict[str, Any]) -> Iterator[Metric]:
    state = GaugeMetricFamily("omni_tts_mode_state", "1 for each mode's current warm-up state",
                              labels=["mode", "state"])
    serving = GaugeMetricFamily("omni_tts_mode_serving", "1 when the mode runs requests now", labels=["mode"])
    for mode, info in sorted(modes.items()):
        for s in MODE_STATES:
            state.add_metric([mode, s], float(info.state == s))
        serving.add_metric([mode], float(info.serving))
    yield state
    yield serving
