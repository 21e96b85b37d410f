"""One mode's serving loop: its warm-up (the steps: engine/mode_warmup.py), admission into slots, the
batched frame loop, leaving, failure isolation.

Each resident mode has a `ModeScheduler` with its own runner (slots, KV cache, graphs) and its own thread,
so a slow mode never sets the frame pace of a fast one. Every scheduler launches onto the engine's one
step stream (graphs that share a pool must never run at the same time), and hands each frame's codes
to the shared audio stage, which emits audio and completes requests. A scheduler warms in its own thread;
eager's serves from the start and takes its warm steps (and the engine's GPU set-up chores) between
requests, when the engine's WarmupCoordinator says it gives way. Knows nothing about Gradio.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from omni_tts.engine.audio_stage import AudioStage
from omni_tts.engine.metrics import EngineStats, now, phase
from omni_tts.engine.mode_warmup import ModeWarmup
from omni_tts.engine.model_runner import Runner
from omni_tts.engine.request import SHUT_DOWN, Request
from omni_tts.engine.warmup import WarmupCoordinator
from omni_tts.errors import DeadlineExceeded, EngineError, OmniTTSError, Overloaded, as_engine_error
from omni_tts.models.qwen3_tts import Prepared


class ModeScheduler(ModeWarmup):
    """Serves the requests of one mode with one runner on one thread."""

    def __init__(self, runner: Runner, config: Any, audio: AudioStage, stats: EngineStats,
                 step_stream: Callable[[], Any], make_decoder: Callable[[Prepared], Any],
                 warmup: WarmupCoordinator | None = None) -> None:
        """warmup: the engine's turn-taking rules, shared by its schedulers (default: this one's own)."""
        self.runner, self.config, self.audio, self.stats = runner, config, audio, stats
        self.mode = runner.mode
        self._step_stream, self._make_decoder = step_stream, make_decoder
        self.waiting: queue.Queue[Request] = queue.Queue()
        self._arriving = 0  # submits to this scheduler still preparing their prompts (`arriving`)
        self._arriving_lock = threading.Lock()
        self.admit_hold_s = config.admit_hold_ms / 1000
        self.active: list[Request] = []  # index == slot (kept compact: slots 0..n-1)
        self._admitting = 0  # taken from `waiting` for slots, not yet in `active` (their slots are not free)
        # one frame of lookahead: the step launched last and the requests in its rows
        self._pending: tuple[Any, list[Request]] | None = None
        self.state = "queued"  # queued -> warming -> ready | failed
        self.serving = False  # requests run now (ready, or warming on a path that needs no warm-up)
        self.warm_progress = (0, 0)  # warm steps done, of how many (capture sets and compiles)
        self.error = ""
        self.ready = threading.Event()
        self.warm_report: dict[str, Any] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._warm_now = threading.Event()
        self.warmup = warmup or WarmupCoordinator()
        self.turn = self.warmup.turn(serving=lambda: self.serving and not self._stop.is_set(),
                                     active=lambda: bool(self.active), waiting=lambda: not self.waiting.empty())
        self._chores: queue.Queue[tuple[Callable[[], Any], Future]] = queue.Queue()
        self._say: Callable[[str], None] = lambda s: None
        self._thread = threading.Thread(target=self._loop, name=f"omni-tts-{self.mode.value}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ engine side
    def put(self, request: Request) -> None:
        with self._arriving_lock:  # concurrent submits see each other's requests in the bound
            self.check_room()
            self.waiting.put(request)
        self._wake.set()
        self.warmup.poke()  # a request waiting for a mode that does not serve yet lets its warm-up go ahead

    def check_room(self) -> None:
        """Overloaded when the requests waiting here fill this mode's free slots and its waiting bound
        (EngineConfig.max_waiting): a refusal costs nothing, a longer queue delays everyone in it."""
        bound = self.config.waiting_bound()
        if bound is None:
            return
        waiting = self.waiting.qsize()
        if waiting >= bound + max(self.runner.S - len(self.active) - self._admitting, 0):
            raise Overloaded(f"mode {self.mode.value} is busy: {waiting} requests are waiting for a slot (at most "
                             f"{bound}); try again shortly")

    @contextmanager
    def arriving(self) -> Iterator[None]:
        """Around a submit's prompt preparation and `put`: while any is under way, admission may hold
        the requests already waiting for a moment (`_holds`)."""
        with self._arriving_lock:
            self._arriving += 1
        try:
            yield
        finally:
            with self._arriving_lock:
                self._arriving -= 1
            self._wake.set()

    def between_frames(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` in this scheduler's thread between two of its frames (none in flight, the audio stage
        drained) and return its result; its exception is raised here. For set-up work that must not
        overlap a frame or a decode (a codec change, a capture) while the scheduler serves; a serving scheduler
        takes it on its turn, as a warm step (`turn.due`), so it never pauses a request just begun."""
        fut: Future = Future()
        self._chores.put((fn, fut))
        self._wake.set()
        while True:
            try:
                return fut.result(timeout=0.5)
            except TimeoutError:
                if not self._thread.is_alive():
                    raise EngineError("the engine shut down") from None

    def _run_chores(self) -> None:
        while not self._chores.empty():
            fn, fut = self._chores.get()
            try:
                self._quiesce()
                fut.set_result(fn())
            except Exception as e:
                fut.set_exception(e)
        self.turn.gave_way()

    def _quiesce(self) -> None:
        """Nothing of this scheduler in flight and no audio decoding: before a warm step or a chore."""
        with self._step_stream():
            self._guard(self._settle)  # a frame's failure is its requests', not the warm-up's
        self.audio.drain()

    def stop(self, timeout: float = 30) -> None:
        self._stop.set()
        self.warmup.poke()
        self._warm_now.set()
        self.ready.set()
        self._wake.set()
        self._thread.join(timeout=timeout)

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        steps: list[Callable[[], None]] | None = None  # None: not warmed yet
        while not self._stop.is_set():
            self._sweep_waiting()
            if not self._chores.empty() and (not self.serving or self.turn.due()):
                self._run_chores()
            if steps is None and self._warm_now.is_set():  # the engine's turn for this mode
                steps = self._warm()
                self.turn.gave_way()
            if steps is None and not self.serving:  # requests wait for the warm-up
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            if steps and self.turn.due():
                steps = self._warm_step(steps)
                continue
            if self.state == "failed":
                self._refuse_waiting(EngineError(f"mode {self.mode.value} is unavailable: {self.error}"))
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            with self._step_stream():
                self._iterate()
        self._pending = None
        for a in self.active:
            a.handle.cancel(SHUT_DOWN)
            self._finish(a, "cancelled", EngineError("the engine shut down"))
        self._refuse_waiting(EngineError("the engine shut down"), cancel_reason=SHUT_DOWN)
        while not self._chores.empty():
            self._chores.get()[1].set_exception(EngineError("the engine shut down"))

    def _refuse_waiting(self, err: OmniTTSError, cancel_reason: str = "") -> None:
        """End every waiting request with `err`: an error, or with `cancel_reason` a cancel for that reason."""
        while not self.waiting.empty():
            handle = self.waiting.get().handle
            if cancel_reason:
                handle.cancel(cancel_reason)
            handle.fail_unstarted("cancelled" if cancel_reason else "error", err)

    def _sweep_waiting(self) -> None:
        """Requests that leave the queue without a slot: cancelled by their caller (a client gone frees its
        place at once), or past their deadline."""
        if self.waiting.empty():
            return
        deadline, t = self.config.deadline_s(), now()
        with self.waiting.mutex:  # submits append under it; only this thread takes requests out
            gone = [r for r in self.waiting.queue if r.handle.cancel_requested.is_set()
                    or (deadline and t - r.handle.metrics.accepted_at > deadline)]
            for r in gone:
                self.waiting.queue.remove(r)
        for r in gone:
            if r.handle.cancel_requested.is_set():
                r.handle.fail_unstarted("cancelled")
            else:
                r.handle.fail_unstarted("error", self._expired(r))

    def _expired(self, r: Request) -> DeadlineExceeded:
        return DeadlineExceeded(f"request {r.handle.id} ran past the server's {self.config.deadline_s():g} s "
                                f"deadline (request_timeout_s) and was ended")

    def _iterate(self) -> None:
        """One pass: admissions, then one frame (or a short idle wait)."""
        held = self._holds()
        if not held:
            try:
                self._admit()
            finally:
                self._admitting = 0
        if not self.active:
            self._guard(self._settle)
            self._wake.wait(0.001 if held else 0.05)
            self._wake.clear()
            return
        self.turn.mark_busy()
        self._guard(self._step)

    def _guard(self, fn: Callable[[], None]) -> None:
        """Run a step-loop action; a device error fails the active requests and the loop keeps serving."""
        try:
            fn()
        except Exception as e:
            self._fail_active(as_engine_error(e, "generation failed"))

    def _fail_active(self, err: OmniTTSError) -> None:
        """Every active request ends with `err`; the frame in flight is dropped."""
        self._pending = None
        for a in list(self.active):
            self._finish(a, "error", err)
        self.active.clear()

    def _holds(self) -> bool:
        """Leave the waiting requests for this pass: more of their burst are still preparing (clients that
        send their next request as the last one ends arrive together), there is room for them, and the
        oldest has waited less than `admit_hold_s`. Admitted together they share one prefill pass and
        stay in step, so their chunks are decoded in shared batches."""
        if not self.admit_hold_s or not self._arriving or self.waiting.empty():
            return False
        if len(self.active) + self.waiting.qsize() >= self.runner.S:
            return False
        try:
            oldest = self.waiting.queue[0].handle.metrics.accepted_at
        except IndexError:  # taken meanwhile
            return False
        return now() - oldest < self.admit_hold_s

    def _admit(self) -> None:
        """Take waiting requests into free slots; their prompts are prefilled together (one talker pass
        for up to 8). A batch that fails is retried one request at a time, so only the bad one fails."""
        if not self.waiting.empty() and len(self.active) < self.runner.S:
            with phase("admit"):
                self._admit_waiting()

    def _admit_waiting(self) -> None:
        batch: list[Request] = []
        while len(self.active) + len(batch) < self.runner.S and not self.waiting.empty():
            self._admitting = len(batch) + 1  # before the queue shrinks: `check_room` never sees the slot free
            r = self.waiting.get()
            if r.handle.cancel_requested.is_set():
                r.handle.fail_unstarted("cancelled")
                continue
            r.handle.metrics.started_at = now()
            try:  # a failure here is this request's, never the loop's
                r.decoder = self._make_decoder(r.prep)
            except Exception as e:
                r.handle.fail_unstarted("error", as_engine_error(e, "could not start the request"))
                continue
            batch.append(r)
        if not batch:
            return
        self.runner.after_default_stream()  # prompts were embedded on the submitting threads
        try:
            self._prefill(batch)
        except Exception:
            for r in batch:  # one at a time: only a request that fails alone fails
                try:
                    self._prefill([r])
                except Exception as e:
                    r.handle.fail_unstarted("error", as_engine_error(e, "could not start the request"))

    def _prefill(self, batch: list[Request]) -> None:
        first = len(self.active)
        self.runner.prefill_batch(first, [r.prep for r in batch])
        self.active.extend(batch)

    def _step(self) -> None:
        """Launch the next frame of every active request, then take in the frame launched before it."""
        with phase("launch"):
            ticket = self.runner.launch(len(self.active))
        done, self._pending = self._pending, (ticket, list(self.active))
        if done is not None:
            self._take(*done)

    def _settle(self) -> None:
        """Take in the frame still in flight, if any (when the loop idles)."""
        done, self._pending = self._pending, None
        if done is not None:
            self._take(*done)

    def _take(self, ticket: Any, rows: list[Request]) -> None:
        """A launched frame's results: its codes to each request as soon as the CodePredictor made them (the
        audio stage starts on them while the talker half still runs), then, once code 0 of the next frame
        is known, finished requests out of their slots (rows[i] held slot i at launch). A request that left
        after the launch ignores its row."""
        with phase("take"):
            self._take_rows(ticket, rows)

    def _take_rows(self, ticket: Any, rows: list[Request]) -> None:
        with phase("sync"):  # a GPU gap inside a wait: the frame was done, this thread not yet running
            codes = self.runner.collect_codes(ticket)  # [n, 16] int64: the frame just completed
        live = [(i, a) for i, a in enumerate(rows) if not a.left]
        self.stats.on_step(len(live))
        t = now()
        for i, a in live:
            a.codes.append(codes[i])
            if len(a.codes) == 1:
                a.handle.metrics.first_codes_at = t
        self.audio.put([("push", a, codes[i:i + 1]) for i, a in live])  # decoded as one batch
        with phase("sync"):
            eos = self.runner.collect_eos(ticket)  # [n] bool: the next frame's code 0 is EOS
        jobs: list[tuple] = []
        deadline = self.config.deadline_s()
        for i, a in live:
            if a.handle.cancel_requested.is_set():
                jobs.append(("finish", a, "cancelled", None))
                self._leave(a)
            elif deadline and t - a.handle.metrics.accepted_at > deadline:
                jobs.append(("finish", a, "error", self._expired(a)))
                self._leave(a)
            elif len(a.codes) >= a.prep.max_frames or (eos[i] and not a.prep.fixed):
                jobs += [("flush", a), ("finish", a, "done", None)]
                self._leave(a)
        self.audio.put(jobs)

    def _leave(self, a: Request) -> None:
        """Free a's slot: the last active request moves into it (slots stay 0..n-1)."""
        a.left = True
        i, last = next(j for j, x in enumerate(self.active) if x is a), len(self.active) - 1
        if i != last:
            self.runner.move_slot(last, i)
            self.active[i] = self.active[last]
        self.active.pop()

    def _finish(self, a: Request, status: str, error: OmniTTSError | None = None) -> None:
        """The request leaves its slot; it completes after its audio is decoded."""
        a.left = True
        self.audio.put([("finish", a, status, error)])
