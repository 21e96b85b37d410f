"""The app's only reads of the engine beyond its public API, each behind one small function.

Owns: the loaded model's description (the checkpoint's name, generation defaults, embedded-demo
flag and instruct support beside the Engine's speakers / languages / tasks), a request's frame cap (to
say when a clip was cut), a request's mode, per-mode readiness for the panel, and ZeroGPU's whole-clip
synthesis on the model's plain path. What reads past the public API is listed in the project's notes
on what the Engine should expose, so these can drop the fallbacks. Knows nothing about Gradio.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omni_tts.config import SynthesisParams


def model_info(engine: Any) -> dict[str, Any]:
    """Speakers, languages, tasks, instruct support, description and sampling defaults of the loaded model."""
    ckpt = engine.model.checkpoint
    describe = f"embedded tiny random demo checkpoint (`{ckpt.path}`)" if ckpt.is_embedded_demo else ckpt.describe()
    return {"speakers": list(engine.speakers()), "languages": list(engine.languages()), "tasks": list(engine.tasks()),
            "instruct": bool(engine.model.supports_instruct()), "describe": describe,
            "embedded": ckpt.is_embedded_demo, "generation": dict(ckpt.generation_config or {}),
            "reason": (ckpt.notes or [""])[-1], "sample_rate": int(engine.sample_rate),
            "name": Path(str(ckpt.path)).name or "omni-tts"}


def with_mode(params: SynthesisParams, mode: str | None) -> SynthesisParams:
    """`params` set to run in `mode` (None or '': the engine's default mode)."""
    params.mode = mode or None
    return params


def mode_readiness(engine: Any) -> dict[str, str]:
    """mode -> its state for the panel: 'ready', 'warming', 'queued', 'failed: why' or 'unavailable: why'."""
    out = {}
    for mode, v in engine.modes().items():
        state = str(v["state"])
        if v.get("default"):
            state += ", default"
        if v.get("reason") and v["state"] in ("failed", "unavailable"):
            state += f": {v['reason']}"
        out[mode] = state
    return out


def frame_cap(engine: Any, handle: Any) -> int | None:
    """The most frames a request could make (its Max length, or the engine's room after the prompt);
    None when it cannot be told."""
    if getattr(handle, "max_frames", None) is not None:
        return int(handle.max_frames)
    try:
        return int(engine.model.prepare(handle.params, engine.config.max_seq_len).max_frames)
    except Exception:
        return None


def synthesize_whole(engine: Any, params: SynthesisParams) -> tuple[Any, int]:
    """ZeroGPU: one whole clip on the model's plain path inside the caller's GPU call -> (wav, frames)."""
    from omni_tts.engine.offline import synthesize

    wav, codes = synthesize(engine.model, params)
    return wav, int(codes.shape[0])
