"""One request: the record the engine keeps while it is served, and the handle its caller holds.

Owns `Request` (built once at submit: the checked, tokenized and embedded prompt with its resolved
settings, plus the engine-side state of a request in a slot) and `RequestHandle` (stream / cancel /
result for the caller; `deliver` / `complete` for the audio stage). Knows nothing about devices.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_tts.config import SynthesisParams
from omni_tts.engine.metrics import RequestMetrics, now
from omni_tts.errors import Cancelled, DeadlineExceeded, EngineError, OmniTTSError
from omni_tts.models.qwen3_tts import Prepared

_DONE = object()
CLIENT_GONE = "client gone"  # the cancel reason of a request whose caller went away
SHUT_DOWN = "engine shut down"  # the cancel reason of a request the engine's shutdown ended


@dataclass
class AudioChunk:
    """One streamed piece of a request's audio."""

    request_id: int
    index: int
    samples: np.ndarray  # float32 [n]
    sample_rate: int
    first_frame: int  # index of its first code frame within the request's audio
    frames: int


@dataclass
class SynthesisResult:
    wav: np.ndarray  # float32 [samples]
    codes: np.ndarray  # int64 [frames, 16]
    sample_rate: int
    metrics: RequestMetrics


class RequestHandle:
    """What `Engine.submit` returns: iterate `stream()` for chunks, `result()` for the whole clip."""

    def __init__(self, request_id: int, params: SynthesisParams, metrics: RequestMetrics) -> None:
        self.id = request_id
        self.params = params
        self.metrics = metrics
        self.sample_rate = metrics.sample_rate
        self.max_frames: int | None = None  # the most frames this request can make (set at submit)
        self.cancel_requested = threading.Event()
        self.cancel_reason = ""  # why it was cancelled, when the canceller said (e.g. "client gone")
        # called with the final metrics once it ends, whatever its outcome (the engine's counters)
        self.on_finish: Callable[[RequestMetrics], None] | None = None
        self._listeners: list[Callable[[], None]] = []
        self._events: queue.Queue = queue.Queue()
        self._chunks: list[np.ndarray] = []
        self._codes: list[np.ndarray] = []
        self._error: OmniTTSError | None = None
        self._finished = threading.Event()
        self._frames_delivered = 0  # code frames whose audio has been delivered

    # --- the caller's side ---
    def stream(self, timeout: float | None = None) -> Iterator[AudioChunk]:
        """Yield chunks as they are made; raises the request's error (Cancelled included) at the end, and
        queue.Empty when a chunk takes longer than `timeout` s (as `take`)."""
        while (chunk := self.take(timeout)) is not None:
            yield chunk

    def take(self, timeout: float | None = None) -> AudioChunk | None:
        """The next chunk, waiting at most `timeout` s (0: not at all; queue.Empty when none came); None at
        the end, or the request's error raised (Cancelled included)."""
        item = self._events.get(timeout=timeout) if timeout != 0 else self._events.get_nowait()
        if item is not _DONE:
            return item
        self._events.put(_DONE)  # later takes see the end too
        if self._error is not None:
            raise self._error
        return None

    def listen(self, fn: Callable[[], None]) -> None:
        """Call `fn()` (on an engine thread: keep it short) after each chunk and at the end, and once now:
        how an event loop learns that `take(0)` has something, without a thread waiting on it."""
        self._listeners.append(fn)
        fn()

    def cancel(self, reason: str = "") -> None:
        """Stop making audio at the next frame; `reason` goes into the outcome ("cancelled (reason)")."""
        if reason and not self.cancel_requested.is_set():
            self.cancel_reason = reason
        self.cancel_requested.set()

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def result(self, timeout: float | None = None) -> SynthesisResult:
        """The whole clip; raises the request's error, or `Cancelled` (with `.partial`) after a cancel."""
        if not self._finished.wait(timeout):
            raise EngineError(f"request {self.id} did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        return self.partial()

    def partial(self) -> SynthesisResult:
        """What has been delivered so far: audio chunks and the code frames they hold."""
        wav = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.float32)
        codes = np.stack(self._codes) if self._codes else np.zeros((0, 16), np.int64)
        return SynthesisResult(wav.astype(np.float32, copy=False), codes, self.sample_rate, self.metrics)

    def fail_unstarted(self, status: str, error: OmniTTSError | None = None) -> None:
        """A request that never got a slot (cancelled in the queue, refused at admission, shut down)."""
        self.complete([], status, error)

    # --- the engine's side (scheduler and audio stage) ---
    def deliver(self, chunk: AudioChunk) -> None:
        self._chunks.append(chunk.samples)
        self._frames_delivered = chunk.first_frame + chunk.frames
        self._events.put(chunk)
        self._notify()

    def _notify(self) -> None:
        for fn in list(self._listeners):
            try:
                fn()
            except Exception:  # a caller's hook (its event loop closed meanwhile) never stops an engine thread
                pass

    def complete(self, codes: list[np.ndarray], status: str, error: OmniTTSError | None = None) -> None:
        """Finish: status done | cancelled | error. A cancelled request keeps only the frames its
        delivered audio holds, so its codes and audio agree."""
        m = self.metrics
        m.status, m.finished_at = status, now()
        if status != "done":  # its codes are those of the audio it delivered (not frames made after the last chunk)
            codes = codes[:self._frames_delivered]
        if status == "cancelled":
            why = f" ({self.cancel_reason})" if self.cancel_reason else ""
            error = error or Cancelled(f"request {self.id} was cancelled{why}")
            m.reason = self.cancel_reason or None
        elif isinstance(error, DeadlineExceeded):
            m.reason = DeadlineExceeded.reason
        m.frames = len(codes)
        m.error = str(error) if error else None
        self._codes = codes
        if isinstance(error, Cancelled):
            error.partial = self.partial()
        self._error = error
        if self.on_finish is not None:  # counted before the client can see its end: metrics never lag a response
            self.on_finish(m)
        self._finished.set()
        self._events.put(_DONE)
        self._notify()


class OpenCount:
    """The callers' requests accepted and not yet ended, for a drain to wait on."""

    def __init__(self) -> None:
        self._n, self._cv = 0, threading.Condition()

    def add(self, n: int) -> None:
        with self._cv:
            self._n += n
            self._cv.notify_all()

    def wait_none(self, timeout: float) -> bool:
        """Wait up to `timeout` s for none to be open; -> whether none is."""
        with self._cv:
            return self._cv.wait_for(lambda: self._n <= 0, timeout)


@dataclass(eq=False)  # identity: slots are found with `is`-equality
class Request:
    """A request as the engine keeps it: built once at submit, then its slot-side state."""

    handle: RequestHandle
    prep: Prepared
    decoder: Any = None  # codec.StreamingDecoder, made at admission
    codes: list[np.ndarray] = field(default_factory=list)
    chunks: int = 0
    failed: bool = False
    left: bool = False  # out of its slot (finished, cancelled or failed): later step results are ignored
