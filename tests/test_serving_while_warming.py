"""A scheduler that serves while it warms (on CUDA: the reference talker until its graphs are captured),
on the tiny custom_voice checkpoint (CPU, float32, the real eager runner with its warm steps gated by the
test, since a CPU cannot capture graphs): warm steps and set-up chores run only between requests or
between frames, a compiled scheduler's first steps come before it serves, warm-up work elsewhere gives
way to a request in progress, and a shutdown while a mode waits for its turn starts no compile.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from test_modes import TIMEOUT, config, greedy, lone_scheduler, queue_request, same, sampled
from test_warmup import manual_coordinator, until

from omni_tts.config import EngineConfig, SynthesisParams
from omni_tts.engine import offline
from omni_tts.engine.audio_stage import AudioStage
from omni_tts.engine.engine import Engine
from omni_tts.engine.metrics import now
from omni_tts.engine.mode_scheduler import ModeScheduler
from omni_tts.engine.model_runner import Runner
from omni_tts.engine.request import RequestHandle
from omni_tts.engine.warmup import WarmupCoordinator
from omni_tts.errors import EngineError


class _GatedWarmRunner(Runner):
    """The real eager runner, but a scheduler that serves while it warms (on CUDA: the reference talker until
    its graphs are captured) and whose two warm steps wait for the test (a CPU cannot capture graphs)."""

    serves_while_warming = True

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.entered = [threading.Event(), threading.Event()]
        self.gates = [threading.Event(), threading.Event()]
        self.step_threads: list[str] = []

    def warm_steps(self, say=None):
        def step(i: int) -> None:
            self.step_threads.append(threading.current_thread().name)
            self.entered[i].set()
            assert self.gates[i].wait(TIMEOUT)
        return [lambda: step(0), lambda: step(1)]


@contextmanager
def gated_scheduler(cfg: EngineConfig, warmup: WarmupCoordinator | None = None
               ) -> Iterator[tuple[Any, ModeScheduler, _GatedWarmRunner, AudioStage]]:
    """A lone eager scheduler on a _GatedWarmRunner: (model, scheduler, runner, audio stage); on exit its gates
    open, so no warm step is left waiting, and the scheduler and its audio stage stop."""
    model, sched, audio = lone_scheduler(cfg, _GatedWarmRunner, warmup)
    try:
        yield model, sched, sched.runner, audio
    finally:
        for g in sched.runner.gates:
            g.set()
        sched.stop()
        audio.stop()


def test_a_scheduler_that_serves_while_it_warms_takes_warm_steps_only_between_requests(_one_thread):
    """A request waiting when the warm-up starts is served before any warm step; the next step runs once
    the scheduler is idle; a request arriving during a step waits for that step only and is served before
    the step after it. Each gets its solo output; the scheduler is ready after the last step."""
    with gated_scheduler(config(max_num_seqs=2)) as (model, sched, runner, _):
        ids = itertools.count(1)

        def submit(p: SynthesisParams) -> RequestHandle:
            return queue_request(sched, model, next(ids), p)

        first, second = greedy("served before any warm step", fixed_frames=5), sampled("mid-step", 7, fixed_frames=4)
        h1 = submit(first)
        warmer = threading.Thread(target=sched.warm, args=(lambda s: None,), daemon=True)
        warmer.start()
        same(h1.result(TIMEOUT), offline.synthesize(model, first))
        assert runner.entered[0].wait(TIMEOUT)  # idle: the first step
        assert sched.state == "warming" and sched.serving and not sched.ready.is_set()
        assert sched.warm_progress == (0, 2)
        h2 = submit(second)
        # the scheduler's thread is inside the first step (held by its gate): the request waits for it
        assert not h2.done and not runner.entered[1].is_set()
        opened = now()
        runner.gates[0].set()
        same(h2.result(TIMEOUT), offline.synthesize(model, second))
        # its wait for the step is its queued time, which the UI and the API's usage show
        assert 1000 * (opened - h2.metrics.accepted_at) <= h2.metrics.queue_ms <= h2.metrics.ttfp_ms
        assert runner.entered[1].wait(TIMEOUT) and not sched.ready.is_set() and sched.warm_progress == (1, 2)
        runner.gates[1].set()
        warmer.join(TIMEOUT)
        assert sched.warm_progress == (2, 2)
        assert sched.state == "ready" and sched.ready.is_set() and not runner.reference_talker
        assert runner.step_threads == ["omni-tts-eager"] * 2  # in the scheduler's own thread


def test_a_request_sent_as_the_last_one_ends_starts_before_the_next_warm_step(_one_thread):
    """A visitor's next request, sent as soon as their last one ended, is served before the scheduler takes
    its next warm step (which waits until the scheduler has been idle for the idle grace)."""
    warmup, clock = manual_coordinator(idle_s=1.0, busy_s=120.0)
    with gated_scheduler(config(max_num_seqs=1), warmup) as (model, sched, runner, _):
        first, second = greedy("the first one", fixed_frames=4), sampled("sent as the first ends", 3, fixed_frames=4)
        h1 = queue_request(sched, model, 1, first)
        threading.Thread(target=sched.warm, args=(lambda s: None,), daemon=True).start()
        h1.result(TIMEOUT)
        h2 = queue_request(sched, model, 2, second)
        same(h2.result(TIMEOUT), offline.synthesize(model, second))  # no warm step in its way
        assert not runner.entered[0].is_set() and sched.warm_progress == (0, 2)
        clock.advance(1.0)  # idle for the grace
        assert runner.entered[0].wait(TIMEOUT)  # then, idle, the step


def test_a_scheduler_busy_for_long_takes_its_next_warm_step_between_two_frames(_one_thread):
    """Under steady traffic the warm-up still ends: after its busy allowance (the clock moved by hand), the next step
    runs between two frames of an active request, which then goes on to its solo output."""
    warmup, clock = manual_coordinator(idle_s=1.0, busy_s=10.0)
    with gated_scheduler(config(max_num_seqs=1, max_seq_len=512), warmup) as (model, sched, runner, _):
        warmer = threading.Thread(target=sched.warm, args=(lambda s: None,), daemon=True)
        warmer.start()
        until(lambda: sched.serving, "the scheduler to serve")
        clock.advance(1.0)
        assert runner.entered[0].wait(TIMEOUT)  # idle: the first step
        p = sampled("a long request across a warm step", 11, fixed_frames=120)
        h = queue_request(sched, model, 1, p)
        runner.gates[0].set()
        until(lambda: sched.active and sched.active[0].codes, "the request's first frame")
        assert not runner.entered[1].is_set()  # within its busy allowance
        clock.advance(10.5)
        assert runner.entered[1].wait(TIMEOUT)
        assert sched.active and not h.done and 0 < len(sched.active[0].codes) < 120  # between two of its frames
        runner.gates[1].set()
        same(h.result(TIMEOUT), offline.synthesize(model, p))
        assert sched.ready.wait(TIMEOUT) and sched.state == "ready"


def test_a_scheduler_serving_early_runs_set_up_chores_between_its_frames(_one_thread):
    """Before its warm-up is asked for, a scheduler that serves while warming serves at once (the engine's GPU
    set-up runs meanwhile) and takes no warm step; a chore handed to it while busy for long runs in its
    thread between two frames of an active request (none in flight, audio drained), its result or
    exception comes back to the caller, and the request still gets its solo output. After stop, a
    chore fails instead of hanging."""
    warmup, clock = manual_coordinator(idle_s=1.0, busy_s=10.0)
    with gated_scheduler(config(max_num_seqs=1, max_seq_len=512), warmup) as (model, sched, runner, audio):
        assert sched.serve_early() and sched.state == "warming" and sched.serving
        p = sampled("served before the warm-up, across a chore", 5, fixed_frames=100)
        h = queue_request(sched, model, 1, p)
        until(lambda: sched.active and sched.active[0].codes, "the request served before the warm-up")
        clock.advance(10.5)  # busy for longer than its allowance

        def chore() -> tuple[str, int, bool, bool]:
            return (threading.current_thread().name, len(sched.active[0].codes), sched._pending is None,
                    audio._jobs.empty())

        name, frames, settled, drained = sched.between_frames(chore)
        assert name == "omni-tts-eager" and 0 < frames < 100 and settled and drained
        clock.advance(10.5)  # the next turn: after another allowance (or the idle grace, if it ended)
        with pytest.raises(ZeroDivisionError):
            sched.between_frames(lambda: 1 / 0)
        same(h.result(TIMEOUT), offline.synthesize(model, p))
        assert not runner.entered[0].is_set() and not sched.ready.is_set()  # no warm step before `warm`
    with pytest.raises(EngineError, match="shut down"):
        sched.between_frames(lambda: None)


def test_a_set_up_chore_waits_for_the_request_in_progress(_one_thread):
    """A chore handed to a serving scheduler as a visitor's request starts (the engine's codec set-up at
    start-up) runs once that request has ended and the scheduler has been idle for the grace, not in the
    middle of it."""
    warmup, clock = manual_coordinator(idle_s=1.0, busy_s=120.0)
    with gated_scheduler(config(max_num_seqs=1, max_seq_len=512), warmup) as (model, sched, runner, _):
        assert sched.serve_early()
        p = greedy("a first request at start-up", fixed_frames=40)
        h = queue_request(sched, model, 1, p)
        until(lambda: sched.active and sched.active[0].codes, "the request to be served")
        seen: list = []
        chore = threading.Thread(target=lambda: seen.append(
            sched.between_frames(lambda: (h.done, len(sched.active), clock()))), daemon=True)
        chore.start()
        same(h.result(TIMEOUT), offline.synthesize(model, p))
        ended = clock()
        assert not seen  # the clock has not moved: no idle grace has passed
        clock.advance(1.0)
        chore.join(TIMEOUT)
        assert seen and seen[0][:2] == (True, 0) and seen[0][2] >= ended + 1.0  # after the idle grace


def test_warm_up_work_elsewhere_gives_way_to_the_request_in_progress(_one_thread):
    """Work that gives way to a serving scheduler (the engine's GPU set-up, another scheduler's compiles, run in
    their own threads) waits while the scheduler's request runs and starts once the scheduler has been idle for
    the grace; the request gets its solo output."""
    warmup, clock = manual_coordinator(idle_s=1.0, busy_s=120.0)
    with gated_scheduler(config(max_num_seqs=1, max_seq_len=512), warmup) as (model, sched, runner, _):
        assert sched.serve_early()
        p = sampled("a request that the set-up waits for", 3, fixed_frames=40)
        h = queue_request(sched, model, 1, p)
        turn: list[tuple[bool, float]] = []
        other = threading.Thread(target=lambda: (warmup.give_way(), turn.append((h.done, clock()))))
        other.start()
        until(lambda: warmup.waiters == 1, "the other thread to wait for its turn")
        same(h.result(TIMEOUT), offline.synthesize(model, p))
        assert not turn  # the clock has not moved: no idle grace has passed
        clock.advance(1.0)
        other.join(TIMEOUT)
        assert turn == [(True, 1.0)], "the other thread's work went ahead of the request"


class _GatedCompiledRunner(_GatedWarmRunner):
    """As _GatedWarmRunner, but its scheduler serves only once warm, as a compiled mode's does."""

    serves_while_warming = False


class _GatedFirstStepRunner(_GatedCompiledRunner):
    """As _GatedCompiledRunner, but its scheduler serves after the first of its two warm steps (a compiled mode's
    top-k variant), and takes the second between requests."""

    def warm_steps(self, say=None):
        steps = super().warm_steps(say)
        self.first_steps = 1
        return steps


def test_a_compiled_scheduler_serves_after_its_first_warm_steps_and_takes_the_rest_between_requests(_one_thread):
    """A request queued before the warm-up waits for the first step only, is served with its solo output while
    the mode still warms (not ready), and the second step runs once the scheduler has been idle for the grace."""
    warmup, clock = manual_coordinator(idle_s=1.0, busy_s=120.0)
    model, sched, audio = lone_scheduler(config(max_num_seqs=1), _GatedFirstStepRunner, warmup)
    runner = sched.runner
    try:
        p = sampled("waits for the first step only", 6, fixed_frames=5)
        h = queue_request(sched, model, 1, p)
        warmer = threading.Thread(target=sched.warm, args=(lambda s: None,), daemon=True)
        warmer.start()
        assert runner.entered[0].wait(TIMEOUT)
        assert not sched.serving and not h.done
        runner.gates[0].set()
        same(h.result(TIMEOUT), offline.synthesize(model, p))
        assert sched.serving and sched.state == "warming" and sched.warm_progress == (1, 2)
        assert not runner.entered[1].is_set() and not sched.ready.is_set()  # no idle grace has passed
        clock.advance(1.0)
        assert runner.entered[1].wait(TIMEOUT)
        runner.gates[1].set()
        warmer.join(TIMEOUT)
        assert sched.state == "ready" and sched.warm_progress == (2, 2)
    finally:
        for g in runner.gates:
            g.set()
        sched.stop()
        audio.stop()


@contextmanager
def serving_and_warming() -> Iterator[tuple[Any, ModeScheduler, ModeScheduler, _GatedCompiledRunner, Any]]:
    """An eager scheduler serving early beside a gated scheduler that serves only once warm (a compiled mode's),
    sharing one WarmupCoordinator on a hand-moved clock (a 1 s idle grace, no busy allowance in reach):
    (model, serving scheduler, warming scheduler, its runner, the clock)."""
    warmup, clock = manual_coordinator(idle_s=1.0, busy_s=120.0)
    with gated_scheduler(config(max_num_seqs=1, max_seq_len=512), warmup) as (model, serving, _, _):
        _, warming, audio = lone_scheduler(config(max_num_seqs=1), _GatedCompiledRunner, warmup)
        try:
            assert serving.serve_early()
            yield model, serving, warming, warming.runner, clock
        finally:
            for g in warming.runner.gates:
                g.set()
            warming.stop()
            audio.stop()


def test_a_compiled_scheduler_takes_a_warm_step_only_when_the_serving_scheduler_gives_way(_one_thread):
    """A mode warming beside a serving one (both on the engine's coordinator) takes no warm step while
    the serving scheduler's request runs, takes the first once that scheduler has been idle for the grace and the
    next at once (still idle), then serves; the request gets its solo output."""
    with serving_and_warming() as (model, serving, warming, gated, clock):
        p = sampled("a request the other mode's warm-up waits for", 5, fixed_frames=40)
        h = queue_request(serving, model, 1, p)
        until(lambda: serving.active, "the request to be served")
        warmer = threading.Thread(target=warming.warm, args=(lambda s: None,), daemon=True)
        warmer.start()
        until(lambda: warming.warmup.waiters == 1, "the warm-up to wait for its turn")
        h.result(TIMEOUT)
        assert not gated.entered[0].is_set()  # the clock has not moved: no idle grace has passed
        clock.advance(1.0)
        assert gated.entered[0].wait(TIMEOUT) and h.done
        gated.gates[0].set()
        assert gated.entered[1].wait(TIMEOUT)
        gated.gates[1].set()
        warmer.join(TIMEOUT)
        assert warming.state == "ready" and warming.serving
        same(h.result(TIMEOUT), offline.synthesize(model, p))


def test_a_warm_up_that_requests_wait_for_goes_ahead_of_a_busy_serving_scheduler(_one_thread):
    """A mode's warm step waits for a busy serving scheduler only while nobody waits for that mode: once a
    request is queued for it, its warm-up goes ahead (the coordinator's rule 2), and that request is
    then served with its solo output."""
    with serving_and_warming() as (model, serving, warming, gated, _):
        busy = queue_request(serving, model, 1, sampled("a long request on the serving scheduler", 5, fixed_frames=300))
        until(lambda: serving.active, "the long request to be served")
        threading.Thread(target=warming.warm, args=(lambda s: None,), daemon=True).start()
        until(lambda: warming.warmup.waiters == 1, "the warm-up to wait for its turn")
        assert not gated.entered[0].is_set()  # nobody waits for it: it gives way
        p = greedy("a request for the warming mode", fixed_frames=4)
        h = queue_request(warming, model, 2, p)
        assert gated.entered[0].wait(TIMEOUT) and not busy.done  # ahead of the busy scheduler's pause
        for g in gated.gates:
            g.set()
        same(h.result(TIMEOUT), offline.synthesize(model, p))
        busy.result(TIMEOUT)


def test_a_shutdown_while_a_mode_waits_for_its_warm_up_turn_starts_no_compile(_one_thread):
    """The default mode waits for eager to give way before it compiles; a shutdown meanwhile ends that
    wait without a compile (which would hold the shutdown for its whole length) and without a
    "failed to warm" report."""
    said: list[str] = []
    eng = Engine.from_config(config(modes=["eager", "default"], max_num_seqs=1), progress=said.append,
                             wait=False, warm=False)
    eng.warmup.idle_s = eng.warmup.busy_s = 3600.0  # eager never gives way by itself here
    eng.start_warming()
    until(lambda: eng.modes()["default"].state == "warming" and eng.warmup.waiters == 1,
          "the default mode to wait for its warm-up turn")
    t = time.monotonic()
    eng.shutdown()
    assert time.monotonic() - t < 30.0  # no compile held it
    assert not any("compiling" in s or "failed to warm" in s for s in said), said
