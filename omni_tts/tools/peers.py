"""`python -m omni_tts.bench peers`: the same prompts and checkpoint through the peers a user would
otherwise pick, each through its public API only, beside our engine, single stream.

    python -m omni_tts.bench peers --model DIR [--frames 75] [--num-prompts N] [--device cuda]
        [--peers qwen-tts,faster-qwen3-tts] [--chunk-size 8] [--json OUT]

Owns: loading each peer if it is importable (the official `qwen-tts` package: transformers generate,
whole clip; `faster-qwen3-tts`: its CUDA-graph generator, streaming and not), timing them the way
our metrics do (TTFP = request start -> first audio in hand; RTF = wall / audio seconds), and one
table. A peer that is not installed or fails is a row saying so. On a machine without network,
install the peers from wheels into a separate --target dir placed first on PYTHONPATH.
Knows nothing about the peers' internals.
"""

from __future__ import annotations

import argparse
import atexit
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from omni_tts.tools.load import PROMPTS

Clip = tuple[float, float, float]  # (ttfp s, wall s, audio s)


def _timed_stream(chunks: Iterable[tuple[np.ndarray, int]]) -> Clip:
    t0, first, samples, sr = time.perf_counter(), None, 0, 24000
    for wav, _sr in chunks:
        if first is None:
            first = time.perf_counter() - t0
        samples += int(np.asarray(wav).reshape(-1).shape[0])
    wall = time.perf_counter() - t0
    return (first if first is not None else wall), wall, samples / float(sr)


def official(model: str, device: str, dtype: Any, frames: int, speaker: str) -> Callable[[str], Clip]:
    from qwen_tts import Qwen3TTSModel  # type: ignore[import-not-found]

    m = Qwen3TTSModel.from_pretrained(model, device_map=device, dtype=dtype, attn_implementation="sdpa")

    def one(text: str) -> Clip:
        def gen():
            wavs, sr = m.generate_custom_voice(text=text, speaker=speaker, language="English",
                                               max_new_tokens=frames + 1)
            yield wavs[0], sr
        return _timed_stream(gen())  # whole clip: TTFP == wall
    return one


def faster(model: str, device: str, dtype: Any, frames: int, speaker: str, chunk_size: int | None
           ) -> Callable[[str], Clip]:
    from faster_qwen3_tts import FasterQwen3TTS  # type: ignore[import-not-found]

    m = FasterQwen3TTS.from_pretrained(model, device=device, dtype=dtype)
    kw = dict(speaker=speaker, language="English", max_new_tokens=frames + 1, min_new_tokens=frames + 1)

    def one(text: str) -> Clip:
        if chunk_size:
            return _timed_stream((w, sr) for w, sr, _ in
                                 m.generate_custom_voice_streaming(text=text, chunk_size=chunk_size, **kw))

        def gen():
            wavs, sr = m.generate_custom_voice(text=text, **kw)
            yield wavs[0], sr
        return _timed_stream(gen())
    return one


def ours(model: str, device: str, frames: int, speaker: str) -> Callable[[str], Clip]:
    from omni_tts.config import SynthesisParams, load_preset
    from omni_tts.engine.engine import Engine

    mode = None if device.startswith("cuda") else "eager"  # graph modes need CUDA (CPU: compile takes minutes)
    engine = Engine.from_config(load_preset("bench", model=model, device=device, mode=mode, max_num_seqs=1))
    atexit.register(engine.shutdown)  # its threads must stop before the interpreter tears down

    def one(text: str) -> Clip:
        r = engine.synthesize(SynthesisParams(text=text, speaker=speaker, language="English", fixed_frames=frames))
        m = r.metrics
        return m.ttfp_ms / 1000.0, m.e2e_ms / 1000.0, m.audio_s
    return one


def measure(make: Callable[[], Callable[[str], Clip]], prompts: Sequence[str]) -> dict[str, Any]:
    try:
        one = make()
        one(prompts[0])  # warm-up (graph capture, autotune), excluded
        clips = [one(p) for p in prompts]
    except ImportError as e:
        return {"error": f"not installed ({e.name or e})"}
    except Exception as e:  # a failing peer is a result
        return {"error": f"{type(e).__name__}: {str(e)[:120]}"}
    return {"med_ttfp_ms": 1000 * statistics.median(c[0] for c in clips),
            "mean_rtf": statistics.fmean(c[1] / c[2] for c in clips if c[2] > 0),
            "audio_s": sum(c[2] for c in clips), "requests": len(clips)}


def table(rows: dict[str, dict[str, Any]]) -> str:
    out = ["| system | Med TTFP (ms) | Mean RTF | audio s |", "|---|---|---|---|"]
    for name, r in rows.items():
        if "error" in r:
            out.append(f"| {name} | {r['error']} | - | - |")
        else:
            out.append(f"| {name} | {r['med_ttfp_ms']:.1f} | {r['mean_rtf']:.3f} | {r['audio_s']:.1f} |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m omni_tts.bench peers", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="checkpoint dir (the same one for every system)")
    ap.add_argument("--frames", type=int, default=75)
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--speaker", default="ryan")
    ap.add_argument("--peers", default="qwen-tts,faster-qwen3-tts")
    ap.add_argument("--chunk-size", type=int, default=8, help="faster-qwen3-tts streaming chunk (0: off)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    import torch

    dtype = torch.bfloat16 if a.device.startswith("cuda") else torch.float32
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(a.num_prompts)]
    systems: dict[str, Callable[[], Callable[[str], Clip]]] = {
        "omni-tts (engine, bench preset, 1 slot, streaming)": lambda: ours(a.model, a.device, a.frames, a.speaker)}
    names = [p.strip() for p in a.peers.split(",") if p.strip()]
    if "qwen-tts" in names:
        systems["qwen-tts (official, whole clip)"] = lambda: official(a.model, a.device, dtype, a.frames, a.speaker)
    if "faster-qwen3-tts" in names:
        systems["faster-qwen3-tts (non-streaming)"] = lambda: faster(a.model, a.device, dtype, a.frames,
                                                                     a.speaker, None)
        if a.chunk_size:
            systems[f"faster-qwen3-tts (streaming, chunk {a.chunk_size})"] = lambda: faster(
                a.model, a.device, dtype, a.frames, a.speaker, a.chunk_size)
    rows = {}
    for name, make in systems.items():
        print(f"running {name} ...", file=sys.stderr, flush=True)
        rows[name] = measure(make, prompts)
    print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"frames": a.frames, "device": a.device, "rows": rows}, f, indent=1)
    return 0
