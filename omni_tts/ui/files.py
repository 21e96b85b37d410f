"""Files the app writes: one private, bounded temp folder per process, and the saved-voice library.

Owns: the process's output folder (made with `tempfile.mkdtemp`, so never a fixed shared name another
user could plant; oldest files removed past a count or size limit; removed at exit), the names of
the files in it, the user data folder that keeps saved voices across restarts, and the folder Gradio
caches served files in (inside the private folder, so it goes with it). Knows nothing about Gradio's
components or the engine.
"""

from __future__ import annotations

import atexit
import csv
import io
import os
import re
import secrets
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

MAX_FILES = 400  # output files kept per process before the oldest go
MAX_BYTES = 512 << 20  # and the most bytes they may hold together
VOICE_SUFFIX = ".safetensors"


class OutDir:
    """A private folder for this process's outputs, pruned oldest-first, removed at exit."""

    def __init__(self, max_files: int = MAX_FILES, max_bytes: int = MAX_BYTES, parent: str | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="omni-tts-", dir=parent))  # mode 0700, unpredictable name
        self.max_files, self.max_bytes = max_files, max_bytes
        self._lock = threading.Lock()
        atexit.register(self.remove)

    def new(self, stem: str, suffix: str) -> Path:
        """A fresh, unguessable file name in the folder (pruning old files first)."""
        self.prune(reserve=1)
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-") or "file"
        return self.path / f"{safe}-{secrets.token_hex(6)}{suffix}"

    def prune(self, reserve: int = 0) -> list[Path]:
        """Remove the oldest files until at most max_files - reserve remain within max_bytes."""
        with self._lock:
            files = sorted((p for p in self.path.glob("*") if p.is_file()), key=_mtime)
            total, removed = sum(_size(p) for p in files), []
            while files and (len(files) > self.max_files - reserve or total > self.max_bytes):
                victim = files.pop(0)
                total -= _size(victim)
                victim.unlink(missing_ok=True)
                removed.append(victim)
            return removed

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


_out: OutDir | None = None
_out_lock = threading.Lock()


def out_dir() -> OutDir:
    """The process's output folder, made on first use."""
    global _out
    with _out_lock:
        if _out is None:
            _out = OutDir()
        return _out


def use_private_gradio_cache() -> Path:
    """Point Gradio's file cache into the private folder (set before the app is launched), so served
    copies are removed with it at exit instead of piling up in a shared /tmp/gradio."""
    cache = out_dir().path / "gradio-cache"
    cache.mkdir(exist_ok=True)
    os.environ["GRADIO_TEMP_DIR"] = str(cache)
    return cache


# ------------------------------------------------------------------ writers
def pcm16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(np.asarray(samples, np.float32), -1.0, 1.0) * 32767.0).astype(np.int16)


def wav_bytes(samples: np.ndarray, sample_rate: int) -> bytes:
    """A 16-bit PCM wav of `samples` in memory."""
    buf = io.BytesIO()
    sf.write(buf, pcm16(samples), sample_rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def write_wav(samples: np.ndarray, sample_rate: int, stem: str = "omni-tts") -> str:
    path = out_dir().new(stem, ".wav")
    sf.write(path, np.asarray(samples, np.float32), sample_rate, subtype="PCM_16")
    return str(path)


def write_csv(rows: list[dict[str, Any]], stem: str) -> str:
    """A CSV of `rows`; a 'file' column keeps only the file's name (no server paths in exports)."""
    path = out_dir().new(stem, ".csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["empty"])
        w.writeheader()
        w.writerows({k: Path(v).name if k == "file" and v else v for k, v in r.items()} for r in rows)
    return str(path)


def copy_out(src: str, stem: str) -> str:
    dst = out_dir().new(stem, Path(src).suffix)
    shutil.copyfile(src, dst)
    return str(dst)


# ------------------------------------------------------------------ saved voices
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
    from omni_tts.errors import InputError

    clean = re.sub(r"[^A-Za-z0-9_ -]+", "", (name or "").strip()).strip().replace(" ", "_")[:64]
    if not clean:
        raise InputError("Voice name is empty: give the voice a name (letters, digits, spaces)")
    return clean


def saved_voices() -> list[str]:
    """Names of the saved voices, newest first."""
    d = data_dir() / "voices"
    files = sorted(d.glob(f"*{VOICE_SUFFIX}"), key=_mtime, reverse=True) if d.is_dir() else []
    return [p.name[: -len(VOICE_SUFFIX)] for p in files]


def voice_path(name: str) -> Path:
    """The library file of a saved voice (the name is sanitised, so it never leaves the folder)."""
    return voices_dir() / f"{voice_name(name)}{VOICE_SUFFIX}"


def reserve_voice(name: str) -> Path:
    """A new library file for a voice called `name`, created empty (claimed, so two saves at once cannot
    both take it); a name that is taken, or that differs from a saved one only in case or in characters
    the sanitising drops, is refused: a saved voice is never overwritten."""
    from omni_tts.errors import InputError

    stem = voice_name(name)
    taken = next((v for v in saved_voices() if v.lower() == stem.lower()), None)
    path = voice_path(stem)
    try:
        if taken is not None:
            raise FileExistsError
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        raise InputError(f"Voice name '{stem}' is taken by a saved voice ('{taken or stem}'): pick another "
                         f"name") from None
    return path
