"""Speaking speed: a finished clip played faster or slower at the same pitch.

Owns the speed range and the stretch itself, done by Rubber Band through Spotify's pedalboard
(`pedalboard.time_stretch`). Arrays in, arrays out; knows nothing about requests or formats. The
library stretches whole buffers only (no streaming stretcher), so callers apply it to whole clips.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from omni_tts.errors import InputError

MIN_SPEED, MAX_SPEED = 0.25, 4.0


def check_speed(speed: object, name: str = "speed") -> float:
    """`speed` as a float within [0.25, 4.0]; anything else -> InputError naming `name`."""
    if isinstance(speed, bool) or not isinstance(speed, numbers.Real) or not math.isfinite(float(speed)):
        raise InputError(f"{name} must be a number from {MIN_SPEED:g} to {MAX_SPEED:g} (got {speed!r})")
    if not MIN_SPEED <= float(speed) <= MAX_SPEED:
        raise InputError(f"{name} must be from {MIN_SPEED:g} to {MAX_SPEED:g} (got {float(speed):g})")
    return float(speed)


def change_speed(wav: np.ndarray, sample_rate: int, speed: float) -> np.ndarray:
    """`wav` (float32 mono) spoken `speed` times as fast, pitch kept; speed 1 returns it unchanged."""
    speed = check_speed(speed)
    wav = np.asarray(wav, np.float32)
    if speed == 1.0 or wav.size == 0:
        return wav
    from pedalboard import time_stretch  # imported on first use: most requests never stretch

    out = time_stretch(wav[None, :], float(sample_rate), stretch_factor=speed)
    return np.ascontiguousarray(out[0], dtype=np.float32)
