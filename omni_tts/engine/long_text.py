"""A long text served as one request: its segments synthesized side by side, delivered as one clip.

Owns `LongTextHandle`, what `Engine.submit` returns for a text over the segment budget: the text cut
by `omni_tts.models.segments`, each segment submitted as an ordinary request with the same voice,
instruct and sampling (one seed for all, so a random seed is drawn once), a few segments ahead of the
one being delivered, and their audio delivered in order with a fixed pause between segments. It has
RequestHandle's interface (stream, cancel, result, metrics over the whole request); cancelling it
cancels every segment, and the server's deadline counts from the request's acceptance for every segment.
Knows nothing about schedulers: it only submits and reads handles.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import threading
from collections.abc import Callable

import numpy as np

from omni_tts.config import SynthesisParams
from omni_tts.engine.metrics import RequestMetrics, now
from omni_tts.engine.request import AudioChunk, RequestHandle
from omni_tts.errors import Cancelled, OmniTTSError, Overloaded, as_engine_error
from omni_tts.models.segments import split_text

# A fixed silence between segments, about the pause a reader leaves between sentences: generated pauses
# would vary with the sampling, and a fixed one keeps the joined clip exactly the segments plus pauses.
PAUSE_S = 0.2


def ahead(max_num_seqs: int) -> int:
    """How many segments of one request may run at once: half the slots (at least one), so a long text
    keeps its next segments ready without shutting other requests out."""
    return max(1, max_num_seqs // 2)


class LongTextHandle(RequestHandle):
    """A request whose text was split into segments; the caller uses it as any RequestHandle."""

    def __init__(self, submit: Callable[..., RequestHandle], params: SynthesisParams,
                 sample_rate: int, max_num_seqs: int,
                 on_finish: Callable[[RequestMetrics], None] | None = None) -> None:
        params.validate()
        self.segments = split_text(params.text)
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        self._parts = [dataclasses.replace(params, text=s, seed=seed) for s in self.segments]
        self._ahead = ahead(max_num_seqs)
        self._handles: list[RequestHandle] = []
        self._lock = threading.Lock()
        accepted = now()
        # every segment counts its deadline (request_timeout_s) from this request's acceptance
        self._submit = functools.partial(submit, accepted_at=accepted)
        try:  # in the caller's thread: a segment the engine refuses raises here, as submit does
            for part in self._parts[:self._ahead]:
                self._handles.append(self._submit(part))
        except Overloaded:  # the first one must get in; the others are submitted as their turn comes
            if not self._handles:
                raise
        except BaseException:
            for h in self._handles:
                h.cancel()
            raise
        first = self._handles[0]
        super().__init__(first.id, params, RequestMetrics(first.id, first.metrics.mode, accepted,
                                                          sample_rate=sample_rate))
        self._pause = np.zeros(round(PAUSE_S * sample_rate), np.float32)
        self._frames = 0
        self._all_codes: list[np.ndarray] = []
        self.on_finish = on_finish  # before the thread starts: its end is counted whenever it comes
        threading.Thread(target=self._run, name=f"omni-tts-long-{self.id}", daemon=True).start()

    def cancel(self, reason: str = "") -> None:
        with self._lock:
            super().cancel(reason)
            for h in self._handles:
                h.cancel(reason)

    def _fill(self, delivering: int) -> None:
        """Submit segments until `ahead` of them, from `delivering` on, have been submitted. A full queue
        refuses only the one being delivered; those further ahead wait for the next segment's turn."""
        while len(self._handles) < min(len(self._parts), delivering + self._ahead):
            try:
                handle = self._submit(self._parts[len(self._handles)])
            except Overloaded:
                if len(self._handles) <= delivering:
                    raise
                return
            with self._lock:
                self._handles.append(handle)
                if self.cancel_requested.is_set():  # cancelled while it was being submitted
                    handle.cancel(self.cancel_reason)

    def _run(self) -> None:
        status, error = "done", None
        try:
            for i in range(len(self._parts)):
                if self.cancel_requested.is_set():
                    raise Cancelled(f"request {self.id} was cancelled")
                self._fill(i)
                self._segment(i)
        except Cancelled:
            status = "cancelled"
        except Exception as e:  # noqa: BLE001 - anything a segment raised ends the whole request with it
            status, error = "error", as_engine_error(e, "a segment of the long text failed")
        finally:
            with self._lock:
                self.cancel_requested.set()  # no more submits; the rest go
                for h in self._handles:
                    h.cancel(self.cancel_reason)
            self.complete(self._all_codes, status, error)

    def _segment(self, i: int) -> None:
        """Deliver segment i (after the pause that parts it from the one before) as this request's chunks."""
        handle, m = self._handles[i], self.metrics
        try:
            for n, chunk in enumerate(handle.stream()):
                if m.started_at is None:
                    m.started_at, m.first_codes_at = handle.metrics.started_at, handle.metrics.first_codes_at
                if n == 0 and i > 0:
                    self._deliver(self._pause, 0)
                self._deliver(chunk.samples, chunk.frames)
        except OmniTTSError:  # cancelled or failed: keep its codes, those of the audio it delivered
            self._all_codes.extend(handle.partial().codes)
            raise
        self._all_codes.extend(handle.result().codes)

    def _deliver(self, samples: np.ndarray, frames: int) -> None:
        m = self.metrics
        if m.first_audio_at is None:
            m.first_audio_at = now()
        m.audio_samples += samples.size
        self.deliver(AudioChunk(self.id, len(self._chunks), samples, self.sample_rate, self._frames, frames))
        self._frames += frames
