"""The warm-up turn-taking rules (omni_tts.engine.warmup) on their own: a hand-moved clock and stand-in
turns, so each rule is checked by moving time and state, never by sleeping. Also the helpers the
scheduler tests share: `ManualClock` and `until`."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from omni_tts.config import CompileMode
from omni_tts.engine.warmup import WarmupCoordinator, warm_order
from omni_tts.errors import EngineError

TIMEOUT = 60.0


class ManualClock:
    """A clock that moves only when a test says so; each move pokes the coordinator that reads it."""

    def __init__(self) -> None:
        self.t = 0.0
        self.coordinator: WarmupCoordinator | None = None

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds
        if self.coordinator is not None:
            self.coordinator.poke()


def manual_coordinator(idle_s: float = 1.0, busy_s: float = 10.0) -> tuple[WarmupCoordinator, ManualClock]:
    clock = ManualClock()
    clock.coordinator = WarmupCoordinator(idle_s, busy_s, clock)
    return clock.coordinator, clock


def until(condition: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    """Wait for `condition` (re-read every few ms) at most `timeout` s; fail naming `what` otherwise."""
    tick = threading.Event()
    for _ in range(int(timeout / 0.005)):
        if condition():
            return
        tick.wait(0.005)
    raise AssertionError(f"timed out waiting for {what}")


class Scheduler:
    """A stand-in scheduler's state as its turn reads it."""

    def __init__(self, co: WarmupCoordinator, serving: bool = True) -> None:
        self.serving, self.active, self.waiting = serving, False, False
        self.turn = co.turn(lambda: self.serving, lambda: self.active, lambda: self.waiting)


def _give_way_in_thread(co: WarmupCoordinator, own=None) -> tuple[threading.Thread, list]:
    done: list = []

    def run() -> None:
        try:
            co.give_way(own)
            done.append("went")
        except EngineError as e:
            done.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    until(lambda: co.waiters == 1 or done, "the wait to start")
    return t, done


def test_work_elsewhere_waits_for_an_idle_grace_after_the_last_request():
    co, clock = manual_coordinator(idle_s=1.0, busy_s=10.0)
    s = Scheduler(co)
    s.active = True
    t, done = _give_way_in_thread(co)
    clock.advance(5.0)  # busy: no idle grace runs while a request is in a slot
    assert co.waiters == 1 and not done
    s.active = False
    s.turn.mark_busy()  # its last frame ended now (the scheduler marks every frame)
    clock.advance(0.5)
    assert co.waiters == 1 and not done  # idle, but not for long enough
    clock.advance(0.5)
    t.join(TIMEOUT)
    assert done == ["went"] and s.turn.last_aside == clock.t


def test_a_busy_scheduler_still_gives_way_once_its_busy_allowance_runs_out():
    co, clock = manual_coordinator(idle_s=1.0, busy_s=10.0)
    s = Scheduler(co)
    s.waiting = True  # requests queued count as busy too
    t, done = _give_way_in_thread(co)
    clock.advance(10.0)
    assert not done  # the allowance is exceeded, not reached
    clock.advance(0.1)
    t.join(TIMEOUT)
    assert done == ["went"]
    assert not s.turn.due()  # it gave way just now: its allowance starts again


def test_requests_waiting_for_a_mode_that_does_not_serve_let_its_warm_up_go_ahead():
    co, clock = manual_coordinator()
    busy, cold = Scheduler(co), Scheduler(co, serving=False)
    busy.active = True
    t, done = _give_way_in_thread(co, own=cold.turn)
    assert not done
    cold.waiting = True
    co.poke()  # what a put does
    t.join(TIMEOUT)
    assert done == ["went"] and clock.t == 0.0


def test_a_scheduler_that_does_not_serve_holds_nobody_up_and_its_own_turn_is_skipped():
    co, _ = manual_coordinator()
    Scheduler(co, serving=False).active = True
    own = Scheduler(co)
    own.active = True
    co.give_way(own.turn)  # returns at once: the other does not serve, its own turn is not waited on


def test_close_ends_every_wait_and_refuses_later_work():
    co, _ = manual_coordinator()
    Scheduler(co).active = True
    t, done = _give_way_in_thread(co)
    co.close()
    t.join(TIMEOUT)
    assert len(done) == 1 and isinstance(done[0], EngineError)
    with pytest.raises(EngineError, match="shut down"):
        co.give_way()


def test_the_default_mode_warms_first_then_the_tables_order():
    modes = list(CompileMode)
    assert warm_order(modes, CompileMode.DEFAULT_CUDAGRAPH) == [
        CompileMode.DEFAULT_CUDAGRAPH, CompileMode.EAGER, CompileMode.DEFAULT, CompileMode.REDUCE_OVERHEAD]
    assert warm_order(modes, CompileMode.DEFAULT) == [
        CompileMode.DEFAULT, CompileMode.EAGER, CompileMode.DEFAULT_CUDAGRAPH, CompileMode.REDUCE_OVERHEAD]
    # graph trees record last whatever the default: no other mode captures while they record
    assert warm_order(modes, CompileMode.REDUCE_OVERHEAD)[-1] is CompileMode.REDUCE_OVERHEAD
