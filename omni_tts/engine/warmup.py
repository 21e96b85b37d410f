"""Warm-up turn-taking: when warm-up work may run beside the requests being served.

`WarmupCoordinator` holds the rules, one `Turn` per mode scheduler, and the clock they read:

1. A scheduler that serves gives way to warm-up work (its own warm step or set-up chore, or work in
   another thread: the engine's GPU set-up, another mode's compile) once it has been idle for
   `idle_s` (a visitor's next request, sent as the last one ends, starts first), or once `busy_s`
   have passed since it last gave way (so the warm-up ends under steady traffic too).
2. Work outside a scheduler waits until every serving scheduler gives way (`give_way`), unless
   requests wait for a mode that does not serve yet: then the warm-up is what they wait on, and it
   goes ahead at once.
3. A scheduler that does not serve (yet) holds nobody up.
4. After `close` (the engine shuts down) no wait blocks, and `give_way` raises EngineError, so no
   warm-up work starts.

Waits re-read the rules whenever a turn changes (`poke`) and at least every POLL_S; the clock is
injectable, so tests move time by hand. Knows nothing about models, graphs or what a request is
beyond "one is active" and "one is waiting".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from omni_tts.errors import EngineError

WARM_STEP_IDLE_S = 1.0
WARM_STEP_EVERY_BUSY_S = 10.0
POLL_S = 0.02  # how often a wait re-reads the rules when nothing pokes it


class Turn:
    """One scheduler's side of the rules: whether it serves, is busy, has requests waiting; when it was
    last busy and when it last gave way."""

    def __init__(self, coordinator: WarmupCoordinator, serving: Callable[[], bool], active: Callable[[], bool],
                 waiting: Callable[[], bool]) -> None:
        self._co = coordinator
        self.serving, self.active, self.waiting = serving, active, waiting
        self.last_busy = self.last_aside = coordinator.clock()

    def start_serving(self) -> None:
        """It serves from now: work that gives way to it starts after the idle grace, and its busy
        allowance counts from here."""
        self.last_busy = self.last_aside = self._co.clock()
        self._co.poke()

    def mark_busy(self) -> None:
        self.last_busy = self._co.clock()

    def due(self) -> bool:
        """Rule 1: whether this serving scheduler gives way now."""
        t = self._co.clock()
        if self.active() or self.waiting():
            self.last_busy = t
        elif t - self.last_busy >= self._co.idle_s:
            return True
        return t - self.last_aside > self._co.busy_s

    def gave_way(self) -> None:
        """Warm-up work ran beside it (its own or another's): its busy allowance starts again."""
        self.last_aside = self._co.clock()
        self._co.poke()


class WarmupCoordinator:
    """The turn-taking rules of one engine (see the module docstring)."""

    def __init__(self, idle_s: float = WARM_STEP_IDLE_S, busy_s: float = WARM_STEP_EVERY_BUSY_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.idle_s, self.busy_s, self.clock = idle_s, busy_s, clock
        self.turns: list[Turn] = []
        self.closed = False
        self.waiters = 0  # threads blocked in `give_way` now
        self._cond = threading.Condition()

    def turn(self, serving: Callable[[], bool], active: Callable[[], bool], waiting: Callable[[], bool]) -> Turn:
        """A new scheduler's turn (serving: requests run on it now; active: it has requests in slots;
        waiting: requests queue for it)."""
        t = Turn(self, serving, active, waiting)
        with self._cond:
            self.turns.append(t)
        return t

    def poke(self) -> None:
        """Re-read the rules now (a turn changed, or a test moved the clock)."""
        with self._cond:
            self._cond.notify_all()

    def awaited(self) -> bool:
        """Rule 2's exception: requests wait for a mode that does not serve yet."""
        return any(not t.serving() and t.waiting() for t in self.turns)

    def give_way(self, own: Turn | None = None) -> None:
        """Block until every serving scheduler but `own` gives way (rules 1-3); EngineError once closed."""
        for t in list(self.turns):
            if t is not own:
                self._wait_for(t)
        if self.closed:
            raise EngineError("the engine shut down")

    def _wait_for(self, t: Turn) -> None:
        with self._cond:
            self.waiters += 1
            self._cond.notify_all()
            try:
                while t.serving() and not self.closed and not t.due() and not self.awaited():
                    self._cond.wait(POLL_S)
            finally:
                self.waiters -= 1
        t.gave_way()

    def close(self) -> None:
        """Rule 4: the engine shuts down."""
        self.closed = True
        self.poke()


def warm_order(modes: list, default: object) -> list:
    """The order modes warm in: the engine's default mode first (requests use it unless they ask for
    another; eager serves meanwhile), then MODES' warm rank. A default that records graph trees keeps
    its rank, so no other mode captures while it records."""
    return sorted(modes, key=lambda m: (not (m is default and not m.spec.graph_trees), m.spec.warm_rank))
