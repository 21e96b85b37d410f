"""What a request's fields may hold: the bounds of each numeric field (`LIMITS`), the longest texts, and
the checks that refuse anything else with one InputError naming the field (`check_text`, `check_number`).

Owns the limits every entry point shares: SynthesisParams.validate, the page's sliders, the HTTP API's
descriptions, the voice prompt's transcript and a checkpoint's generation_config. Knows nothing else.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from omni_tts.errors import InputError

MAX_TEXT_CHARS = 2000  # instruct and a reference transcript
# the text to speak: longer than one prompt should be, so the engine speaks it in segments (engine/long_text)
MAX_INPUT_CHARS = 5000
MAX_NAME_CHARS = 64  # speaker and language names


@dataclass(frozen=True)
class Limit:
    """Bounds of one numeric request field, both ends included unless `low_open` (then low is refused)."""

    low: float
    high: float
    integer: bool = False
    low_open: bool = False
    note: str = ""  # what a special value means, said with the bounds

    def describe(self) -> str:
        if self.low_open:
            return f"in ({self.low:g}, {self.high:g}]"
        return f">= {self.low} and <= {self.high}"


# 8192 is the released checkpoints' own generation_config.json value; beyond it the plain loop's KV cache
# alone would not fit in memory on the larger models.
MAX_NEW_TOKENS = 8192
# top-k above every stage's vocabulary (talker 3072, code predictor 2048 in the released checkpoints)
# means the whole vocabulary, as 0 does; 4096 leaves room for a larger vocabulary and refuses nonsense.
MAX_TOP_K = 4096
_TOP_K = Limit(0, MAX_TOP_K, integer=True, note="0 turns top-k off")
_TEMPERATURE = Limit(0.0, 10.0, note="0 means greedy; above 10 every token is about equally likely")
_TOP_P = Limit(0.0, 1.0, low_open=True)
# Per numeric SynthesisParams field: what SynthesisParams.validate enforces (the app's inputs use them as
# their minimum/maximum). The seed is an int64 on the device, hence 2**63 - 1.
LIMITS: dict[str, Limit] = {
    "seed": Limit(0, 2**63 - 1, integer=True),
    "top_k": _TOP_K,
    "subtalker_top_k": _TOP_K,
    "temperature": _TEMPERATURE,
    "subtalker_temperature": _TEMPERATURE,
    "top_p": _TOP_P,
    "subtalker_top_p": _TOP_P,
    "repetition_penalty": Limit(0.0, 10.0, low_open=True, note="1 means no penalty"),
    "max_new_tokens": Limit(2, MAX_NEW_TOKENS, integer=True,
                            note="the model makes max_new_tokens - 1 frames, so 2 is the least"),
    "fixed_frames": Limit(1, MAX_NEW_TOKENS - 1, integer=True),
}


def check_text(name: str, value: Any, max_chars: int) -> None:
    """None, or a string of at most `max_chars` characters that UTF-8 can encode (no lone surrogates)."""
    if value is None:
        return
    if not isinstance(value, str):
        raise InputError(f"{name} must be a string (got {type(value).__name__})")
    if len(value) > max_chars:
        raise InputError(f"{name} is too long ({len(value)} characters; at most {max_chars})")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"{name} has a character that is not valid Unicode at position {e.start} "
                         f"(a lone surrogate {value[e.start]!a})") from None


def check_number(name: str, value: Any, limit: Limit) -> None:
    """None, or a number within `limit` (bools refused: True is not a seed); one InputError naming `name`."""
    if value is None:
        return
    kind = numbers.Integral if limit.integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        want = "a whole number" if limit.integer else "a number"
        raise InputError(f"{name} must be {want} (got {_show(value)})")
    if not isinstance(value, numbers.Integral) and math.isnan(value):
        raise InputError(f"{name} must be a finite number (got nan)")
    low_ok = value > limit.low if limit.low_open else value >= limit.low  # exact even for huge ints
    if not (low_ok and value <= limit.high):
        note = f"; {limit.note}" if limit.note else ""
        raise InputError(f"{name} must be {limit.describe()} (got {_show(value)}{note})")


def _show(value: Any, limit: int = 40) -> str:
    """A short repr for a message: huge ints by their size (str() refuses past 4300 digits), long text cut."""
    if isinstance(value, numbers.Integral) and abs(int(value)).bit_length() > 64:
        return f"an integer of {abs(int(value)).bit_length()} bits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
