"""Metrics: per-request TTFP / E2E / RTF and engine-wide GPU memory, occupancy, capture costs.

Owns the records and their arithmetic; cheap enough to leave on (host clocks only, plus
torch.cuda memory counters that read allocator statistics without a device sync).
Also logs the engine's host work by phase while a tool asks (`phase`, `recording_phases`), so a GPU
trace can say what each thread did while the GPU idled. Knows nothing about the model or the UI.
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch


def now() -> float:
    return time.perf_counter()


_PHASES: list[tuple[int, int, str, int]] | None = None  # while recorded: (start ns, end ns, phase, OS thread id)
GC_PHASE = "gc "  # a collection's phase name, followed by its generation: "gc 0".."gc 2"


@contextmanager
def _timed(name: str, log: list[tuple[int, int, str, int]]) -> Iterator[None]:
    start = time.time_ns()  # the clock profiler traces count from (their baseTimeNanoseconds)
    try:
        yield
    finally:
        log.append((start, time.time_ns(), name, threading.get_native_id()))  # the id traces name threads by


def phase(name: str) -> AbstractContextManager:
    """A stretch of the engine's host work (admission, a frame's launch, taking a frame and, inside it, the
    waits for its results, code-to-wave, a prompt's preparation), logged while `recording_phases` runs,
    else nothing but a check. The profiler's own ranges would not do: it records only the thread that
    started it."""
    log = _PHASES
    return _timed(name, log) if log is not None else nullcontext()


def _gc_logger(log: list[tuple[int, int, str, int]]) -> Any:
    """A gc callback logging each collection as phase "gc <generation>": a collection stops every thread
    that wants the interpreter, so it is host work like any phase."""
    started: dict[int, int] = {}

    def logged(event: str, info: dict[str, Any]) -> None:
        tid = threading.get_native_id()
        if event == "start":
            started[tid] = time.time_ns()
        elif tid in started:
            log.append((started.pop(tid), time.time_ns(), f"{GC_PHASE}{info['generation']}", tid))

    return logged


@contextmanager
def recording_phases() -> Iterator[list[tuple[int, int, str, int]]]:
    """Log every thread's `phase` and every garbage collection ("gc 0".."gc 2") while the block runs:
    [(start ns, end ns, phase, OS thread id)] by time.time_ns, in the order they ended (a phase that began
    inside the block may still end in it after)."""
    global _PHASES
    outer, log = _PHASES, []
    _PHASES = log
    logger = _gc_logger(log)
    gc.callbacks.append(logger)
    try:
        yield log
    finally:
        gc.callbacks.remove(logger)
        _PHASES = outer


@dataclass
class RequestMetrics:
    """One request's timings. TTFP: accepted -> first audio chunk ready, in three parts: queued (accepted ->
    taken into a slot: waiting for a free slot or for its mode's warm-up), first codes (taken -> its first
    frame's codes on the host: prefill and one frame) and first chunk (those codes -> the chunk: the
    audio stage's wait and decode); RTF = E2E / audio seconds."""

    request_id: int
    mode: str
    accepted_at: float
    started_at: float | None = None
    first_codes_at: float | None = None
    first_audio_at: float | None = None
    finished_at: float | None = None
    frames: int = 0
    audio_samples: int = 0
    sample_rate: int = 24000
    status: str = "running"  # running | done | cancelled | error
    error: str | None = None
    reason: str | None = None  # why it was cancelled or ended early ("client gone", "deadline exceeded")

    @property
    def outcome(self) -> str:
        """The status with its reason: 'done', 'cancelled (client gone)', 'error (deadline exceeded)'."""
        return f"{self.status} ({self.reason})" if self.reason else self.status

    @property
    def ttfp_ms(self) -> float | None:
        return None if self.first_audio_at is None else 1000.0 * (self.first_audio_at - self.accepted_at)

    @property
    def queue_ms(self) -> float | None:
        return None if self.started_at is None else 1000.0 * (self.started_at - self.accepted_at)

    @property
    def first_codes_ms(self) -> float | None:
        """Taken into a slot -> the first frame's codes on the host."""
        if self.started_at is None or self.first_codes_at is None:
            return None
        return 1000.0 * (self.first_codes_at - self.started_at)

    @property
    def first_chunk_ms(self) -> float | None:
        """The first frame's codes on the host -> the first audio chunk ready."""
        if self.first_codes_at is None or self.first_audio_at is None:
            return None
        return 1000.0 * (self.first_audio_at - self.first_codes_at)

    @property
    def e2e_ms(self) -> float | None:
        return None if self.finished_at is None else 1000.0 * (self.finished_at - self.accepted_at)

    @property
    def audio_s(self) -> float:
        return self.audio_samples / float(self.sample_rate)

    @property
    def rtf(self) -> float | None:
        if self.e2e_ms is None or self.audio_s <= 0:
            return None
        return (self.e2e_ms / 1000.0) / self.audio_s

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(ttfp_ms=self.ttfp_ms, queue_ms=self.queue_ms, first_codes_ms=self.first_codes_ms,
                 first_chunk_ms=self.first_chunk_ms, e2e_ms=self.e2e_ms, audio_s=self.audio_s, rtf=self.rtf)
        return d


def gpu_memory(device: torch.device | str | None, pool_bytes: int = 0, tree_pool_bytes: int = 0,
               codec_pool_bytes: int = 0) -> dict[str, float]:
    """Allocated / reserved / peak (GiB), the engine's graph pools and their share, Inductor's graph-tree
    pool (reduce-overhead) and the codec's chunk graphs' pools, or {} without CUDA."""
    if device is None or torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return {}
    gib = float(1 << 30)
    reserved = torch.cuda.memory_reserved(device)
    return {
        "allocated_gib": torch.cuda.memory_allocated(device) / gib,
        "reserved_gib": reserved / gib,
        "peak_gib": torch.cuda.max_memory_allocated(device) / gib,
        "graph_pool_gib": pool_bytes / gib,
        "graph_pool_share": (pool_bytes / reserved) if reserved else 0.0,
        "tree_pool_gib": tree_pool_bytes / gib,
        "codec_graph_pool_gib": codec_pool_bytes / gib,
    }


@dataclass
class EngineStats:
    """Engine-wide counters, updated by the scheduler and code-to-wave threads, read by anyone."""

    history: int = 200
    steps: int = 0
    busy_slots_sum: int = 0
    chunk_decodes: int = 0  # audio chunk windows decoded by the code-to-wave stage...
    decode_calls: int = 0  # ...in this many codec calls (fewer when chunks of several requests batch)
    decode_seconds: float = 0.0  # wall time of the code-to-wave stage's decode passes
    heap_trims: int = 0  # heap pages handed back to the OS so far (the engine's periodic trim)
    started_at: float = field(default_factory=now)
    capture: dict[str, dict[str, float]] = field(default_factory=dict)  # mode -> {seconds, pool_bytes}
    recent: deque = field(default_factory=deque)
    # (mode, outcome) -> requests that ended so (done, cancelled (client gone), ...) or were refused at submit
    outcomes: dict[tuple[str, str], int] = field(default_factory=dict)
    observers: list = field(default_factory=list)  # fn(RequestMetrics) for every request that ends
    _step_times: deque = field(default_factory=lambda: deque(maxlen=256))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def on_step(self, batch: int) -> None:
        with self._lock:
            self.steps += 1
            self.busy_slots_sum += batch
            self._step_times.append(now())

    def on_decode(self, chunks: int, calls: int, seconds: float = 0.0) -> None:
        with self._lock:
            self.chunk_decodes += chunks
            self.decode_calls += calls
            self.decode_seconds += seconds

    def on_finish(self, m: RequestMetrics) -> None:
        with self._lock:
            self.recent.append(m)
            while len(self.recent) > self.history:
                self.recent.popleft()

    def on_heap_trim(self) -> None:
        self.heap_trims += 1

    def count(self, mode: str, outcome: str) -> None:
        with self._lock:
            self.outcomes[(mode, outcome)] = self.outcomes.get((mode, outcome), 0) + 1

    def on_end(self, m: RequestMetrics) -> None:
        """Any outcome (done, cancelled, error): counted by mode and outcome, and shown to the observers."""
        self.count(m.mode, m.outcome)
        for fn in list(self.observers):
            try:
                fn(m)
            except Exception:  # an observer's failure never stops an engine thread
                pass

    def steps_per_s(self) -> float:
        with self._lock:
            t = list(self._step_times)
        if len(t) < 2 or now() - t[-1] > 1.0:
            return 0.0
        return (len(t) - 1) / max(t[-1] - t[0], 1e-9)

    def mean_occupancy(self) -> float:
        return self.busy_slots_sum / self.steps if self.steps else 0.0

    def recent_requests(self, n: int = 50) -> list[RequestMetrics]:
        with self._lock:
            return list(self.recent)[-n:]


def summarize(records: list[RequestMetrics], wall_s: float) -> dict[str, float]:
    """The benchmark table's figures over finished requests of one run."""
    done = [r for r in records if r.status == "done"]
    ttfp = [r.ttfp_ms for r in done if r.ttfp_ms is not None]
    queued = [r.queue_ms for r in done if r.queue_ms is not None]
    codes = [r.first_codes_ms for r in done if r.first_codes_ms is not None]
    chunk = [r.first_chunk_ms for r in done if r.first_chunk_ms is not None]
    e2e = [r.e2e_ms for r in done if r.e2e_ms is not None]
    rtf = [r.rtf for r in done if r.rtf is not None]
    audio = sum(r.audio_s for r in done)

    def pct(xs: list[float], q: float) -> float:
        if not xs:
            return float("nan")
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]

    return {
        "requests": float(len(done)),
        "med_ttfp_ms": statistics.median(ttfp) if ttfp else float("nan"),
        "p90_ttfp_ms": pct(ttfp, 0.9),
        "med_queue_ms": statistics.median(queued) if queued else float("nan"),
        "med_first_codes_ms": statistics.median(codes) if codes else float("nan"),
        "med_first_chunk_ms": statistics.median(chunk) if chunk else float("nan"),
        "med_e2e_ms": statistics.median(e2e) if e2e else float("nan"),
        "mean_rtf": statistics.fmean(rtf) if rtf else float("nan"),
        "req_per_s": len(done) / wall_s if wall_s > 0 else float("nan"),
        "audio_s_per_s": audio / wall_s if wall_s > 0 else float("nan"),
        "audio_s": audio,
        "wall_s": wall_s,
    }
