"""Voice-clone conditioning: the speaker encoder (x-vector), its mel front end, and `VoicePrompt`.

Owns: `SpeakerEncoder`, an ECAPA-TDNN (TDNN -> SE-Res2Net blocks -> multi-layer aggregation ->
attentive statistics pooling -> linear) whose sizes come from `config.json`'s `speaker_encoder_config`
and whose `speaker_encoder.*` tensors load strictly; the log-mel spectrogram it consumes (slaney mel
filterbank built here, numerically identical to librosa's); the `VoicePrompt` record (reference
codes + x-vector + reference text), saved/loaded as safetensors; and `create_voice_prompt`, which
runs both encoders on one reference clip.

Does not know: how the talker consumes a prompt, how audio files are decoded/resampled
(omni_tts/audio.py), or the codec encoder's internals (omni_tts/codec_encoder.py). Runs in float32.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from omni_tts.errors import CheckpointError, InputError
from omni_tts.limits import MAX_TEXT_CHARS, check_text
from omni_tts.models.audio import AudioLimits, AudioSource, load_reference_audio
from omni_tts.models.checkpoint import Checkpoint
from omni_tts.models.codec.encoder import CodecEncoder
from omni_tts.models.layers import load_prefixed_state

# The official front end hard-codes these (24 kHz, 1024-point STFT, hop 256, 128 mels, 0-12 kHz).
MEL_SAMPLE_RATE = 24000
MEL_N_FFT = 1024
MEL_HOP = 256
MEL_BINS = 128
MEL_FMIN = 0.0
MEL_FMAX = 12000.0

_DEFAULTS = {"mel_dim": 128, "enc_dim": 1024, "enc_channels": [512, 512, 512, 512, 1536],
             "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1],
             "enc_attention_channels": 128, "enc_res2net_scale": 8, "enc_se_channels": 128,
             "sample_rate": 24000}


def _hz_to_slaney_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear (200/3 Hz per mel) below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    mel = hz / (200.0 / 3)
    log_region = hz >= 1000.0
    mel[log_region] = 15.0 + np.log(hz[log_region] / 1000.0) / (np.log(6.4) / 27.0)
    return mel


def _slaney_mel_to_hz(mel: np.ndarray) -> np.ndarray:
    hz = (200.0 / 3) * mel
    log_region = mel >= 15.0
    hz[log_region] = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel[log_region] - 15.0))
    return hz


@lru_cache(maxsize=4)
def slaney_mel_filterbank(sr: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> torch.Tensor:
    """Triangular mel filters with slaney area normalisation: FloatTensor[n_mels, n_fft // 2 + 1].

    Computed in float64 and rounded to float32 at the same two points as librosa.filters.mel (after the
    triangle and after the normalisation), so the result is bit-identical to it.
    """
    bin_hz = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)  # [F]
    edges_mel = np.linspace(_hz_to_slaney_mel(np.array([fmin]))[0], _hz_to_slaney_mel(np.array([fmax]))[0],
                            n_mels + 2)
    edges_hz = _slaney_mel_to_hz(edges_mel)  # [n_mels + 2]
    widths = np.diff(edges_hz)
    offsets = edges_hz[:, None] - bin_hz[None, :]  # [n_mels + 2, F]
    bank = np.zeros((n_mels, bin_hz.size), dtype=np.float32)
    for m in range(n_mels):
        rising = -offsets[m] / widths[m]
        falling = offsets[m + 2] / widths[m + 1]
        bank[m] = np.maximum(0.0, np.minimum(rising, falling))
    area = 2.0 / (edges_hz[2:] - edges_hz[:-2])  # [n_mels]
    bank = (bank.astype(np.float64) * area[:, None]).astype(np.float32)
    return torch.from_numpy(bank)


def log_mel_spectrogram(wav: torch.Tensor) -> torch.Tensor:
    """wav: FloatTensor[B, N] at 24 kHz -> natural-log mel magnitudes FloatTensor[B, 128, frames].

    Reflect-pads (n_fft - hop) / 2 on both sides, un-centred periodic-Hann STFT, magnitude with a
    1e-9 floor inside the square root, slaney mel projection, log with values clamped at 1e-5.
    """
    bank = slaney_mel_filterbank(MEL_SAMPLE_RATE, MEL_N_FFT, MEL_BINS, MEL_FMIN, MEL_FMAX).to(wav.device)
    side = (MEL_N_FFT - MEL_HOP) // 2
    if wav.shape[-1] <= side:
        raise InputError("reference audio is too short for the speaker encoder")
    x = F.pad(wav[:, None, :], (side, side), mode="reflect")[:, 0]  # [B, N + 2 * side]
    spec = torch.stft(x, MEL_N_FFT, hop_length=MEL_HOP, win_length=MEL_N_FFT,
                      window=torch.hann_window(MEL_N_FFT, device=wav.device), center=False,
                      normalized=False, onesided=True, return_complex=True)  # [B, F, frames]
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)  # [B, F, frames]
    return torch.log(torch.clamp(torch.matmul(bank, mag), min=1e-5))  # [B, n_mels, frames]


class _Tdnn(nn.Module):
    """Conv1d ('same' length, reflect padding) + ReLU."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, dilation=dilation, padding="same", padding_mode="reflect")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, T]
        return torch.relu(self.conv(x))


class _Res2Net(nn.Module):
    """Split channels into `scale` groups; group i > 0 is convolved after adding group i-1's output."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        self.scale = scale
        width = channels // scale
        self.blocks = nn.ModuleList([_Tdnn(width, width, kernel, dilation) for _ in range(scale - 1)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, T]
        groups = torch.chunk(x, self.scale, dim=1)
        outs = [groups[0]]
        carry = None
        for conv, g in zip(self.blocks, groups[1:]):
            carry = conv(g if carry is None else g + carry)
            outs.append(carry)
        return torch.cat(outs, dim=1)


class _SqueezeExcite(nn.Module):
    def __init__(self, channels: int, bottleneck: int):
        super().__init__()
        self.conv1 = nn.Conv1d(channels, bottleneck, 1)
        self.conv2 = nn.Conv1d(bottleneck, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, T]
        gate = torch.sigmoid(self.conv2(torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))))  # [B, C, 1]
        return x * gate


class _SeRes2Block(nn.Module):
    def __init__(self, c_in: int, c_out: int, scale: int, se: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = _Tdnn(c_in, c_out, 1, 1)
        self.res2net_block = _Res2Net(c_out, scale, kernel, dilation)
        self.tdnn2 = _Tdnn(c_out, c_out, 1, 1)
        self.se_block = _SqueezeExcite(c_out, se)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, T]
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


def _weighted_stats(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std over time with weights w (summing to 1 over T). x, w: [B, C, T] -> 2 x [B, C]."""
    mean = (w * x).sum(dim=2)
    var = (w * (x - mean[:, :, None]).pow(2)).sum(dim=2)
    return mean, torch.sqrt(var.clamp(min=1e-12))


class _AttentiveStatsPool(nn.Module):
    """Per-channel attention over time, conditioned on the clip's global mean/std; returns [mean, std]."""

    def __init__(self, channels: int, attention: int):
        super().__init__()
        self.tdnn = _Tdnn(3 * channels, attention, 1, 1)
        self.conv = nn.Conv1d(attention, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, T] -> [B, 2C, 1]
        t = x.shape[2]
        uniform = torch.full((x.shape[0], 1, t), 1.0 / t, dtype=x.dtype, device=x.device)  # [B, 1, T]
        mean, std = _weighted_stats(x, uniform)
        context = torch.cat([x, mean[:, :, None].expand(-1, -1, t), std[:, :, None].expand(-1, -1, t)], dim=1)
        logits = self.conv(torch.tanh(self.tdnn(context)))  # [B, C, T]
        mean, std = _weighted_stats(x, torch.softmax(logits, dim=2))
        return torch.cat([mean, std], dim=1)[:, :, None]


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN x-vector extractor. Submodule names mirror the stored `speaker_encoder.*` tensors."""

    def __init__(self, cfg: dict[str, Any], source: str = "config.json"):
        super().__init__()
        c = {**_DEFAULTS, **cfg}
        ch, ks, dil = list(c["enc_channels"]), list(c["enc_kernel_sizes"]), list(c["enc_dilations"])
        if not len(ch) == len(ks) == len(dil) or len(ch) < 3:
            raise CheckpointError(f"{source}: speaker_encoder_config enc_channels/enc_kernel_sizes/enc_dilations "
                                  f"must have the same length (>= 3)")
        if int(c["mel_dim"]) != MEL_BINS or int(c["sample_rate"]) != MEL_SAMPLE_RATE:
            raise CheckpointError(f"{source}: speaker_encoder_config needs mel_dim {MEL_BINS} at "
                                  f"{MEL_SAMPLE_RATE} Hz (got {c['mel_dim']} at {c['sample_rate']} Hz)")
        self.sample_rate = MEL_SAMPLE_RATE
        self.dim = int(c["enc_dim"])
        blocks: list[nn.Module] = [_Tdnn(MEL_BINS, ch[0], ks[0], dil[0])]
        for i in range(1, len(ch) - 1):
            blocks.append(_SeRes2Block(ch[i - 1], ch[i], c["enc_res2net_scale"], c["enc_se_channels"], ks[i], dil[i]))
        self.blocks = nn.ModuleList(blocks)
        self.mfa = _Tdnn(sum(ch[1:-1]), ch[-1], ks[-1], dil[-1])
        self.asp = _AttentiveStatsPool(ch[-1], c["enc_attention_channels"])
        self.fc = nn.Conv1d(2 * ch[-1], self.dim, 1)

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint) -> SpeakerEncoder:
        """Build from `config.json`'s speaker_encoder_config; load `speaker_encoder.*` strictly."""
        cfg_file = str(ckpt.path / "config.json")
        cfg = ckpt.config.get("speaker_encoder_config")
        if not isinstance(cfg, dict) or not any(k.startswith("speaker_encoder.") for k in ckpt.weights):
            raise CheckpointError(f"{ckpt.path}: no speaker encoder (tts_model_type "
                                  f"'{ckpt.config.get('tts_model_type')}'); voice cloning needs a Base checkpoint")
        model = cls(cfg, source=cfg_file)
        load_prefixed_state(model, ckpt.weights, "speaker_encoder.", str(ckpt.path / "model.safetensors"))
        return model.eval()

    def forward(self, mels: torch.Tensor) -> torch.Tensor:  # mels: [B, 128, T] -> [B, enc_dim]
        h = mels
        outs = []
        for block in self.blocks:
            h = block(h)  # [B, C_i, T]
            outs.append(h)
        h = self.mfa(torch.cat(outs[1:], dim=1))  # [B, C_last, T]
        return self.fc(self.asp(h))[:, :, 0]  # [B, enc_dim]

    @torch.inference_mode()
    def embed(self, wav24k: torch.Tensor) -> torch.Tensor:
        """wav24k: FloatTensor[N] at 24 kHz -> x-vector FloatTensor[enc_dim]."""
        if wav24k.dim() != 1 or wav24k.numel() == 0:
            raise InputError(f"speaker encoder expects a non-empty 1-D waveform, got {tuple(wav24k.shape)}")
        p = next(self.parameters())
        mels = log_mel_spectrogram(wav24k.to(device=p.device, dtype=torch.float32)[None])  # [1, 128, T]
        return self(mels.to(p.dtype))[0]


PROMPT_FORMAT = "omni-tts-voice-prompt"
PROMPT_VERSION = "1"
# A reference clip of at most 30 s makes 375 frames at 12.5 Hz; past 1024 the prompt alone would fill an
# engine's default max_seq_len. A saved prompt is a few tens of KB; the file cap refuses anything else unread.
MAX_REF_FRAMES = 1024
MAX_PROMPT_FILE_BYTES = 16 * 1024 * 1024


@dataclass
class VoicePrompt:
    """What a voice-clone request is conditioned on.

    ICL mode (x_vector_only False): ref_codes LongTensor[frames, Q] + ref_text (its transcript) + x_vector.
    x-vector-only mode: just x_vector FloatTensor[D]; ref_codes is None (ref_text is kept, unused).
    """

    ref_codes: torch.Tensor | None
    x_vector: torch.Tensor
    ref_text: str | None = None
    x_vector_only: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.x_vector, torch.Tensor) or self.x_vector.dim() != 1 \
                or not self.x_vector.is_floating_point() or self.x_vector.numel() == 0:
            raise InputError("voice prompt: x_vector must be a non-empty 1-D float tensor")
        if not bool(torch.isfinite(self.x_vector).all()):
            raise InputError("voice prompt: x_vector has NaN or infinite values (a corrupt voice file?)")
        check_text("ref_text", self.ref_text, MAX_TEXT_CHARS)
        if self.x_vector_only:
            return
        if self.ref_codes is None:
            raise InputError("voice prompt: ICL mode needs ref_codes (or use x_vector_only=True)")
        if self.ref_codes.dim() != 2 or self.ref_codes.dtype != torch.long or self.ref_codes.shape[0] == 0:
            raise InputError(f"voice prompt: ref_codes must be a LongTensor[frames, codebooks], got "
                             f"{self.ref_codes.dtype} {tuple(self.ref_codes.shape)}")
        if self.ref_codes.shape[0] > MAX_REF_FRAMES:
            raise InputError(f"voice prompt: {self.ref_codes.shape[0]} reference frames, more than {MAX_REF_FRAMES} "
                             f"(a reference clip of at most 30 s makes 375)")
        if not self.ref_text or not self.ref_text.strip():
            raise InputError("voice prompt: ICL mode needs ref_text, the transcript of the reference audio "
                             "(or use x_vector_only=True)")

    @property
    def mode(self) -> str:
        return "x_vector_only" if self.x_vector_only else "icl"

    def save(self, path: str | os.PathLike) -> None:
        """Write as safetensors: tensors `x_vector` (+ `ref_codes`), metadata format/version/mode/ref_text."""
        tensors = {"x_vector": self.x_vector.detach().cpu().contiguous()}
        if self.ref_codes is not None:
            tensors["ref_codes"] = self.ref_codes.detach().cpu().to(torch.long).contiguous()
        meta = {"format": PROMPT_FORMAT, "version": PROMPT_VERSION, "mode": self.mode,
                "ref_text": json.dumps(self.ref_text)}
        save_file(tensors, str(path), metadata=meta)

    @classmethod
    def load(cls, path: str | os.PathLike) -> VoicePrompt:
        """Read a file written by `save`; anything else raises InputError naming the file."""
        p = Path(path)
        if not p.is_file():
            raise InputError(f"voice prompt {p}: file not found")
        if p.stat().st_size > MAX_PROMPT_FILE_BYTES:
            raise InputError(f"voice prompt {p}: {p.stat().st_size / 2**20:.0f} MB is far larger than a voice "
                             f"prompt (at most {MAX_PROMPT_FILE_BYTES // 2**20} MB)")
        try:
            with safe_open(str(p), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception:
            raise InputError(f"voice prompt {p}: not a safetensors file") from None
        if meta.get("format") != PROMPT_FORMAT:
            raise InputError(f"voice prompt {p}: not an omni-tts voice prompt (format tag missing)")
        if meta.get("version") != PROMPT_VERSION:
            raise InputError(f"voice prompt {p}: unsupported version {meta.get('version')!r} "
                             f"(this build reads {PROMPT_VERSION})")
        if meta.get("mode") not in ("icl", "x_vector_only") or "x_vector" not in tensors:
            raise InputError(f"voice prompt {p}: malformed (mode {meta.get('mode')!r}, tensors {sorted(tensors)})")
        try:
            text = json.loads(meta.get("ref_text", "null"))
        except json.JSONDecodeError:
            raise InputError(f"voice prompt {p}: malformed ref_text metadata") from None
        if text is not None and not isinstance(text, str):
            raise InputError(f"voice prompt {p}: malformed ref_text metadata")
        try:
            return cls(ref_codes=tensors.get("ref_codes"), x_vector=tensors["x_vector"], ref_text=text,
                       x_vector_only=meta["mode"] == "x_vector_only")
        except InputError as e:
            raise InputError(f"voice prompt {p}: {str(e).removeprefix('voice prompt: ')}") from None


def create_voice_prompt(encoders: Checkpoint | tuple[SpeakerEncoder, CodecEncoder | None], audio: AudioSource,
                        ref_text: str | None = None, x_vector_only: bool = False,
                        limits: AudioLimits = AudioLimits()) -> VoicePrompt:
    """Run the reference clip through both encoders (only the speaker encoder for x-vector-only).

    `encoders`: a Base `Checkpoint` (encoders are built for this call) or a (SpeakerEncoder, CodecEncoder)
    pair built once with `from_checkpoint`. `audio`: anything `load_reference_audio` accepts, or a
    FloatTensor[N] already at 24 kHz; `limits` bounds its duration/size. ICL (the default) needs
    `ref_text`, the clip's transcript; x-vector-only needs none (a given one is kept, unused).
    """
    if not x_vector_only and (ref_text is None or not str(ref_text).strip()):
        raise InputError("voice clone: ref_text (the transcript of the reference audio) is required for ICL "
                         "cloning; pass it, or use x-vector-only mode")
    if isinstance(encoders, Checkpoint):
        speaker = SpeakerEncoder.from_checkpoint(encoders)
        codec = None if x_vector_only else CodecEncoder.from_checkpoint(encoders)
    else:
        speaker, codec = encoders
    if codec is None and not x_vector_only:
        raise InputError("voice clone: ICL mode needs the codec encoder; use x-vector-only mode")
    if isinstance(audio, torch.Tensor) and audio.dim() == 1:
        wav = load_reference_audio((audio, speaker.sample_rate), limits)
    else:
        wav = load_reference_audio(audio, limits, target_sr=speaker.sample_rate)  # [N] float32 at 24 kHz
    if codec is not None and codec.sample_rate != speaker.sample_rate:
        raise CheckpointError(f"codec encoder runs at {codec.sample_rate} Hz but the speaker encoder at "
                              f"{speaker.sample_rate} Hz")
    x_vector = speaker.embed(wav)  # [D]
    codes = None if x_vector_only else codec.encode(wav[None])[0].cpu()  # [frames, Q]
    return VoicePrompt(ref_codes=codes, x_vector=x_vector.float().cpu(), ref_text=ref_text,
                       x_vector_only=x_vector_only)
