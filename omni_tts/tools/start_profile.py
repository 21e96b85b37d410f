"""Where a fresh engine's first requests spend their time: the engine built as the app builds it (not
warming; primed, and the priming waited for, unless --no-prime; a pause standing for the page build;
then `start_warming`), eager requests sent one after another, and every thread's stack sampled every
few milliseconds.

    omni-tts start-profile --model CUSTOM_VOICE_DIR [--preset bench] [--set KEY=VALUE] [--requests 3]
        [--frames 25] [--page-s 3] [--no-prime] [--json OUT]

For each request: when it was sent, its queued time and TTFP; for the first one, per thread, the most
frequent places its samples fell in between sending and first audio, each as "innermost omni_tts frame |
outermost omni_tts frame | leaf frame" ("importing" in front when inside an import). A thread waiting
on a lock shows the line it waits at; one waiting for the GIL shows the line it will run next.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from omni_tts.config import EngineConfig
from omni_tts.tools.args import add_engine_flags, engine_config

SAMPLE_S = 0.005
DEPTH = 90


class StackSampler:
    """Samples every other thread's stack every SAMPLE_S seconds in a daemon thread."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, str, list[str]]] = []  # (perf_counter, thread name, frames leaf first)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="start-profile-sampler", daemon=True)

    def __enter__(self) -> StackSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.is_set():
            t = time.perf_counter()
            names = {th.ident: th.name for th in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident != me:
                    self.samples.append((t, names.get(ident, str(ident)), _frames(frame)))
            time.sleep(SAMPLE_S)

    def top(self, start: float, end: float, n: int = 10) -> dict[str, dict[str, Any]]:
        """Per thread: samples in [start, end] and the n most frequent places."""
        counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for t, name, frames in self.samples:
            if start <= t <= end:
                counts[name][_place(frames)] += 1
        return {name: {"samples": sum(c.values()), "top": c.most_common(n)} for name, c in sorted(counts.items())}


def _frames(frame: Any) -> list[str]:
    out = []
    while frame is not None and len(out) < DEPTH:
        code = frame.f_code
        out.append(f"{code.co_filename.split('site-packages/')[-1]}:{code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return out


def _place(frames: list[str]) -> str:
    ours = [f[f.index("omni_tts/"):] for f in frames if "omni_tts/" in f]
    importing = "importing " if any("_find_and_load" in f for f in frames) else ""
    return f"{importing}{ours[0] if ours else '-'} | {ours[-1] if ours else '-'} | {frames[0] if frames else '-'}"


def measure(config: EngineConfig, requests: int = 3, frames: int = 25, page_s: float = 3.0, prime: bool = True
            ) -> dict[str, Any]:
    """Build the engine, run `requests` eager requests one after another, return the timings and samples."""
    from omni_tts import Engine
    from omni_tts.config import SynthesisParams

    log: list[tuple[float, str]] = []
    with StackSampler() as sampler:
        t0 = time.perf_counter()
        engine = Engine.from_config(config, progress=lambda s: log.append((time.perf_counter() - t0, s)),
                                    wait=False, warm=False)
        try:
            if prime:  # as the app does: the priming ends before the page is built
                engine.prime()
                engine.wait_primed()
            time.sleep(page_s)
            engine.start_warming()
            rows = []
            voice = engine.plain_voice() or {}  # Base has none: its requests say why they are refused
            for i in range(requests):
                p = SynthesisParams(text=f"Request {i + 1} of the start-up profile.", mode="eager",
                                    fixed_frames=frames, seed=1, **voice)
                sent = time.perf_counter()
                handle = engine.submit(p)
                chunk = next(handle.stream(timeout=600), None)
                first = time.perf_counter() if chunk is not None else None
                handle.result(600)
                m = handle.metrics
                rows.append({"sent_s": sent - t0, "first_audio_s": (first or sent) - sent, "queue_ms": m.queue_ms,
                             "ttfp_ms": m.ttfp_ms, "window": (sent, first or sent)})
        finally:
            engine.shutdown()
    first_window = sampler.top(*rows[0]["window"]) if rows else {}
    for r in rows:
        r.pop("window")
    return {"config": dataclasses.asdict(config), "prime": prime, "page_s": page_s,
            "requests": rows, "log": [(round(t, 3), s) for t, s in log], "first_request_threads": first_window}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_engine_flags(ap, preset="bench")
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--frames", type=int, default=25)
    ap.add_argument("--page-s", type=float, default=3.0, help="pause standing for the app's page build")
    ap.add_argument("--no-prime", action="store_true")
    ap.add_argument("--json", default=None)


def main(args: argparse.Namespace) -> int:
    res = measure(engine_config(args), args.requests, args.frames, args.page_s, not args.no_prime)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    for r in res["requests"]:
        print(f"sent {r['sent_s']:.2f} s: first audio {r['first_audio_s']:.3f} s, queued {r['queue_ms']:.1f} ms, "
              f"TTFP {r['ttfp_ms']:.1f} ms")
    for name, v in res["first_request_threads"].items():
        print(f"-- {name}: {v['samples']} samples")
        for place, n in v["top"][:5]:
            print(f"   {n:5d}  {place}")
    return 0
