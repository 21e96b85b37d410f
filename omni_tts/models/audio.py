"""Reference-audio intake for voice cloning: decode, validate, mono-mix, resample to 24 kHz.

Owns: reading any file libsndfile reads (wav, flac, ogg, ...) or an in-memory (array, sample_rate)
pair; the limits (file size, duration, silence, NaN/inf) with one-line `InputError` messages; mono
mixing (mean over channels, as the official code does); and a band-limited resampler of our own
(Kaiser-windowed sinc, evaluated per output phase). The official code resamples with
librosa/soxr_hq; ours is a different high-quality filter, so resampled audio is close to, not
bit-identical with, the official one. 24 kHz input is passed through untouched.

Does not know: the encoders that consume the waveform, or anything about models.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from omni_tts.errors import InputError

TARGET_SR = 24000

AudioSource = str | os.PathLike | tuple  # a path, or (array, sample_rate) / (sample_rate, array)


@dataclass(frozen=True)
class AudioLimits:
    """Acceptance limits for a reference clip."""

    min_seconds: float = 1.0
    max_seconds: float = 30.0
    max_file_bytes: int = 50 * 1024 * 1024
    silence_peak: float = 1e-4  # a clip whose |peak| is below this (-80 dBFS) counts as silent
    min_sample_rate: int = 8000  # below this the clip lacks most of the band the encoders look at
    max_sample_rate: int = 384000  # the highest rate audio hardware records; above it resampling cost explodes


def _read_file(path: Path, limits: AudioLimits) -> tuple[np.ndarray, int]:
    if not path.exists():
        raise InputError(f"reference audio {path}: file not found")
    if not path.is_file():
        raise InputError(f"reference audio {path}: not a file")
    size = path.stat().st_size
    if size == 0:
        raise InputError(f"reference audio {path}: the file is empty")
    if size > limits.max_file_bytes:
        raise InputError(f"reference audio {path}: file is {size / 2**20:.1f} MB, above the "
                         f"{limits.max_file_bytes / 2**20:.0f} MB limit")
    try:
        info = sf.info(str(path))  # header only: refuse long (compressed) files before decoding them
        if info.samplerate > 0 and info.frames / info.samplerate > limits.max_seconds:
            raise InputError(f"reference audio {path}: {info.frames / info.samplerate:.1f} s is too long "
                             f"(limit {limits.max_seconds:g} s); trim it")
        data, sr = sf.read(str(path), dtype="float32", always_2d=True)  # [N, C]
    except InputError:
        raise
    except Exception as e:  # libsndfile raises several types for non-audio / corrupt input
        first = (str(e).splitlines() or [type(e).__name__])[0][:120]
        raise InputError(f"reference audio {path}: not a readable audio file ({first})") from None
    return data, int(sr)


def _as_array(x: object) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    try:
        arr = np.asarray(x)
    except (ValueError, TypeError) as e:  # ragged nested lists, objects numpy cannot hold
        raise InputError(f"reference audio: not an array of samples ({str(e).splitlines()[0][:80]})") from None
    if arr.dtype.kind == "i":  # PCM integers (e.g. Gradio's int16): scale to [-1, 1)
        arr = arr.astype(np.float32) / float(2 ** (8 * arr.dtype.itemsize - 1))
    elif arr.dtype.kind == "u":
        half = float(2 ** (8 * arr.dtype.itemsize - 1))
        arr = (arr.astype(np.float32) - half) / half
    elif arr.dtype.kind != "f":
        raise InputError(f"reference audio: expected numeric samples, got dtype {arr.dtype}")
    return arr


def _from_memory(source: tuple) -> tuple[np.ndarray, int]:
    """(array, sr) or (sr, array) -> (float array, sr)."""
    if len(source) != 2:
        raise InputError("reference audio: pass a file path or an (array, sample_rate) pair")
    a, b = source
    if isinstance(a, (int, np.integer)) and not isinstance(b, (int, np.integer)):
        a, b = b, a  # Gradio order: (sample_rate, array)
    if not isinstance(b, (int, np.integer)) or isinstance(b, bool) or int(b) <= 0:
        raise InputError(f"reference audio: the sample rate must be a positive integer, got {b!r}")
    return _as_array(a), int(b)


def _to_mono(data: np.ndarray) -> np.ndarray:
    """[N] or [N, C] (soundfile layout; [C, N] with C <= 8 < N also accepted) -> float32 [N]."""
    if data.ndim == 1:
        return data.astype(np.float32, copy=False)
    if data.ndim != 2:
        raise InputError(f"reference audio: expected [samples] or [samples, channels], got shape {data.shape}")
    if data.shape[1] > 8 >= data.shape[0]:
        data = data.T  # channels-first input
    return np.mean(data, axis=-1).astype(np.float32)


def _kernel_rows(frac: torch.Tensor, taps: int, half: int, cutoff: float, beta: float) -> torch.Tensor:
    """Filter weights for output samples at fractional offsets `frac` (in input samples, 0 <= frac < 1).

    Row r holds the weights of input samples floor(t) - half + 1 + k, k < taps, for t = base + frac[r].
    Windowed sinc with cut-off `cutoff` (cycles per input sample); each row is normalised to unit sum.
    """
    k = torch.arange(taps, dtype=torch.float64)
    dist = frac[:, None] + (half - 1) - k  # [R, taps]: time from each tap to the output sample
    inside = torch.clamp(1.0 - (dist / half) ** 2, min=0.0)  # Kaiser window support: |dist| < half
    win = torch.special.i0(beta * torch.sqrt(inside)) / torch.special.i0(torch.tensor(beta, dtype=torch.float64))
    rows = 2 * cutoff * torch.sinc(2 * cutoff * dist) * win * (dist.abs() < half)
    return rows / rows.sum(dim=1, keepdim=True)


def resample(wav: np.ndarray, sr_in: int, sr_out: int = TARGET_SR, *, zeros: int = 32, beta: float = 12.0,
             rolloff: float = 0.945) -> np.ndarray:
    """Band-limited resampling of a 1-D float signal; returns ceil(N * sr_out / sr_in) samples.

    Each output sample j sits at t = j * sr_in / sr_out input samples; it is the sum of the input
    around t weighted by a Kaiser-windowed sinc low-passed at rolloff * min(sr_in, sr_out) / 2, with
    `zeros` sinc zero-crossings on each side (stop band below -110 dB). With up/down the gcd-reduced
    rate ratio, there are `up` distinct filter phases: few -> one strided conv1d (polyphase);
    many (odd rates) -> phases rounded to 1/4096 sample and the taps gathered.
    """
    if sr_in == sr_out:
        return wav.astype(np.float32, copy=False)
    g = math.gcd(sr_in, sr_out)
    up, down = sr_out // g, sr_in // g
    cutoff = 0.5 * rolloff * min(1.0, up / down)  # cycles per input sample
    half = int(math.ceil(zeros / (2 * cutoff)))  # taps either side, in input samples
    n_out = -(-wav.shape[0] * up // down)
    x = torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32))
    x = torch.nn.functional.pad(x, (half - 1, half + down + 1))  # zeros beyond both ends; x[0] at index half-1
    if up <= 1024:
        y = _polyphase(x, up, down, half, cutoff, beta, n_out)
    else:
        y = _gathered(x, up, down, half, cutoff, beta, n_out)
    return y.numpy().astype(np.float32, copy=False)


def _polyphase(x: torch.Tensor, up: int, down: int, half: int, cutoff: float, beta: float,
               n_out: int) -> torch.Tensor:
    """Output j = q * up + p reads input floor(j * down / up) - half + 1 + k = q * down + off_p + (k - half + 1)."""
    phases = torch.arange(up, dtype=torch.int64)
    rows = _kernel_rows((phases * down % up).double() / up, 2 * half, half, cutoff, beta)  # [up, taps]
    offsets = phases * down // up  # [up], each < down
    weight = torch.zeros(up, 1, 2 * half + down, dtype=torch.float64)
    for p in range(up):
        weight[p, 0, offsets[p]: offsets[p] + 2 * half] = rows[p]
    n_q = -(-n_out // up)
    y = torch.nn.functional.conv1d(x[None, None], weight.float(), stride=down)[0]  # [up, Q']
    return y[:, :n_q].T.reshape(-1)[:n_out]  # interleave phases -> [n_out]


def _gathered(x: torch.Tensor, up: int, down: int, half: int, cutoff: float, beta: float,
              n_out: int) -> torch.Tensor:
    steps = 4096
    table = _kernel_rows(torch.arange(steps + 1, dtype=torch.float64) / steps, 2 * half, half, cutoff, beta).float()
    out = torch.empty(n_out, dtype=torch.float32)
    chunk = max(1, (1 << 22) // (2 * half))
    for start in range(0, n_out, chunk):
        j = torch.arange(start, min(n_out, start + chunk), dtype=torch.int64)
        base = j * down // up  # floor(t)
        step = (j * down % up * steps + up // 2) // up  # fractional part rounded to 1/steps
        idx = base[:, None] + torch.arange(2 * half)[None, :]  # padded index of floor(t) - half + 1 + k
        out[start:start + j.numel()] = (x[idx] * table[step]).sum(dim=1)  # [chunk]
    return out


def load_reference_audio(source: AudioSource, limits: AudioLimits = AudioLimits(),
                         target_sr: int = TARGET_SR) -> torch.Tensor:
    """A path or (array, sr) pair -> validated mono FloatTensor[N] at `target_sr`.

    Raises InputError (one line) for: missing/unreadable/non-audio files, files over the size limit,
    sample rates outside the limits, empty audio, NaN/inf samples, all-silent audio, and clips
    shorter/longer than the limits.
    """
    if isinstance(source, (str, os.PathLike)):
        data, sr = _read_file(Path(source).expanduser(), limits)
        what = f"reference audio {source}"
    elif isinstance(source, (tuple, list)):
        data, sr = _from_memory(tuple(source))
        what = "reference audio"
    elif isinstance(source, (np.ndarray, torch.Tensor)):
        raise InputError("reference audio: an array needs its sample rate; pass (array, sample_rate)")
    else:
        raise InputError(f"reference audio: unsupported input type {type(source).__name__}")
    if sr < limits.min_sample_rate:
        raise InputError(f"{what}: sample rate {sr} Hz is too low (need at least {limits.min_sample_rate} Hz)")
    if sr > limits.max_sample_rate:
        raise InputError(f"{what}: sample rate {sr} Hz is too high (at most {limits.max_sample_rate} Hz)")
    wav = _to_mono(data)
    if wav.size == 0:
        raise InputError(f"{what}: the audio is empty (0 samples)")
    if not np.isfinite(wav).all():
        raise InputError(f"{what}: contains NaN or infinite samples")
    seconds = wav.size / sr
    if seconds < limits.min_seconds:
        raise InputError(f"{what}: {seconds:.2f} s is too short (need at least {limits.min_seconds:g} s)")
    if seconds > limits.max_seconds:
        raise InputError(f"{what}: {seconds:.1f} s is too long (limit {limits.max_seconds:g} s); trim it")
    if float(np.abs(wav).max()) < limits.silence_peak:
        raise InputError(f"{what}: the audio is silent (peak amplitude below {limits.silence_peak:g})")
    return torch.from_numpy(resample(wav, sr, target_sr).copy())
