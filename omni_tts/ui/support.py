"""Pure-Python helpers for the app: the synthesis form, access to engine-wide actions, environment,
and the listening test's comparisons.

Owns: the form's field names and how its values become a SynthesisParams (one message naming the
field for a value that is not a number), which task shows the instruct box, the admin policy for
engine-wide actions (mode switches, load tests), the bind address (local vs a Hugging Face Space),
ZeroGPU / ffmpeg detection, the code-matrix verdict of the listening test and the A/B/X tally.
Knows nothing about Gradio or device math.
"""

from __future__ import annotations

import hmac
import math
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from omni_tts.config import EMPTY_TEXT, SynthesisParams
from omni_tts.errors import InputError
from omni_tts.models import stretch
from omni_tts.ui import files
from omni_tts.ui.formatting import MODES  # noqa: F401  (re-exported: the mode order of every control)

ZERO_GPU_MODES = ("eager",)  # ZeroGPU runs the plain reference path inside each GPU call
TASK_LABELS = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign", "voice_clone": "Base (voice clone)"}
TASK_IDS = {label: task for task, label in TASK_LABELS.items()}
ADMIN_ENV = "OMNI_TTS_ADMIN_TOKEN"
# The synthesis form's fields, in the order the layout passes them to the handlers.
FORM_FIELDS = ("text", "task", "speaker", "language", "instruct", "mode", "temperature", "top_k", "top_p", "rep",
               "seed", "max_len", "ref_audio", "ref_text", "xvec_only", "saved_voice", "voice_file", "speed")
FORM_DEFAULTS: dict[str, Any] = {"text": "", "task": "custom_voice", "speaker": None, "language": "auto",
                                 "instruct": "", "mode": "", "temperature": None, "top_k": None, "top_p": None,
                                 "rep": None, "seed": -1, "max_len": None, "ref_audio": None, "ref_text": "",
                                 "xvec_only": False, "saved_voice": "", "voice_file": None, "speed": 1.0}


def form(**values: Any) -> dict[str, Any]:
    """A complete form: FORM_DEFAULTS overridden by `values` (unknown names are an error)."""
    unknown = set(values) - set(FORM_FIELDS)
    if unknown:
        raise TypeError(f"unknown form field(s): {sorted(unknown)}")
    return {**FORM_DEFAULTS, **values}


@dataclass(frozen=True)
class AdminPolicy:
    """Who may run engine-wide actions. With a token set (env OMNI_TTS_ADMIN_TOKEN): whoever gives it.
    Without one: anyone on a private server (loopback, no share link), nobody on a public one."""

    token: str = ""
    public: bool = False

    @classmethod
    def from_env(cls, host: str, share: bool, env: Mapping[str, str] = os.environ) -> AdminPolicy:
        loopback = host in ("127.0.0.1", "localhost", "::1")
        return cls(token=env.get(ADMIN_ENV, ""), public=share or not loopback or bool(env.get("SPACE_ID")))

    def check(self, given: str | None, what: str) -> None:
        """Raise InputError naming the Admin token field unless `what` is allowed for this caller."""
        if self.token:
            if not hmac.compare_digest(str(given or "").encode(), self.token.encode()):
                raise InputError(f"{what} changes the engine for every visitor: enter the Admin token "
                                 f"(set by {ADMIN_ENV} on the server)")
        elif self.public:
            raise InputError(f"{what} is off on a public server: start it with {ADMIN_ENV}=<token> and enter "
                             f"that token in Admin token")

    @property
    def asks_token(self) -> bool:
        return bool(self.token)


LOCAL = AdminPolicy()  # a private server without a token: engine-wide actions open


# ------------------------------------------------------------------ environment
def bind_address(host: str | None, port: int | None, env: Mapping[str, str] = os.environ) -> tuple[str, int]:
    """Explicit --host/--port win; on a Space (SPACE_ID / PORT / GRADIO_SERVER_PORT) 0.0.0.0 and its
    port; else 127.0.0.1:7860."""
    env_port = env.get("PORT") or env.get("GRADIO_SERVER_PORT")
    on_space = bool(env.get("SPACE_ID") or env_port)
    h = host or env.get("GRADIO_SERVER_NAME") or ("0.0.0.0" if on_space else "127.0.0.1")
    p = port if port is not None else int(env_port) if env_port else 7860
    return h, p


def zero_gpu() -> bool:
    """True on Hugging Face ZeroGPU hardware (the `spaces` package importable and ZeroGPU on)."""
    try:
        import spaces  # type: ignore[import-not-found]
    except Exception:
        return False
    cfg = getattr(getattr(spaces, "config", None), "Config", None)
    flag = getattr(cfg, "zero_gpu", None)
    if flag is None:
        flag = os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "true")
    return bool(flag)


def streaming_playback_supported() -> bool:
    """Gradio encodes streamed audio with ffmpeg; without it the clip plays when finished."""
    return shutil.which("ffmpeg") is not None


# ------------------------------------------------------------------ requests
def instruct_visible(info: Mapping[str, Any], task_label: str) -> bool:
    """Whether the instruct box applies to a task (label or id): voice_design, or custom_voice if supported."""
    task = TASK_IDS.get(task_label, task_label)
    return task == "voice_design" or (task == "custom_voice" and info["instruct"])


def voice_prompt(engine: Any, f: Mapping[str, Any]) -> Any:
    """The VoicePrompt of a voice-clone form: an uploaded voice file, a saved voice, or one made from the
    reference audio with the engine's own encoders."""
    from omni_tts.models import speaker

    if f.get("voice_file"):
        return speaker.VoicePrompt.load(f["voice_file"])
    if f.get("saved_voice"):
        path = files.voice_path(f["saved_voice"])
        if not path.is_file():
            raise InputError(f"Saved voice '{f['saved_voice']}' is not in the voice library any more")
        return speaker.VoicePrompt.load(path)
    if f.get("ref_audio") is None:
        raise InputError("Reference audio is empty: upload or record a clip, or pick a saved voice")
    return engine.voice_prompt(f["ref_audio"], (f.get("ref_text") or "").strip() or None, bool(f.get("xvec_only")))


def number(f: Mapping[str, Any], key: str, label: str, kind: type = float) -> Any:
    """A form number as int or float (None when empty); not a finite number -> InputError naming `label`."""
    v = f.get(key)
    if v is None or v == "":
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise InputError(f"{label} must be a number (got {v!r})") from None
    if not math.isfinite(x):
        raise InputError(f"{label} must be a finite number (got {v!r})")
    if kind is int:
        if x != int(x):
            raise InputError(f"{label} must be a whole number (got {v!r})")
        return int(x)
    return x


def speed(f: Mapping[str, Any]) -> float:
    """The form's Speed (1 when empty); not a number from 0.25 to 4 -> InputError naming Speed."""
    v = f.get("speed")
    return stretch.check_speed(1.0 if v is None or v == "" else v, "Speed")


def speed_notice(speed: float) -> str:
    """What the page says while a request at `speed` runs ('' at speed 1: it streams as made)."""
    if speed == 1.0:
        return ""
    return f"Speed {speed:g}x: the clip plays when it is complete (speed needs the whole clip)"


# What a number's error message calls each field: the form's labels, or the /synthesize API's parameter names.
FORM_NAMES = {"seed": "Seed", "temperature": "Temperature", "top_k": "Top-k", "top_p": "Top-p",
              "rep": "Repetition penalty", "max_len": "Max length"}
API_NAMES = {"seed": "seed", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
             "rep": "repetition_penalty", "max_len": "max_new_tokens"}


def _max_new_tokens(f: Mapping[str, Any], names: Mapping[str, str]) -> int | None:
    """The form's Max length counts frames, the API's max_new_tokens the model's tokens (frames + 1)."""
    n = number(f, "max_len", names["max_len"], int)
    if n is None or names is not FORM_NAMES:
        return n
    if n < 1:
        raise InputError(f"Max length must be at least 1 frame (got {n})")
    return n + 1


def make_params(engine: Any, f: Mapping[str, Any], info: Mapping[str, Any] | None = None,
                names: Mapping[str, str] = FORM_NAMES) -> SynthesisParams:
    """The request a form describes (Seed below 0 or empty: random). With `names` = API_NAMES, `max_len`
    is max_new_tokens and errors name the API's parameters."""
    task = TASK_IDS.get(f.get("task") or "", f.get("task") or "custom_voice")
    if not str(f.get("text") or "").strip():  # said before a reference clip is asked for or encoded
        raise InputError(EMPTY_TEXT)
    voice = voice_prompt(engine, f) if task == "voice_clone" else None
    seed = number(f, "seed", names["seed"], int)
    instruct = (f.get("instruct") or "").strip() or None
    if info is not None and not instruct_visible(info, task):
        instruct = None  # the box is hidden for this task or checkpoint
    return SynthesisParams(
        text=f.get("text") or "", task=task, speaker=f.get("speaker") if task == "custom_voice" else None,
        language=f.get("language") or "auto", instruct=instruct,
        temperature=number(f, "temperature", names["temperature"]), top_k=number(f, "top_k", names["top_k"], int),
        top_p=number(f, "top_p", names["top_p"]), repetition_penalty=number(f, "rep", names["rep"]),
        max_new_tokens=_max_new_tokens(f, names), seed=None if seed is None or seed < 0 else seed, voice=voice)


# ------------------------------------------------------------------ listening test
def compare_codes(a: np.ndarray, b: np.ndarray) -> tuple[bool, int | None]:
    """(identical, first differing frame). Different lengths differ at the shorter length."""
    a, b = np.asarray(a), np.asarray(b)
    n = min(len(a), len(b))
    rows = np.nonzero((a[:n] != b[:n]).reshape(n, -1).any(axis=1))[0] if n else np.zeros(0, int)
    if rows.size:
        return False, int(rows[0])
    if len(a) != len(b):
        return False, n
    return True, None


def verdict_text(mode_a: str, mode_b: str, a: np.ndarray, b: np.ndarray) -> str:
    same, frame = compare_codes(a, b)
    if same:
        return f"`{mode_a}` vs `{mode_b}`: code matrices **identical** ({len(a)} frames)"
    return (f"`{mode_a}` vs `{mode_b}`: code matrices **differ** (first differing frame {frame}; "
            f"{len(a)} vs {len(b)} frames)")


def abx_record(tally: dict[str, Any], guess: str) -> tuple[dict[str, Any], str]:
    """Score a guess ('A' or 'B') against tally['x_is']; returns the new tally and a line for the user."""
    if tally.get("x_is") not in ("A", "B"):
        return tally, "run the listening test first (A/B/X needs two clips)"
    right = guess == tally["x_is"]
    new = dict(tally, trials=tally.get("trials", 0) + 1, correct=tally.get("correct", 0) + int(right))
    line = (f"{'Right' if right else 'Wrong'}: X was {tally['x_is']}. Session tally: "
            f"{new['correct']} / {new['trials']} correct")
    return new, line
