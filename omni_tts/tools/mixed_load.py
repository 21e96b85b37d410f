"""`omni-tts mixed-load`: modes side by side in one engine: a burst spread over every resident mode, and a
fast mode's RTF with a slow mode streaming beside it.

    omni-tts mixed-load --model DIR [--preset default] [--modes M,...] [--requests 64] [--fixed-frames 75]

Uses only the Engine's public API; the engine is the preset's with the modes and slots asked for.
Prints per mode: requests done / failed, median TTFP and RTF; then the first mode's solo RTF against its
RTF while one request of the last mode streams beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
from typing import Any

from omni_tts import Engine
from omni_tts.errors import OmniTTSError
from omni_tts.tools.args import add_engine_flags, engine_config, progress
from omni_tts.tools.bench import device_modes
from omni_tts.tools.load import request_maker


def burst(engine: Engine, modes: list[str], n: int, make: Any) -> dict[str, dict[str, Any]]:
    """n requests submitted at once, mode i % len(modes); -> per mode: done, failed, med TTFP, med RTF."""
    handles = [(modes[i % len(modes)], engine.submit(make(i, modes[i % len(modes)]))) for i in range(n)]
    out: dict[str, dict[str, Any]] = {m: {"done": 0, "failed": 0, "ttfp": [], "rtf": []} for m in modes}
    for mode, h in handles:
        try:
            m = h.result(600).metrics
            out[mode]["done"] += 1
            out[mode]["ttfp"].append(m.ttfp_ms)
            out[mode]["rtf"].append(m.rtf)
        except OmniTTSError as e:
            out[mode]["failed"] += 1
            out[mode]["error"] = str(e)[:120]
    for v in out.values():
        v["med_ttfp_ms"] = statistics.median(v.pop("ttfp")) if v["done"] else None
        v["med_rtf"] = statistics.median(v.pop("rtf")) if v["done"] else None
    return out


def beside(engine: Engine, fast: str, slow: str, make: Any, repeats: int = 3) -> dict[str, float]:
    """The fast mode's median RTF alone, then with one slow-mode request streaming beside each run."""
    solo = [engine.synthesize(make(i, fast)).metrics.rtf for i in range(repeats)]
    paired = []
    for i in range(repeats):
        other = engine.submit(make(100 + i, slow))
        first = threading.Event()
        threading.Thread(target=lambda: (next(other.stream(), None), first.set()), daemon=True).start()
        first.wait(120)  # the slow request is streaming
        paired.append(engine.synthesize(make(i, fast)).metrics.rtf)
        other.cancel()
    return {"solo_rtf": statistics.median(solo), "beside_rtf": statistics.median(paired)}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_engine_flags(ap)
    ap.add_argument("--modes", default=None, help="comma-separated, the fast one first and the slow one last "
                    "(default: every mode this device runs, fastest first)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--fixed-frames", type=int, default=75)
    ap.add_argument("--json", default=None)


def main(args: argparse.Namespace) -> int:
    config = engine_config(args, max_num_seqs=args.max_num_seqs)
    modes = device_modes(config, args.modes)[::-1 if args.modes is None else 1]  # eager, the slowest, last
    # max_waiting 0: the burst overfills the slots on purpose
    engine = Engine.from_config(engine_config(args, max_num_seqs=args.max_num_seqs, mode=modes[0], modes=modes,
                                              max_waiting=0), progress=progress())
    make = request_maker(engine, args.fixed_frames)
    try:
        for m in modes:
            engine.wait_ready(m)
        report = {"burst": burst(engine, modes, args.requests, make),
                  "beside": beside(engine, modes[0], modes[-1], make)}
    finally:
        engine.shutdown()
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0
