"""The app's reads of the engine, each behind one small function over the Engine's public API.

Owns: a request's mode, per-mode readiness for the panel, and ZeroGPU's whole-clip synthesis.
Knows nothing about Gradio.
"""

from __future__ import annotations

from typing import Any

from omni_tts.config import SynthesisParams


def with_mode(params: SynthesisParams, mode: str | None) -> SynthesisParams:
    """`params` set to run in `mode` (None or '': the engine's default mode)."""
    params.mode = mode or None
    return params


NOT_RESIDENT = ("not loaded in this server: list it under `modes:` in a preset file and start with "
                "`python app.py --preset FILE`")


def mode_readiness(engine: Any) -> dict[str, str]:
    """mode -> its state for the panel: 'ready', 'warming 3/12' (warm steps done, of how many; and whether
    it serves meanwhile), 'queued', 'failed: why' or 'unavailable: why' (in a visitor's words)."""
    out = {}
    for mode, v in engine.modes().items():
        state = v.state
        if v.state == "warming":
            done, total = v.progress
            state += (f" {done}/{total}" if total else "") + (" (serving meanwhile)" if v.serving else "")
        if v.is_default:
            state += ", default"
        if v.reason and v.state in ("failed", "unavailable"):
            state += f": {NOT_RESIDENT if 'not resident' in v.reason else v.reason}"
        out[mode] = state
    return out


def comparable_modes(engine: Any) -> list[str]:
    """The modes that can serve a request here (ready, warming or queued), in the engine's order."""
    return [m for m, v in engine.modes().items() if v.state not in ("failed", "unavailable")]


def synthesize_whole(engine: Any, params: SynthesisParams) -> tuple[Any, int]:
    """ZeroGPU: one whole clip on the plain path inside the caller's GPU call -> (wav, frames)."""
    wav, codes = engine.synthesize_offline(params)
    return wav, int(codes.shape[0])
