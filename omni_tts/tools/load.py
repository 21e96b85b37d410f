"""The benchmark's prompts and its closed-loop load generator, shared by bench, peers and the other tools.

Owns the prompt list, `make_params` (one prompt as a request) and `run_load` (c clients, each sending
its next request when the last one finished). Uses only the Engine's public API.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from omni_tts import RequestMetrics
from omni_tts.config import SynthesisParams

PROMPTS = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Please remember to bring your umbrella, it might rain this afternoon.",
    "Our new store opens next Monday at nine in the morning.",
    "I have never seen such a beautiful sunset over the mountains.",
    "The meeting has been moved to Thursday, so we have more time to prepare.",
    "Could you tell me the way to the nearest train station?",
    "She finished reading the book in a single evening.",
    "Thank you for calling, all of our agents are currently busy.",
    "The museum is free to visit on the first Sunday of every month.",
    "He plays the piano every night before going to bed.",
    "Turn left at the second traffic light and the hotel is on your right.",
    "Fresh bread and coffee make the best breakfast in the world.",
]

def make_params(i: int, speaker: str | None, fixed_frames: int | None, seed: int = 1234,
                task: str = "custom_voice", instruct: str | None = None, mode: str | None = None) -> SynthesisParams:
    return SynthesisParams(text=PROMPTS[i % len(PROMPTS)], task=task, speaker=speaker, language="English",
                           instruct=instruct, seed=seed + i, fixed_frames=fixed_frames, mode=mode)


def request_maker(engine: Any, fixed_frames: int | None, speaker: str | None = None
                  ) -> Callable[[int, str | None], SynthesisParams]:
    """(i, mode) -> prompt i as a request in the checkpoint's plain voice (`speaker` if given). A Base
    checkpoint has none: its requests ask for a neutral designed voice and are refused saying why."""
    from omni_tts.models.qwen3_tts import NEUTRAL_INSTRUCT

    voice = engine.plain_voice() or {"task": "voice_design", "speaker": None, "instruct": NEUTRAL_INSTRUCT}
    return lambda i, mode: make_params(i, speaker or voice["speaker"], fixed_frames, task=voice["task"],
                                       instruct=voice["instruct"], mode=mode)


def closed_loop(concurrency: int, num_prompts: int, work: Callable[[int], Any]) -> tuple[list[Any], float]:
    """`concurrency` clients share prompts 0..num_prompts-1, each sending its next when its last one is
    done; work(i) -> a record, or raises (recorded, the run goes on). -> (records, wall seconds); the
    first error is raised when nothing succeeded."""
    lock, nxt = threading.Lock(), iter(range(num_prompts))
    records: list[Any] = []
    errors: list[BaseException] = []

    def client() -> None:
        while True:
            with lock:
                i = next(nxt, None)
            if i is None:
                return
            try:
                record = work(i)
            except BaseException as e:
                errors.append(e)
                continue
            with lock:
                records.append(record)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors and not records:
        raise errors[0]
    return records, time.perf_counter() - t0


def run_load(engine: Any, concurrency: int, num_prompts: int, make: Callable[[int], SynthesisParams],
             on_done: Callable[[RequestMetrics], None] | None = None) -> tuple[list[RequestMetrics], float]:
    """Closed loop through the engine: `concurrency` clients share `num_prompts` requests."""
    def work(i: int) -> RequestMetrics:
        m = engine.submit(make(i)).result().metrics
        if on_done:
            on_done(m)
        return m

    return closed_loop(concurrency, num_prompts, work)
