"""Files the app writes: one private, bounded temp folder per process (the saved-voice library: omni_tts.voices).

Owns: the process's output folder (made with `tempfile.mkdtemp`, so never a fixed shared name another
user could plant; oldest files removed past a count or size limit; removed at exit), the names of
the files in it, and the folder Gradio caches served files in (inside the private folder, so it goes
with it). Knows nothing about Gradio's components or the engine.
"""

from __future__ import annotations

import atexit
import csv
import io
import os
import re
import secrets
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from omni_tts import voices

MAX_FILES = 400  # output files kept per process before the oldest go
MAX_BYTES = 512 << 20  # and the most bytes they may hold together


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
# the library lives in omni_tts.voices (the API serves it too); these names keep the page's calls short
data_dir, voices_dir, voice_name = voices.data_dir, voices.voices_dir, voices.voice_name
saved_voices, voice_path = voices.saved_voices, voices.voice_path
