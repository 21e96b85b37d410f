"""Soak test: one engine under a long run of mixed load, watching for memory that grows and for requests
that fail or disturb each other.

    omni-tts soak --minutes 30 [--model DIR] [--preset default] [--set max_num_seqs=8] [--mode M]
        [--burst 12] [--max-frames 48] [--marks 5] [--json OUT]

Owns the load: bursts of concurrent requests mixing the checkpoint's tasks, text lengths, sampling
settings and seeds; some read to the end, some streamed and cancelled after their first chunk, some
cancelled at once, some bad inputs that must be refused at submit. Every outcome is checked (a finished
request's codes within the codebook and its audio exactly its frames long, a cancelled one's partial
audio and codes agreeing). Prints RSS (from /proc/self/statm) after warm-up, at each mark and at the
end, the requests served and the outcomes by kind; exit status 1 when any outcome was unexpected or the
growth after warm-up exceeds --max-growth-mb. Uses only the Engine's public API, on the preset's engine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from omni_tts.config import SynthesisParams
from omni_tts.errors import Cancelled, InputError, OmniTTSError
from omni_tts.limits import MAX_INPUT_CHARS
from omni_tts.tools.args import add_engine_flags, engine_config

WORDS = ("the quick brown fox jumps over a lazy dog near river bank please remember bring umbrella rain "
         "store opens monday morning beautiful sunset mountains meeting moved thursday time prepare").split()
INSTRUCTS = ("a calm low voice", "a bright cheerful young voice", "speak slowly and clearly")
# Each is refused by SynthesisParams.validate or the model at submit; the soak counts one accepted as a failure.
BAD_INPUTS: tuple[dict[str, Any], ...] = (
    dict(seed=2**63), dict(seed=1e300), dict(temperature=float("nan")), dict(temperature=float("inf")),
    dict(top_k=-1), dict(repetition_penalty=float("nan")), dict(max_new_tokens=2**70), dict(text="hi \ud800"),
    dict(text="   "), dict(text="x" * (MAX_INPUT_CHARS + 1)), dict(speaker="nobody-at-all"), dict(language="klingon"),
)
# One cycle of what is done with a request (shuffled once per run): most read to the end.
ACTIONS = ("result",) * 13 + ("stream",) * 2 + ("stream_cancel",) * 2 + ("cancel",) + ("bad",) * 2
FRAME_RATE_HZ = 12.5
EXPECTED = {"done", "cancelled", "refused"}
TIMEOUT_S = 600.0


def rss_mb() -> float:
    """Resident set size of this process in MB (Linux /proc/self/statm: pages)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class Mix:
    """The request generator: deterministic for a seed, varied across tasks, lengths and settings."""

    def __init__(self, engine: Any, seed: int, max_frames: int) -> None:
        self.rng = random.Random(seed)
        self.tasks, self.speakers = engine.tasks() or ["custom_voice"], engine.speakers()
        self.languages = ["Auto", *[lang for lang in engine.languages() if lang != "auto"][:3]]
        self.max_frames = max_frames
        self.actions = list(ACTIONS)
        self.rng.shuffle(self.actions)
        self.count = 0
        self.voices = self._voices(engine) if "voice_clone" in self.tasks else []

    def _voices(self, engine: Any) -> list[Any]:
        """An x-vector-only and an ICL voice prompt from a synthetic two-tone clip."""
        t = np.arange(int(2.0 * 24000)) / 24000
        clip = (0.3 * np.sin(2 * np.pi * 180 * t) + 0.1 * np.sin(2 * np.pi * 2300 * t)).astype(np.float32)
        return [engine.voice_prompt((clip, 24000), x_vector_only=True),
                engine.voice_prompt((clip, 24000), "the quick brown fox")]

    def next(self) -> tuple[str, SynthesisParams]:
        """(action, request); a 'bad' request has one field from BAD_INPUTS (a speaker only where one is used)."""
        action = self.actions[self.count % len(self.actions)]
        self.count += 1
        p = self._params()
        if action == "bad":
            p.update(self.rng.choice([b for b in BAD_INPUTS if "speaker" not in b or p["task"] == "custom_voice"]))
        return action, SynthesisParams(**p)

    def _params(self) -> dict[str, Any]:
        r = self.rng
        task = r.choice(self.tasks)
        p: dict[str, Any] = dict(text=" ".join(r.choice(WORDS) for _ in range(r.randint(1, 24))), task=task,
                                 language=r.choice(self.languages), max_new_tokens=r.randint(2, self.max_frames + 1),
                                 seed=r.randrange(2**63))
        if task == "custom_voice" and self.speakers:
            p["speaker"] = r.choice(self.speakers)
        if task == "voice_design":
            p["instruct"] = r.choice(INSTRUCTS)
        if task == "voice_clone":
            p["voice"] = r.choice(self.voices)
        if r.random() < 0.3:
            p["greedy"] = True
        else:
            p.update(do_sample=True, temperature=r.uniform(0.3, 1.5), top_k=r.choice((0, 1, 5, 50, 500)),
                     top_p=r.uniform(0.5, 1.0), repetition_penalty=r.uniform(1.0, 1.3))
        return p


def run_one(engine: Any, action: str, request: Any, spf: int) -> tuple[str, str]:
    """Do `action` with one request -> (outcome kind, detail for unexpected ones)."""
    if action == "bad":
        try:
            handle = engine.submit(request)
        except InputError:
            return "refused", ""
        except Exception as e:  # refused, but not as the bad input it is
            return f"bad_input_error:{type(e).__name__}", str(e)[:160]
        handle.cancel()
        return "accepted_bad_input", repr(request)[:200]
    try:
        handle = engine.submit(request)
    except OmniTTSError as e:
        return f"refused_good:{type(e).__name__}", str(e)[:160]
    try:
        if action == "cancel":
            handle.cancel()
        elif action.startswith("stream"):
            for _ in handle.stream(timeout=TIMEOUT_S):
                if action == "stream_cancel":
                    handle.cancel()
                    break
        return check(handle.result(timeout=TIMEOUT_S), request, spf)
    except Cancelled as e:
        return check(e.partial, request, spf, cancelled=True)
    except Exception as e:  # anything else failing a good request is what the soak looks for
        return f"error:{type(e).__name__}", str(e)[:160]


def check(result: Any, request: SynthesisParams, spf: int, cancelled: bool = False) -> tuple[str, str]:
    """A result's codes and audio agree and lie in range; -> ('done' | 'cancelled', '') or the mismatch."""
    frames = result.codes.shape[0]
    if result.wav.shape[0] != frames * spf:
        return "audio_codes_mismatch", f"{frames} frames, {result.wav.shape[0]} samples"
    if frames and (int(result.codes.min()) < 0 or int(result.codes.max()) >= 2048):
        return "code_out_of_range", f"{int(result.codes.min())}..{int(result.codes.max())}"
    if not cancelled and frames > request.max_new_tokens - 1:
        return "too_many_frames", f"{frames} > {request.max_new_tokens - 1}"
    if not np.isfinite(result.wav).all():
        return "non_finite_audio", ""
    return ("cancelled" if cancelled else "done"), ""


class Soak:
    """Bursts until the time or request budget is spent; RSS marks and outcome counts along the way."""

    def __init__(self, engine: Any, args: argparse.Namespace) -> None:
        self.engine, self.args = engine, args
        self.mix = Mix(engine, args.seed, args.max_frames)
        self.spf = round(engine.sample_rate / FRAME_RATE_HZ)
        self.outcomes: Counter[str] = Counter()
        self.details: dict[str, str] = {}
        self.marks: list[dict[str, Any]] = []
        self.timeline: list[dict[str, float]] = []
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=args.burst, thread_name_prefix="soak")

    def burst(self, n: int) -> None:
        jobs = [self.mix.next() for _ in range(n)]
        for kind, detail in self.pool.map(lambda j: run_one(self.engine, j[0], j[1], self.spf), jobs):
            with self.lock:
                self.outcomes[kind] += 1
                if kind not in EXPECTED and detail:
                    self.details.setdefault(kind, detail)

    def mark(self, label: str, start: float) -> None:
        m = dict(label=label, minutes=round((time.monotonic() - start) / 60, 3), rss_mb=round(rss_mb(), 1),
                 requests=sum(self.outcomes.values()))
        self.marks.append(m)
        print(f"rss {label}: {m['rss_mb']:.1f} MB after {m['requests']} requests ({m['minutes']:.2f} min)",
              flush=True)

    def run(self) -> None:
        a, rng = self.args, random.Random(self.args.seed + 1)
        self.burst(a.warmup)
        start = time.monotonic()
        self.mark("after warm-up", start)
        marks = sorted(m for m in a.marks if m < a.minutes)
        next_sample = 0.0
        while True:
            elapsed = (time.monotonic() - start) / 60
            served = sum(self.outcomes.values()) - a.warmup
            if elapsed >= a.minutes or (a.requests and served >= a.requests):
                break
            if marks and elapsed >= marks[0]:
                self.mark(f"at {marks.pop(0):g} min", start)
            if elapsed >= next_sample:
                self.timeline.append(dict(minutes=round(elapsed, 3), rss_mb=round(rss_mb(), 1)))
                next_sample += 1.0
            self.burst(rng.randint(1, a.burst))
            time.sleep(rng.uniform(0.0, a.gap_s))
        self.mark("at the end", start)

    def summary(self) -> dict[str, Any]:
        unexpected = {k: v for k, v in self.outcomes.items() if k not in EXPECTED}
        growth = self.marks[-1]["rss_mb"] - self.marks[0]["rss_mb"]
        return dict(outcomes=dict(self.outcomes), unexpected=unexpected, examples=self.details, marks=self.marks,
                    timeline=self.timeline, growth_mb=round(growth, 1), requests=sum(self.outcomes.values()))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_engine_flags(ap, mode=True)
    ap.add_argument("--minutes", type=float, default=30.0, help="how long to run after warm-up")
    ap.add_argument("--requests", type=int, default=0, help="stop after this many requests (0: time only)")
    ap.add_argument("--burst", type=int, default=12, help="at most this many requests at once")
    ap.add_argument("--warmup", type=int, default=16, help="requests before the first RSS mark")
    ap.add_argument("--max-frames", type=int, default=48, help="frames per request at most")
    ap.add_argument("--marks", type=float, nargs="*", default=[5.0], help="minutes at which to print RSS")
    ap.add_argument("--gap-s", type=float, default=0.5, help="idle time between bursts at most")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-growth-mb", type=float, help="fail when RSS grows more than this after warm-up")
    ap.add_argument("--json", help="write the summary here")


def main(args: argparse.Namespace) -> int:
    from omni_tts import Engine

    engine = Engine.from_config(engine_config(args), progress=lambda s: print(s, file=sys.stderr))
    try:
        print(f"soak: {engine.snapshot().model}, mode {engine.mode.value}, "
              f"{engine.config.max_num_seqs} slots, {args.minutes:g} min, bursts of up to {args.burst}", flush=True)
        soak = Soak(engine, args)
        soak.run()
        out = soak.summary()
    finally:
        engine.shutdown()
    print(f"served {out['requests']} requests: " + ", ".join(f"{k} {v}" for k, v in sorted(out["outcomes"].items())))
    print(f"rss growth after warm-up: {out['growth_mb']:+.1f} MB")
    for kind, example in out["examples"].items():
        print(f"unexpected {kind}: e.g. {example}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), **out), f, indent=1)
    too_much = args.max_growth_mb is not None and out["growth_mb"] > args.max_growth_mb
    return 1 if out["unexpected"] or too_much else 0
