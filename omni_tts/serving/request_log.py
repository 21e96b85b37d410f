"""The service's request log: one line per request the engine ends, in place of uvicorn's access log (off:
it would log a stream when its headers go out, before anything is known of how it ends).

Owns `line(metrics)` (the request's id as the x-request-id header gives it, its outcome and mode, the
audio it made, TTFP with its wait for a slot, E2E, RTF, and an error's message) and `attach(engine)`,
which logs that line for every request the engine ends: INFO, WARNING for an error or a shutdown's end.
Knows nothing about HTTP.
"""

from __future__ import annotations

import logging
from typing import Any

from omni_tts.engine.request import SHUT_DOWN

log = logging.getLogger("omni_tts.requests")


def line(m: Any) -> str:
    """'request #12 done (eager): 3.84 s of audio (48 frames), TTFP 18 ms (queued 0 ms), E2E 210 ms, RTF 0.055'."""
    parts = [f"request #{m.request_id} {m.outcome} ({m.mode}): {m.audio_s:.2f} s of audio ({m.frames} frames)"]
    if m.ttfp_ms is not None:
        parts.append(f"TTFP {m.ttfp_ms:.0f} ms (queued {m.queue_ms or 0.0:.0f} ms)")
    if m.e2e_ms is not None:
        parts.append(f"E2E {m.e2e_ms:.0f} ms")
    if m.rtf is not None:
        parts.append(f"RTF {m.rtf:.3f}")
    if _failed(m) and m.error:
        parts.append(m.error)
    return ", ".join(parts)


def _failed(m: Any) -> bool:
    """An error, or a request the engine's shutdown ended: not what its caller asked for."""
    return m.status == "error" or m.reason == SHUT_DOWN


def _observe(m: Any) -> None:
    log.log(logging.WARNING if _failed(m) else logging.INFO, "%s", line(m))


def attach(engine: Any) -> None:
    """Log every request `engine` ends from now on (once per engine, however many apps serve it)."""
    if _observe not in engine.stats.observers:
        engine.stats.observers.append(_observe)
