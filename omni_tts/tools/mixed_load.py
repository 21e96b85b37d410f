"""Modes side by side in one engine: a burst spread over every resident mode, and a fast mode's RTF with a
slow mode streaming beside it.

    python -m omni_tts.tools.mixed_load --model DIR [--modes M,...] [--requests 64] [--fixed-frames 75] [--json OUT]

Uses only the Engine's public API. Prints per mode: requests done / failed, median TTFP and RTF; then the
default mode's solo RTF against its RTF while one eager request streams beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
from collections.abc import Sequence
from typing import Any

import torch

from omni_tts.config import EngineConfig, SynthesisParams
from omni_tts.engine.engine import Engine
from omni_tts.errors import OmniTTSError
from omni_tts.tools.load import make_params


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


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m omni_tts.tools.mixed_load", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--modes", default=None, help="comma-separated, the fast one first and the slow one last "
                    "(default: every mode on CUDA, default and eager on a CPU)")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=32)
    ap.add_argument("--fixed-frames", type=int, default=75)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    names = args.modes or ("default+cudagraph,default,reduce-overhead,eager" if torch.cuda.is_available()
                           else "default,eager")
    modes = [m.strip() for m in names.split(",") if m.strip()]
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    try:
        cfg = EngineConfig(model=args.model, mode=modes[0], modes=modes, device=args.device,
                           max_num_seqs=args.max_num_seqs, max_seq_len=1024, initial_chunk_frames=1,
                           max_waiting=0)  # the burst overfills the slots on purpose
        engine = Engine.from_config(cfg, progress=say)
    except OmniTTSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for m in modes:
        engine.wait_ready(m)
    voice = engine.plain_voice() or {}  # Base has none: its requests say why they are refused

    def make(i: int, mode: str) -> SynthesisParams:
        return make_params(i, voice.get("speaker"), args.fixed_frames, task=voice.get("task", "custom_voice"),
                           instruct=voice.get("instruct"), mode=mode)

    try:
        report = {"burst": burst(engine, modes, args.requests, make),
                  "beside": beside(engine, modes[0], modes[-1], make)}
    finally:
        engine.shutdown()
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
