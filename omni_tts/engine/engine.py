"""The engine: the public API over one model, its resident modes and the shared audio stage.

Owns: loading (`Engine.from_config`), the one scheduler per resident mode (each with its own runner and
thread), warming the modes in the background (the default mode first, then eager, the rest), routing each
request to its mode, the shared step stream and graph pool, the audio stage, and the engine-wide
snapshot. `submit` validates and prepares a request once, in the caller's thread; nothing here runs
device math itself. Knows nothing about Gradio.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import itertools
import sys
import threading
import time
import weakref
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from omni_tts.config import CompileMode, EngineConfig, SynthesisParams, require_params
from omni_tts.engine import heap
from omni_tts.engine.audio_stage import AudioStage, fuse_codec
from omni_tts.engine.cuda_graphs import GraphPool
from omni_tts.engine.long_text import LongTextHandle
from omni_tts.engine.metrics import EngineStats, RequestMetrics, gpu_memory, now, phase
from omni_tts.engine.mode_scheduler import ModeScheduler, Request
from omni_tts.engine.model_runner import Runner
from omni_tts.engine.request import AudioChunk, OpenCount, RequestHandle, SynthesisResult
from omni_tts.engine.snapshot import EngineSnapshot, ModeStatus
from omni_tts.engine.step_impl import StepImpls
from omni_tts.engine.warmup import WarmupCoordinator, warm_order
from omni_tts.errors import EngineError, InputError, OmniTTSError, Overloaded, one_line
from omni_tts.models.loading import load_model
from omni_tts.models.qwen3_tts import Prepared, TTSModel
from omni_tts.models.segments import over_budget

__all__ = ["AudioChunk", "Engine", "EngineSnapshot", "ModeStatus", "RequestHandle", "SynthesisResult"]
# The scheduler and code-to-wave threads share the GIL; a short switch interval keeps a thread that waits
# for it from waiting a large part of a frame (a process-wide setting; it only ever lowers it).
GIL_SWITCH_INTERVAL_S = 0.0005
_LIVE: weakref.WeakSet[Engine] = weakref.WeakSet()


class Engine:
    """In-process batched streaming synthesis over one model. Thread-safe `submit`."""

    def __init__(self, model: TTSModel, config: EngineConfig, progress: Callable[[str], None] | None = None,
                 warm: bool = True) -> None:
        """warm: start warming the modes now (else at `start_warming`, e.g. once a page is up: the warm-up
        threads compete for the GIL with whatever the caller builds meanwhile)."""
        self.model, self.config = model, config
        self.device = model.device
        self.stats = EngineStats()
        self._say = progress or (lambda s: None)
        self._ids = itertools.count(1)
        self._queueing = threading.Lock()  # an id is taken and its request queued as one step
        n = config.experimental.max_preparing
        self._preparing = threading.BoundedSemaphore(n) if n else nullcontext()  # the gate around preparation
        self._closed = False
        self.draining = False  # `drain`: new requests refused while the accepted ones finish
        self._open = OpenCount()  # callers' requests accepted and not yet ended (a long text once)
        cuda = self.device.type == "cuda"
        model.set_codec_precision(config.resolved_codec_precision(cuda))
        self.impls = StepImpls(model, config)
        self.default_mode = config.default_mode(cuda)
        if self.impls.unavailable(self.default_mode):
            raise OmniTTSError(f"mode {self.default_mode.value}: {self.impls.unavailable(self.default_mode)}")
        self.kernel_notice = self.codec_fused_error = ""
        self._primer: threading.Thread | None = None
        resident = [m for m in config.resident_modes(cuda) if not self.impls.unavailable(m)]
        self._audio = AudioStage(self.device, self.stats, priority=cuda)
        # one step stream for every mode: graphs that share a pool must never run at the same time
        self._stream = torch.cuda.Stream(self.device, priority=-1) if cuda else None
        self.schedulers: dict[CompileMode, ModeScheduler] = {}
        self.warmup = WarmupCoordinator()  # when warm-up work runs beside requests (its rules: warmup.py)
        for mode in resident:
            # one pool per mode (its graphs never run beside another mode's on the shared stream); a
            # `vllm_pool` mode's is vLLM's global pool when vllm is importable, as in vLLM-Omni
            vllm = config.experimental.use_vllm_pool and mode.spec.vllm_pool
            pool = GraphPool(vllm) if self.impls.talker_graphs else None
            runner = Runner(model, config, mode, self.impls, pool)
            self.schedulers[mode] = ModeScheduler(runner, config, self._audio, self.stats, self._step_stream,
                                                  self._decoder, self.warmup)
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))
        order = warm_order(list(self.schedulers), self.default_mode)
        self._warmer = threading.Thread(target=self._warm_all, args=(order,), name="omni-tts-warm", daemon=True)
        if warm:
            self.start_warming()
        self._stop_trim = threading.Event()
        threading.Thread(target=heap.trim_until, args=(self._stop_trim, self.stats.on_heap_trim),
                         name="omni-tts-trim", daemon=True).start()
        _LIVE.add(self)

    @classmethod
    def from_config(cls, config: EngineConfig, progress: Callable[[str], None] | None = None,
                    wait: bool = True, warm: bool = True) -> Engine:
        """Load the model and start serving; `wait`: return once the default mode is warm (the others
        keep warming in the background)."""
        if not isinstance(config, EngineConfig):
            raise OmniTTSError(f"Engine.from_config takes an EngineConfig, e.g. load_preset('default') "
                               f"(got {type(config).__name__})")
        t0 = time.perf_counter()
        model = load_model(config, progress)
        if progress:
            progress(f"model loaded in {time.perf_counter() - t0:.1f} s")
        engine = cls(model, config, progress, warm=warm or wait)
        if wait:
            engine.wait_ready(engine.default_mode)
        return engine

    # ------------------------------------------------------------------ requests
    def submit(self, params: SynthesisParams) -> RequestHandle:
        """Validate, prepare and queue a request; bad input raises an OmniTTSError at once. A text over the
        segment budget is spoken in segments (run unrecorded: the counters hold the caller's request once),
        behind a handle with the same interface."""
        require_params(params)
        if self.draining and not self._closed:
            raise EngineError("the engine is shutting down: it takes no new requests; try another server")
        self._open.add(1)  # until the handle's end (`_ended`)
        try:
            if over_budget(params.text):
                return LongTextHandle(functools.partial(self._submit, recorded=False), params,
                                      self.model.sample_rate, self.config.max_num_seqs, on_finish=self._ended)
            return self._submit(params)
        except BaseException as e:
            self._open.add(-1)
            if isinstance(e, Overloaded):
                self.stats.count(self._scheduler(params.mode).mode.value, "refused (overloaded)")
            raise

    def check(self, params: SynthesisParams) -> None:
        """Raise the InputError `submit` would raise for these settings (a mode not resident, a speaker,
        language or task the checkpoint has not, a prompt that does not fit), queueing nothing: a session
        checks its settings once, before its texts arrive."""
        require_params(params)
        params.validate()
        self._scheduler(params.mode)
        whole = dataclasses.replace(params, text=".") if over_budget(params.text) else params  # spoken in segments
        self.model.prepare(whole, self.config.max_seq_len)

    def _ended(self, m: RequestMetrics) -> None:
        """A caller's request ended (not a segment's, not priming's): counted, and a finished one recorded."""
        self.stats.on_end(m)
        if m.status == "done":
            self.stats.on_finish(m)
        self._open.add(-1)

    def _submit(self, params: SynthesisParams, recorded: bool = True,
                accepted_at: float | None = None) -> RequestHandle:
        """`accepted_at`: when the caller's request was accepted, if before now (a long text's segment)."""
        if self._closed:
            raise EngineError("the engine is shut down")
        params.validate()
        sched = self._scheduler(params.mode)
        sched.check_room()  # refused before its prompt is prepared; checked again as it joins the queue
        with sched.arriving(), self._preparing, phase("prepare"):
            prep = self.model.prepare(params, self.config.max_seq_len)
            with self._queueing:  # ids follow the queue's order, so a mode's slots go in id order
                rid = next(self._ids)
                handle = RequestHandle(rid, params, RequestMetrics(rid, sched.mode.value, accepted_at or now(),
                                                                   sample_rate=self.model.sample_rate))
                handle.max_frames = prep.max_frames  # the most frames it can make (its cap or the engine's room)
                handle.on_finish = self._ended if recorded else None
                sched.put(Request(handle, prep))
        return handle

    def synthesize_offline(self, params: SynthesisParams) -> tuple[Any, Any]:
        """One whole clip on the plain single-request path in the caller's thread (ZeroGPU, where the GPU
        exists only inside the caller's call) -> (wav float32, codes [frames, 16])."""
        params.validate()
        from omni_tts.engine.offline import synthesize

        return synthesize(self.model, params)

    def synthesize(self, params: SynthesisParams, timeout: float | None = None) -> SynthesisResult:
        return self.submit(params).result(timeout)

    def voice_prompt(self, audio: Any, ref_text: str | None = None, x_vector_only: bool = False) -> Any:
        """Reference clip -> VoicePrompt for `SynthesisParams(task='voice_clone', voice=...)` (Base checkpoints).

        Runs in the caller's thread with the model's encoders (built once, float32, TF32 off)."""
        return self.model.voice_prompt(audio, ref_text, x_vector_only)

    def _scheduler(self, mode: str | CompileMode | None) -> ModeScheduler:
        m = self.default_mode if mode is None else CompileMode.parse(mode)
        sched = self.schedulers.get(m)
        if sched is None:
            why = self.impls.unavailable(m) or "not resident in this engine (preset key 'modes')"
            raise InputError(f"mode {m.value} is not available: {why}")
        return sched

    def _decoder(self, prep: Prepared) -> Any:
        c = self.config
        return self.model.streaming_decoder(c.initial_chunk_frames, c.chunk_frames, prefix_codes=prep.decoder_prefix,
                                            grow=c.chunk_growth)

    # ------------------------------------------------------------------ modes
    def prime(self) -> None:
        """Serve eager now and run a two-frame clip through it in the background: a process's first launch
        of each attention, GEMM and convolution kernel on a request's path loads it (on CUDA, seconds),
        which should not fall on a visitor's first request. Call it before `start_warming` (e.g. while a
        page is built); the warm-up waits for it. Skipped without the eager mode or a voice that needs no
        reference clip (Base)."""
        voice = self.model.plain_voice()
        sched = next((s for m, s in self.schedulers.items() if m.spec.serves_while_warming), None)
        if self._primer is not None or voice is None or sched is None or not sched.serve_early():
            return
        params = SynthesisParams(text="Hello.", greedy=True, fixed_frames=2, mode=sched.mode.value, **voice)
        try:
            handle = self._submit(params, recorded=False)
        except OmniTTSError as e:  # only a missed head start: the app starts all the same
            self._say(f"priming the eager path failed: {one_line(e)}")
            return

        def wait() -> None:
            try:
                seconds = (handle.result().metrics.e2e_ms or 0.0) / 1000
                self._say(f"eager path primed in {seconds:.1f} s")
            except OmniTTSError as e:  # only a missed head start: requests report their own errors
                if not self._closed:
                    self._say(f"priming the eager path failed: {one_line(e)}")

        self._primer = threading.Thread(target=wait, name="omni-tts-prime", daemon=True)
        self._primer.start()

    def wait_primed(self, timeout: float | None = None) -> bool:
        """Wait for `prime`'s clip to end (at most `timeout` s); -> whether no priming is still running."""
        if self._primer is not None:
            self._primer.join(timeout)
        return self._primer is None or not self._primer.is_alive()

    def start_warming(self) -> None:
        """Start compiling and capturing every resident mode in the background (once; idempotent)."""
        if self._warmer.ident is None:  # never started
            self._warmer.start()

    def _step_stream(self) -> Any:
        return torch.cuda.stream(self._stream) if self._stream is not None else nullcontext()

    def _set_up_gpu(self, early: ModeScheduler | None) -> None:
        """Kernel probes, codec fuse and the codec's chunk graphs: before any mode warms (every
        mode's talker captures with the kernels chosen here), after the page is up. With a scheduler serving
        already (`early`: eager, which uses none of these kernels), each part waits for its turn: the
        probes between its requests, the codec's changes between its frames."""
        model = self.model
        between = early.between_frames if early is not None else (lambda fn: fn())
        t = [time.perf_counter()]
        self.warmup.give_way()
        self.kernel_notice = self.impls.configure_kernels(self.config.resolved_buckets(), model.dtype,
                                                          self.warmup.give_way)
        t.append(time.perf_counter())
        self.codec_fused_error = between(lambda: fuse_codec(model.codec))
        t.append(time.perf_counter())
        if not self.config.enforce_eager:  # the all-eager baseline captures nothing
            self._audio.capture_chunk_graphs(model.codec, self.config, between)
        t.append(time.perf_counter())
        self._say(f"GPU set-up took {t[3] - t[0]:.1f} s: kernel probes {t[1] - t[0]:.1f} s, codec fuse "
                  f"{t[2] - t[1]:.1f} s, chunk graphs {t[3] - t[2]:.1f} s")

    def _warm_all(self, order: list[CompileMode]) -> None:
        # a scheduler that needs no warm-up to serve (eager) serves from now on, before the GPU set-up
        early = next((sched for sched in self.schedulers.values() if sched.serve_early()), None)
        self.wait_primed()  # its audio decodes with the codec that the set-up changes
        if self.device.type == "cuda":
            try:
                self._set_up_gpu(early)
            except EngineError:
                if self._closed:  # it shut down meanwhile
                    return
                raise
        for mode in order:
            if self._closed:
                return
            sched = self.schedulers[mode]
            self._audio.drain()  # no audio decoding while graphs are captured
            sched.warm(self._say)
            if sched.warm_report:
                self.stats.capture[mode.value] = {k: sched.warm_report[k]
                                                  for k in ("seconds", "pool_bytes", "tree_pool_bytes")}

    def wait_ready(self, mode: str | CompileMode | None = None, timeout: float | None = None) -> bool:
        """Block until `mode` (default: the engine's default mode) is warm; False on timeout."""
        return self._scheduler(mode).ready.wait(timeout)

    def set_default_mode(self, mode: str | CompileMode) -> CompileMode:
        """The mode of requests that name none (an engine-wide choice: the app keeps it for its admins)."""
        self.default_mode = self._scheduler(mode).mode
        return self.default_mode

    def modes(self) -> dict[str, ModeStatus]:
        """Every mode (by value, in enum order) as it stands now."""
        out: dict[str, ModeStatus] = {}
        for m in CompileMode:
            sched = self.schedulers.get(m)
            why = self.impls.unavailable(m) or ("" if sched else "not resident (preset key 'modes')")
            out[m.value] = ModeStatus(
                state=sched.state if sched else "unavailable", serving=bool(sched and sched.serving),
                progress=sched.warm_progress if sched else (0, 0), reason=sched.error if sched else why,
                note=m.spec.note, seconds=sched.warm_report.get("seconds") if sched else None,
                is_default=m is self.default_mode, kernels=self.impls.kernels_report(m))
        return out

    def available_modes(self) -> dict[str, str | None]:
        """mode -> None when requests can use it here (now or once warm), else the reason it cannot."""
        return {m: None if v.usable else v.reason or v.state for m, v in self.modes().items()}

    def mode_notes(self) -> dict[str, str]:
        return {m.value: m.spec.note for m in CompileMode}

    # ------------------------------------------------------------------ description
    @property
    def mode(self) -> CompileMode:
        return self.default_mode

    def speakers(self) -> list[str]:
        return self.model.speakers()

    def languages(self) -> list[str]:
        return self.model.languages()

    def tasks(self) -> list[str]:
        return self.model.tasks()

    def plain_voice(self) -> dict[str, Any] | None:
        """Task, speaker and instruct of a voice the model serves without a reference clip (None: Base)."""
        return self.model.plain_voice()

    @property
    def sample_rate(self) -> int:
        return self.model.sample_rate

    def model_info(self) -> dict[str, Any]:
        """What the loaded model is and offers: description, embedded-demo flag, why it was chosen,
        speakers, languages, tasks, instruct support, generation defaults, sample rate, short name."""
        ckpt = self.model.checkpoint
        embedded = ckpt.is_embedded_demo
        describe = f"embedded tiny random demo checkpoint (`{ckpt.path}`)" if embedded else ckpt.describe()
        return {"speakers": list(self.speakers()), "languages": list(self.languages()), "tasks": list(self.tasks()),
                "instruct": bool(self.model.supports_instruct()), "describe": describe, "embedded": embedded,
                "generation": dict(ckpt.generation_config or {}), "reason": (ckpt.notes or [""])[-1],
                "sample_rate": int(self.sample_rate), "name": Path(str(ckpt.path)).name or "omni-tts"}

    def snapshot(self) -> EngineSnapshot:
        """Engine-wide figures for dashboards (cheap)."""
        active = {m.value: len(sched.active) for m, sched in self.schedulers.items()}
        waiting = {m.value: sched.waiting.qsize() for m, sched in self.schedulers.items()}
        pool = sum(sched.runner.pool_bytes() for sched in self.schedulers.values())
        trees = sum(c.get("tree_pool_bytes", 0) for c in self.stats.capture.values())
        codec = self.model.codec_if_built
        return EngineSnapshot(
            mode=self.default_mode.value, modes=self.modes(), device=str(self.device),
            dtype=str(self.model.dtype).replace("torch.", ""),
            active=sum(active.values()), active_by_mode=active, waiting=sum(waiting.values()),
            waiting_by_mode=waiting, max_num_seqs=self.config.max_num_seqs, steps_per_s=self.stats.steps_per_s(),
            mean_occupancy=self.stats.mean_occupancy(), chunk_decodes=self.stats.chunk_decodes,
            decode_calls=self.stats.decode_calls, decode_seconds=self.stats.decode_seconds,
            layer_kernels=self.impls.kernels_report(self.default_mode),
            kernels=_state(self.impls.talker_graphs and self.config.experimental.kernels, self.kernel_notice),
            enforce_eager=self.config.enforce_eager, codec_precision=getattr(codec, "precision", "not built"),
            codec_fused=_state(getattr(codec, "fused", False), self.codec_fused_error),
            first_chunk_graphs=_state(self._audio.first is not None, self._audio.first_error),
            carried_chunk_graphs=_state(self._audio.carried is not None, self._audio.carried_error),
            steps=self.stats.steps, busy_slots_sum=self.stats.busy_slots_sum,
            memory=gpu_memory(self.device, pool, trees, self._audio.graph_pool_bytes()),
            capture=dict(self.stats.capture), model=self.model.describe())

    def drain(self, timeout: float) -> bool:
        """Refuse new requests (EngineError) and wait up to `timeout` s for the accepted ones to end; ->
        whether they all did. `shutdown` then ends any still running."""
        self.draining = True
        return self._open.wait_none(timeout)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Stop serving: requests still waiting or running end with an EngineError, the threads stop. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop_trim.set()
        self.warmup.close()
        for sched in self.schedulers.values():  # every sched told first, so none starts a warm step meanwhile
            sched.stop(timeout=0)
        for sched in self.schedulers.values():
            sched.stop()
        self._audio.stop(timeout=30)
        self.wait_primed(30)  # the priming thread's last progress line comes before the caller's next one


def _state(on: bool, error: str) -> str:
    """An optional accelerator for the snapshot: on, failed (why: it fell back), or off (not asked for)."""
    return "on" if on else f"failed: {error}" if error else "off"


@atexit.register
def _shutdown_live() -> None:
    """Stop every live engine's threads before the interpreter tears down (no abort at exit)."""
    for engine in list(_LIVE):
        engine.shutdown()
