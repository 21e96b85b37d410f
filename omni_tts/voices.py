"""The saved-voice library: voice-clone prompts kept on disk under a name, shared by the page and the API.

Owns: the per-user data folder (OMNI_TTS_DATA_DIR, else the platform's usual place), the library folder
inside it, voice names (sanitised into file stems that never leave the folder), each voice's
safetensors file and its JSON metadata beside it (id, name, mode, transcript, consent, when it was
made), and creating one without overwriting another of the same name. Knows nothing about the engine,
Gradio or HTTP: callers make the VoicePrompt and hand it over.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import Any

from omni_tts.errors import InputError

VOICE_SUFFIX = ".safetensors"
META_SUFFIX = ".json"
_create_lock = threading.Lock()  # a name check and the write that follows it happen as one step


class VoiceExists(InputError):
    """A voice of that name is already in the library (the API answers 409)."""


def data_dir(env: dict[str, str] | None = None) -> Path:
    """The per-user data folder (OMNI_TTS_DATA_DIR, else the platform's usual place), not created here."""
    env = dict(os.environ) if env is None else env
    if env.get("OMNI_TTS_DATA_DIR"):
        return Path(env["OMNI_TTS_DATA_DIR"]).expanduser()
    home = Path(env.get("HOME") or Path.home())
    if sys.platform == "win32":
        return Path(env.get("LOCALAPPDATA") or home / "AppData" / "Local") / "omni_tts"
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "omni_tts"
    return Path(env.get("XDG_DATA_HOME") or home / ".local" / "share") / "omni_tts"


def voices_dir() -> Path:
    d = data_dir() / "voices"
    d.mkdir(parents=True, exist_ok=True)
    return d


def voice_name(name: str) -> str:
    """A saved voice's name as a safe file stem; one clear message when nothing usable is left."""
    clean = re.sub(r"[^A-Za-z0-9_ -]+", "", (name or "").strip()).strip().replace(" ", "_")[:64]
    if not clean:
        raise InputError("Voice name is empty: give the voice a name (letters, digits, spaces)")
    return clean


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def saved_voices() -> list[str]:
    """Names of the saved voices, newest first."""
    d = data_dir() / "voices"
    found = sorted(d.glob(f"*{VOICE_SUFFIX}"), key=_mtime, reverse=True) if d.is_dir() else []
    return [_stem(p) for p in found]


def _stem(path: Path) -> str:
    """A library file's voice name."""
    return path.name[: -len(VOICE_SUFFIX)]


def voice_path(name: str) -> Path:
    """The library file of a saved voice (the name is sanitised, so it never leaves the folder); names match
    without regard to case, as `save` refuses one that differs from a saved one only in case."""
    stem = voice_name(name)
    path = voices_dir() / f"{stem}{VOICE_SUFFIX}"
    if not path.is_file():
        stem = next((v for v in saved_voices() if v.lower() == stem.lower()), stem)
    return voices_dir() / f"{stem}{VOICE_SUFFIX}"


def exists(name: str) -> bool:
    try:
        return voice_path(name).is_file()
    except InputError:
        return False


def by_name(name: Any, builtin: list[str]) -> Any:
    """The VoicePrompt a request's voice name means when it names a saved voice; None for a built-in
    speaker's name (they win) or a name the library does not hold."""
    if not isinstance(name, str) or not name.strip() or name.strip().lower() in {s.lower() for s in builtin}:
        return None
    return load(name) if exists(name) else None


def save(name: str, prompt: Any, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Keep `prompt` (a VoicePrompt) under `name` with its metadata -> the metadata as stored. A saved voice
    is never overwritten: a name that is taken, or that differs from a saved one only in case or in
    characters the sanitising drops, raises VoiceExists."""
    stem = voice_name(name)
    record = {"id": f"voice-{secrets.token_hex(6)}", "name": stem, "kind": "saved", "mode": prompt.mode,
              "ref_text": prompt.ref_text, "created_at": int(time.time()), **(meta or {})}
    with _create_lock:
        path = voice_path(stem)  # a saved voice's, whatever the case
        if path.exists():
            raise VoiceExists(f"Voice name '{stem}' is taken by a saved voice ('{_stem(path)}'): delete it "
                              f"first or pick another name")
        prompt.save(path)
        path.with_suffix(META_SUFFIX).write_text(json.dumps(record))
    return record


def describe(name: str) -> dict[str, Any]:
    """A saved voice's metadata (what a file saved before metadata existed has: name, kind, mode unknown)."""
    path = voice_path(name)
    if not path.is_file():
        raise InputError(f"Saved voice '{name}' is not in the voice library")
    try:
        record = json.loads(path.with_suffix(META_SUFFIX).read_text())
    except (OSError, ValueError):
        record = {}
    stem = _stem(path)
    return {"id": stem, "created_at": int(_mtime(path)), **record, "name": stem, "kind": "saved"}


def load(name: str) -> Any:
    """The VoicePrompt saved under `name` (InputError when there is none)."""
    from omni_tts.models.speaker import VoicePrompt

    path = voice_path(name)
    gone = InputError(f"Saved voice '{name}' is not in the voice library any more")
    if not path.is_file():
        raise gone
    try:
        return VoicePrompt.load(path)
    except InputError as e:  # deleted meanwhile, or a damaged file: named as the voice, not as a server path
        raise gone if not path.is_file() else InputError(str(e).replace(str(path), f"'{name}'")) from None


def delete(name: str) -> str | None:
    """Remove a saved voice; -> its name as it was saved, or None when there was none."""
    with _create_lock:
        path = voice_path(name)
        found = path.is_file()
        path.unlink(missing_ok=True)
        path.with_suffix(META_SUFFIX).unlink(missing_ok=True)
    return _stem(path) if found else None
