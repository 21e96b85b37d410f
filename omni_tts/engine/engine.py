"""The engine: request admission, the batched frame loop, cancellation, mode switches.

Owns: the scheduler thread, request handles (stream / cancel / result), slot bookkeeping on the
host side, creating each request's streaming decoder, metrics records, and mode switches between
steps. Each step's codes go to the code-to-wave stage (`omni_tts.engine.audio_stage`: its own thread, chunks
of many requests decoded in one batch), which emits the audio and completes requests.
Does not own device math: `omni_tts.engine.model_runner.Runner` holds the batched device state and the step
functions (and their compile modes / CUDA graphs). Knows nothing about Gradio.
"""

from __future__ import annotations

import itertools
import queue
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from omni_tts.models.voice_clone import decoder_prefix
from omni_tts.engine.audio_stage import AudioChunk, Code2Wav, fuse_codec
from omni_tts.config import CompileMode, EngineConfig, SynthesisParams
from omni_tts.errors import EngineError, OmniTTSError, as_engine_error
from omni_tts.engine.metrics import EngineStats, RequestMetrics, gpu_memory, now

__all__ = ["AudioChunk", "Engine", "RequestHandle", "SynthesisResult"]
_DONE = object()
# The scheduler and code-to-wave threads share the GIL. Python hands it to a waiting thread only after
# the switch interval (5 ms by default): while the code-to-wave thread launches a chunk's ~900 eager
# kernels, the scheduler could wait that long for every step's launch. 0.5 ms keeps it waiting less
# than a tenth of a frame (a process-wide setting; it only ever lowers it).
GIL_SWITCH_INTERVAL_S = 0.0005


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
        self._events: queue.Queue = queue.Queue()
        self._chunks: list[np.ndarray] = []
        self._codes: list[np.ndarray] = []
        self._error: OmniTTSError | None = None
        self._finished = threading.Event()
        self.cancel_requested = threading.Event()
        self.sample_rate = metrics.sample_rate

    # --- called by the scheduler thread ---
    def _emit(self, chunk: AudioChunk) -> None:
        self._chunks.append(chunk.samples)
        self._events.put(chunk)

    def _finish(self, codes: list[np.ndarray], error: OmniTTSError | None = None) -> None:
        self._codes = codes
        self._error = error
        self._finished.set()
        self._events.put(_DONE)

    def _end_unstarted(self, status: str, error: OmniTTSError | None = None) -> None:
        """A request that never got a slot (cancelled in the queue, refused at admission, shut down)."""
        m = self.metrics
        m.status, m.finished_at, m.error = status, now(), str(error) if error else None
        self._finish([], error)

    # --- called by users ---
    def stream(self, timeout: float | None = None) -> Iterator[AudioChunk]:
        """Yield chunks as they are made; raises the request's error, if any, at the end."""
        while True:
            item = self._events.get(timeout=timeout)
            if item is _DONE:
                break
            yield item
        if self._error is not None:
            raise self._error

    def cancel(self) -> None:
        self.cancel_requested.set()

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def result(self, timeout: float | None = None) -> SynthesisResult:
        if not self._finished.wait(timeout):
            raise EngineError(f"request {self.id} did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        wav = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.float32)
        codes = np.stack(self._codes) if self._codes else np.zeros((0, 16), np.int64)
        return SynthesisResult(wav.astype(np.float32, copy=False), codes, self.sample_rate, self.metrics)


@dataclass(eq=False)  # identity: slots are found with `is`-equality
class _Active:
    """Host-side record of a request in a slot."""

    handle: RequestHandle
    decoder: Any  # codec.StreamingDecoder
    max_frames: int
    fixed: bool
    codes: list[np.ndarray] = field(default_factory=list)
    chunks: int = 0
    failed: bool = False
    left: bool = False  # out of its slot (finished, cancelled or failed): later step results are ignored


class Engine:
    """In-process batched streaming synthesis over one model. Thread-safe `submit`."""

    def __init__(self, runner: Any, config: EngineConfig) -> None:
        self.runner = runner
        self.config = config
        self.model = runner.model
        self.stats = EngineStats()
        self._ids = itertools.count(1)
        self._waiting: "queue.Queue[RequestHandle]" = queue.Queue()
        self._control: "queue.Queue[tuple[Callable[[], Any], queue.Queue]]" = queue.Queue()
        self._active: list[_Active] = []  # index == slot (kept compact: slots 0..n-1)
        # one frame of lookahead: the step launched last and the requests in its rows, read after the
        # next step is launched, so the device never waits for the host's bookkeeping
        self._pending: tuple[Any, list[_Active]] | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        # code-to-wave stage: its own thread (and CUDA stream), so decoding audio chunks overlaps the
        # next frames' talker/predictor work; it decodes the chunks of many requests in one batch
        # (on CUDA its first chunks, the TTFP path, replay as CUDA graphs)
        cuda = runner.device.type == "cuda"
        self.codec_fused_error = fuse_codec(self.model.codec) if cuda and config.codec_fused else ""
        first = ((self.model.codec, config.initial_chunk_frames, config.resolved_buckets())
                 if cuda and config.first_chunk_graphs else None)
        self._c2w = Code2Wav(runner.device, self.stats, first, priority=cuda and config.priority_streams)
        self._sync_first_chunk_graphs()
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))
        self._thread = threading.Thread(target=self._loop, name="omni-tts-scheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, config: EngineConfig, progress: Callable[[str], None] | None = None) -> "Engine":
        from omni_tts.engine.model_runner import Runner

        runner = Runner.from_config(config, progress=progress)
        runner.model.codec  # build the codec decoder now: a broken one is a CheckpointError here, not per request
        return cls(runner, config)

    # ------------------------------------------------------------------ public API
    @property
    def mode(self) -> CompileMode:
        return self.runner.mode

    def submit(self, params: SynthesisParams) -> RequestHandle:
        """Validate and queue a request; bad input raises an OmniTTSError at once."""
        if self._stop.is_set():
            raise EngineError("the engine is shut down")
        params.validate()
        self.model.check_request(params)
        rid = next(self._ids)
        metrics = RequestMetrics(rid, self.runner.mode.value, now(), sample_rate=self.model.sample_rate)
        handle = RequestHandle(rid, params, metrics)
        self._waiting.put(handle)
        self._wake.set()
        return handle

    def synthesize(self, params: SynthesisParams, timeout: float | None = None) -> SynthesisResult:
        return self.submit(params).result(timeout)

    def voice_prompt(self, audio: Any, ref_text: str | None = None, x_vector_only: bool = False) -> Any:
        """Reference clip -> VoicePrompt for `SynthesisParams(task='voice_clone', voice=...)` (Base checkpoints).

        Runs in the caller's thread with the model's encoders (built once, float32, TF32 off). A streamed
        ICL clone's audio is exactly its generated frames'; the official cut keeps one more leading sample
        for ~4% of length pairs (see omni_tts.models.voice_clone.reference_cut), which a stream cannot know in advance."""
        return self.model.voice_prompt(audio, ref_text, x_vector_only)

    def set_compile_mode(self, mode: str | CompileMode,
                         progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Switch modes between steps: in-flight requests pause, graphs are released, a fresh pool
        is taken, the new mode is compiled/captured, and the same requests resume (nothing lost)."""
        mode = CompileMode.parse(mode)
        def switch() -> dict[str, Any]:
            self._c2w.drain()  # no audio decoding on the code-to-wave thread while graphs are captured
            report = self.runner.set_mode(mode, progress=progress)
            self._sync_first_chunk_graphs()
            return report
        return self._call_on_loop(switch)

    def _sync_first_chunk_graphs(self) -> None:
        """First-chunk graphs replay in every mode but reduce-overhead (see Code2Wav.graphs_on)."""
        self._c2w.graphs_on = self.runner.mode is not CompileMode.REDUCE_OVERHEAD

    def available_modes(self) -> dict[str, str | None]:
        """mode -> None when usable here, else the reason it is not."""
        return self.runner.available_modes()

    def mode_notes(self) -> dict[str, str]:
        """mode -> one line on what it runs and what it costs (e.g. 'reduce-overhead' is usable on CUDA but is
        the slow comparison mode)."""
        return self.runner.mode_notes()

    def snapshot(self) -> dict[str, Any]:
        """Engine-wide figures for dashboards (cheap)."""
        return {
            "mode": self.runner.mode.value,
            "device": str(self.runner.device),
            "dtype": str(self.runner.dtype).replace("torch.", ""),
            "active": len(self._active),
            "waiting": self._waiting.qsize(),
            "max_num_seqs": self.config.max_num_seqs,
            "steps_per_s": self.stats.steps_per_s(),
            "mean_occupancy": self.stats.mean_occupancy(),
            "chunk_decodes": self.stats.chunk_decodes,  # audio chunk windows decoded...
            "decode_calls": self.stats.decode_calls,  # ...in this many (batched) codec calls
            "decode_seconds": self.stats.decode_seconds,  # ...taking this long in all
            "layer_kernels": self.runner.layer_kernels(),
            "codec_precision": getattr(self.model.codec_if_built, "precision", "not built"),
            "codec_fused": _state(getattr(self.model.codec_if_built, "fused", False), self.codec_fused_error),
            "first_chunk_graphs": (_state(self._c2w.first is not None, self._c2w.first_error) if self._c2w.graphs_on
                                   else "paused (reduce-overhead: decoded eagerly)"),
            "steps": self.stats.steps,
            "memory": gpu_memory(self.runner.device, self.runner.pool_bytes()),
            "capture": dict(self.stats.capture),
            "model": self.model.describe(),
        }

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)
        self._c2w.stop(timeout=30)

    # ------------------------------------------------------------------ scheduler thread
    def _call_on_loop(self, fn: Callable[[], Any]) -> Any:
        reply: queue.Queue = queue.Queue()
        self._control.put((fn, reply))
        self._wake.set()
        ok, value = reply.get()
        if not ok:
            raise value
        return value

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self.runner.step_stream():  # the current mode's stream (a mode switch may change it)
                self._iterate()
        self._pending = None
        for a in self._active:
            self._finish(a, "cancelled", EngineError("the engine shut down"))
        while not self._waiting.empty():
            self._waiting.get()._end_unstarted("cancelled", EngineError("the engine shut down"))

    def _iterate(self) -> None:
        """One pass of the scheduler: control calls, admissions, then one frame (or a short idle wait)."""
        if not self._control.empty():
            self._guard(self._settle)  # a mode switch acts on a settled state
        self._run_control()
        self._admit()
        if not self._active:
            self._guard(self._settle)
            self._wake.wait(0.05)
            self._wake.clear()
            return
        self._guard(self._step)

    def _guard(self, fn: Callable[[], None]) -> None:
        """Run a step-loop action; a device error fails the active requests and the engine keeps serving."""
        try:
            fn()
        except Exception as e:
            err = as_engine_error(e, "generation failed")
            self._pending = None
            for a in list(self._active):
                self._finish(a, "error", err)
            self._active.clear()

    def _run_control(self) -> None:
        while not self._control.empty():
            fn, reply = self._control.get()
            try:
                value = fn()
                if isinstance(value, dict) and "mode" in value:
                    self.stats.capture[value["mode"]] = {k: value[k] for k in ("seconds", "pool_bytes")
                                                         if k in value}
                reply.put((True, value))
            except Exception as e:
                reply.put((False, as_engine_error(e, "")))

    def _admit(self) -> None:
        """Take waiting requests into free slots; their prompts are prefilled together (one talker pass
        for up to 8), so a burst of arrivals costs about one prefill, not one each."""
        batch: list[tuple[RequestHandle, Any, Any]] = []  # (handle, runner.Admission, streaming decoder)
        while len(self._active) + len(batch) < self.config.max_num_seqs and not self._waiting.empty():
            h = self._waiting.get()
            if h.cancel_requested.is_set():
                h._end_unstarted("cancelled")
                continue
            h.metrics.mode = self.runner.mode.value
            try:  # any failure here is this request's, never the scheduler thread's (it would hang everyone)
                adm = self.runner.prepare(h.params)
                # voice-clone ICL: the reference codes prime the decoder (left context, never emitted)
                dec = self.model.streaming_decoder(self.config.initial_chunk_frames, self.config.chunk_frames,
                                                   self.config.left_context_frames,
                                                   prefix_codes=decoder_prefix(h.params),
                                                   grow=self.config.chunk_growth)
            except Exception as e:
                h._end_unstarted("error", as_engine_error(e, "could not start the request"))
                continue
            batch.append((h, adm, dec))
        if not batch:
            return
        first = len(self._active)
        try:
            self.runner.prefill_batch(first, [adm for _, adm, _ in batch])
        except Exception as e:  # a device error here: these requests fail, the engine keeps serving
            for h, _, _ in batch:
                h._end_unstarted("error", as_engine_error(e, "could not start the request"))
            return
        for h, adm, dec in batch:
            self._active.append(_Active(h, dec, adm.max_frames, adm.settings.fixed))

    def _step(self) -> None:
        """Launch the next frame of every active request, then take in the frame launched before it."""
        ticket = self.runner.launch(len(self._active))
        done, self._pending = self._pending, (ticket, list(self._active))
        if done is not None:
            self._take(*done)
        if not self.config.lookahead:
            self._settle()

    def _settle(self) -> None:
        """Take in the frame still in flight, if any (before a mode switch, and when the engine idles)."""
        done, self._pending = self._pending, None
        if done is not None:
            self._take(*done)

    def _take(self, ticket: Any, rows: list[_Active]) -> None:
        """A launched frame's results: codes to each request (rows[i] held slot i at launch), finished
        requests out of their slots. A request that left after the launch ignores its row: that frame
        (one past its end, or after a cancel) is computed but never used."""
        codes, eos = self.runner.collect(ticket)  # codes: [n, 16] int64 (frame just completed); eos: [n] bool (next)
        self.stats.on_step(sum(not a.left for a in rows))  # rows that count (the lookahead's spares don't)
        jobs: list[tuple] = []  # this step's code-to-wave jobs, queued as one item (decoded as one batch)
        for i, a in enumerate(rows):
            if a.left:
                continue
            a.codes.append(codes[i])
            jobs.append(("push", a, codes[i:i + 1]))
            if a.handle.cancel_requested.is_set():
                jobs.append(("finish", a, "cancelled", None))
                self._leave(a)
            elif len(a.codes) >= a.max_frames or (eos[i] and not a.fixed):
                jobs += [("flush", a), ("finish", a, "done", None)]
                self._leave(a)
        self._c2w.put(jobs)

    def _leave(self, a: _Active) -> None:
        """Free a's slot: the last active request moves into it (slots stay 0..n-1)."""
        a.left = True
        i, last = next(j for j, x in enumerate(self._active) if x is a), len(self._active) - 1
        if i != last:
            self.runner.move_slot(last, i)
            self._active[i] = self._active[last]
        self._active.pop()

    def _finish(self, a: _Active, status: str, error: OmniTTSError | None = None) -> None:
        """Scheduler side: the request leaves its slot; it completes after its audio is decoded."""
        a.left = True
        self._c2w.put([("finish", a, status, error)])


def _state(on: bool, error: str) -> str:
    """A code-to-wave option for the snapshot: on, failed (why: it fell back), or off (not asked for)."""
    return "on" if on else f"failed: {error}" if error else "off"
