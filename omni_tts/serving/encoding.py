"""Audio as the speech route sends it: whole clips in wav, pcm (16-bit little-endian mono at the model's
rate), flac, mp3 and opus through libsndfile, aac through ffmpeg when installed; the header of a streamed
wav. Knows nothing about HTTP beyond the media types.
"""

from __future__ import annotations

import io
import shutil
import struct
import subprocess

import numpy as np
import soundfile as sf

from omni_tts.serving.errors import ApiError
from omni_tts.ui import files

MEDIA = {"wav": "audio/wav", "pcm": "audio/L16", "flac": "audio/flac", "mp3": "audio/mpeg", "opus": "audio/ogg",
         "aac": "audio/aac"}
STREAMABLE = ("pcm", "wav")


def pcm_bytes(samples: np.ndarray) -> bytes:
    return files.pcm16(samples).astype("<i2").tobytes()


def wav_stream_header(sample_rate: int) -> bytes:
    """A 16-bit mono wav header whose sizes say 'unknown length' (0xFFFFFFFF), for streamed wav."""
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate,
                                                                               2 * sample_rate, 2, 16)
            + b"data" + struct.pack("<I", 0xFFFFFFFF))


def encode(wav: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """The whole clip in `fmt` (ApiError 400 naming response_format when this server cannot make it)."""
    pcm = files.pcm16(wav)
    if fmt == "pcm":
        return pcm.astype("<i2").tobytes()
    if fmt == "aac":
        return _ffmpeg_aac(pcm, sample_rate)
    buf = io.BytesIO()
    kind = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"),
            "opus": ("OGG", "OPUS")}[fmt]
    try:
        sf.write(buf, pcm, sample_rate, format=kind[0], subtype=kind[1])
    except (sf.LibsndfileError, TypeError, ValueError) as e:
        raise ApiError(400, f"response_format '{fmt}' is not available on this server ({e})",
                       "response_format") from None
    return buf.getvalue()


def _ffmpeg_aac(pcm: np.ndarray, sample_rate: int) -> bytes:
    exe = shutil.which("ffmpeg")
    if exe is None:
        raise ApiError(400, "response_format 'aac' needs ffmpeg, which is not installed on this server; "
                            "use wav, pcm, flac, mp3 or opus", "response_format")
    cmd = [exe, "-loglevel", "error", "-f", "s16le", "-ar", str(sample_rate), "-ac", "1", "-i", "pipe:0",
           "-c:a", "aac", "-f", "adts", "pipe:1"]
    done = subprocess.run(cmd, input=pcm.astype("<i2").tobytes(), capture_output=True, timeout=120)
    if done.returncode != 0:
        raise ApiError(500, f"aac encoding failed: {done.stderr.decode(errors='replace').strip()[:200]}",
                       "response_format", "server_error")
    return done.stdout
