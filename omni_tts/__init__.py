"""omni-tts: a fast, faithful in-process inference engine for Qwen3-TTS (12 Hz).

The public API is what this module exports: `Engine` (load a model, `submit` requests, stream their
audio), `SynthesisParams` (one request), `CompileMode` and `MODES` (how the CodePredictor runs),
`load_preset` / `EngineConfig` (the engine's settings), the snapshot records, and the error types.
Anything imported from deeper modules may change without notice. The package owns model code,
prompt building, sampling, CUDA-graph capture and the streaming engine; it knows nothing about Gradio.
"""

from __future__ import annotations

from typing import Any

from omni_tts.config import MODES, CompileMode, EngineConfig, SynthesisParams, load_preset
from omni_tts.errors import (
    Cancelled,
    CheckpointError,
    DeadlineExceeded,
    EngineError,
    InputError,
    OmniTTSError,
    Overloaded,
)

__all__ = ["MODES", "AudioChunk", "Cancelled", "CheckpointError", "CompileMode", "DeadlineExceeded", "Engine",
           "EngineConfig", "EngineError", "EngineSnapshot", "InputError", "ModeStatus", "OmniTTSError", "Overloaded",
           "RequestHandle", "RequestMetrics", "SynthesisParams", "SynthesisResult", "load_preset"]
__version__ = "0.1.0"

# imported on first use: the engine brings torch, which `import omni_tts` alone should not pay for
_LAZY = {"Engine": "omni_tts.engine.engine", "AudioChunk": "omni_tts.engine.request",
         "RequestHandle": "omni_tts.engine.request", "SynthesisResult": "omni_tts.engine.request",
         "EngineSnapshot": "omni_tts.engine.snapshot", "ModeStatus": "omni_tts.engine.snapshot",
         "RequestMetrics": "omni_tts.engine.metrics"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'omni_tts' has no attribute '{name}'")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
