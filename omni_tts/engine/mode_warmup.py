"""The warm-up half of a mode's scheduler (`ModeScheduler` is a `ModeWarmup`): compile and capture in the
scheduler's own thread, in steps that take turns with the engine's other serving schedulers
(WarmupCoordinator), serving first where the runner can (eager), and failing only this mode's requests
when it cannot warm. Uses the scheduler's runner, turn, step stream and frame loop (`_quiesce`,
`_fail_active`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from omni_tts.errors import EngineError, one_line


class ModeWarmup:
    """Warm-up steps of a ModeScheduler, on its attributes (runner, turn, warmup, state, events)."""

    def warm(self, say: Callable[[str], None]) -> None:
        """Compile and capture in this scheduler's own thread, and return when that is done (called by the
        engine's warm-up thread, one mode at a time). Dynamo's settings and Inductor's graph trees are
        per thread: what the thread that serves the mode records is what its requests replay. A scheduler
        whose runner serves while warming (eager) serves from now on and warms between requests."""
        self._say = say
        self._warm_now.set()
        self._wake.set()
        self.ready.wait()

    def serve_early(self) -> bool:
        """Start serving before this scheduler's warm-up (a runner that serves while warming: eager's);
        -> whether it does. Its warm steps wait for `warm`."""
        if not self.runner.serves_while_warming or self._stop.is_set():
            return False
        self.state, self.serving = "warming", True
        self.turn.start_serving()
        self._wake.set()
        return True

    def _warm(self) -> list[Callable[[], None]]:
        """Warm this scheduler; -> the warm steps still to run between requests (a scheduler that serves while it
        warms), else [] once warm or failed."""
        self.state, self._warm_t0 = "warming", time.perf_counter()
        try:
            self._take_turn()
            if self.runner.impls.compiles(self.mode):  # here, not at thread start: serving eager needs no Dynamo
                self.runner.impls.compile_settings()
            with self._step_stream():
                steps = self.runner.warm_steps(self._say)
                self.warm_progress = (0, len(steps))
                for _ in range(self.runner.steps_before_serving(len(steps))):
                    self._take_turn()
                    self._advance(steps)
        except Exception as e:  # a mode that cannot warm fails its requests, never the engine
            return self._warm_failed(e)
        starts = bool(steps) and not self.serving  # serves from now, before the rest of its warm-up
        self.serving = True
        if starts:
            self._say(f"{self.mode.value} serves after {time.perf_counter() - self._warm_t0:.1f} s; "
                      f"{len(steps)} more warm steps run between requests")
            self.turn.start_serving()  # its next warm step waits for the idle grace: a request may be waiting
        if not steps:
            self._warmed()
        return steps

    def _warm_step(self, steps: list[Callable[[], None]]) -> list[Callable[[], None]]:
        """Run the next warm step between two frames (nothing of this scheduler in flight)."""
        try:
            self._quiesce()
            with self._step_stream():
                self._advance(steps)
        except Exception as e:
            return self._warm_failed(e)
        self.turn.gave_way()
        if not steps:
            self._warmed()
        return steps

    def _take_turn(self) -> None:
        """Wait for the other serving schedulers to give way; a shutdown meanwhile ends the warm-up."""
        self.warmup.give_way(self.turn)
        if self._stop.is_set():
            raise EngineError("the engine shut down")

    def _advance(self, steps: list[Callable[[], None]]) -> None:
        """Run the first warm step and count it."""
        steps.pop(0)()
        self.warm_progress = (self.warm_progress[0] + 1, self.warm_progress[1])

    def _warmed(self) -> None:
        with self._step_stream():
            self.warm_report = self.runner.warmed(time.perf_counter() - self._warm_t0, self._say)
        self.state = "ready"
        self.ready.set()
        self._wake.set()
        self.warmup.poke()

    def _warm_failed(self, e: Exception) -> list[Callable[[], None]]:
        self.state, self.error, self.serving = "failed", one_line(e), False
        self.warmup.poke()
        if not (self._stop.is_set() or self.warmup.closed):  # cut short by a shutdown: not a failure to report
            self._say(f"{self.mode.value} failed to warm: {self.error}")
        self._fail_active(EngineError(f"mode {self.mode.value} is unavailable: {self.error}"))
        self.ready.set()
        self._wake.set()
        return []
