"""Qwen3-TTS 12 Hz speech-tokenizer DECODER: codec codes [T, 16] -> 24 kHz waveform, whole or streamed.

Owns: the decoder half of `speech_tokenizer/` from codec/layers.py and codec/transformer.py (split residual-VQ
codebook lookup, causal pre-conv, sliding-window pre-transformer, ConvNeXt upsampler, SnakeBeta /
transposed-conv vocoder), reading `decoder_config`, strict loading of its `decoder.*` tensors, the official
decode conventions (codes clamped at 0, frames whose first code is -1 are padding, output clamped to [-1, 1],
300-frame segments decoded with 25 frames of left context), windowed decoding (`decode_window`, `windows`,
`decode_frames`: the one-shot decode's segments) and piecewise decoding with carried state (`decode_carried`:
each frame decoded once; codec/streaming.py builds per-request streams on it).
Does not know: the codec encoder (`codec/encoder.py`), the talker, devices or chunk-size policy
(the engine picks those), audio file I/O.

Streaming exactness. Every op is causal: convs pad on the left only, a transposed conv with kernel K
and stride s whose right tail is trimmed makes output sample j from inputs ceil((j-K+1)/s)..j//s,
and attention sees the last `sliding_window` (W) frames. So no sample depends on a later frame: no
right-edge hold-back is needed. The left reach adds up though: pre-conv 2 frames, each of the L
attention layers W-1 more (they stack), the conv stack after the transformer 10 more (for rates
8,5,4,3 / 2,2). `receptive_field_frames` walks the modules to compute it: 154 frames for the tiny
fixture (L=2), 580 for L=8. With that much context a window's last frames equal a full pass; with
only W=72 frames the tiny fixture is off by ~3e-4. In a window only the cheap frame-rate front (VQ +
transformer) runs over the whole context; the vocoder runs over the new frames plus `vocoder_context_frames`.
Streams need no context at all: `decode_carried` keeps what the next piece reads of the past (each causal
conv's last inputs, each transposed conv's overlapping input, each attention layer's last W-1 keys and
values and the position) in a `Carry`, so the pieces join to the pass over all their frames.
Decoding runs in the module's dtype (float32, or bf16 on CUDA) and returns float32; float32 decode
turns cuDNN's TF32 convs off while it runs (matmul precision follows torch's global setting). In
bf16, chunks match the one-shot decode only to bf16 rounding (~1e-2), not 1e-4.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from omni_tts.errors import CheckpointError, InputError
from omni_tts.kernels import snake as codec_kernels
from omni_tts.models.codec.layers import (
    Carry,
    CausalConv1d,
    CausalUpConv1d,
    CodebookGroup,
    ConvNeXtBlock,
    SnakeBeta,
    VocoderStage,
    chain_lookback,
    fused_snake,
    snake,
)
from omni_tts.models.codec.transformer import WindowTransformer
from omni_tts.models.layers import ACTIVATIONS
from omni_tts.models.precision import exact, tf32
from omni_tts.models.transfer import to_device

if TYPE_CHECKING:
    from omni_tts.models.checkpoint import Checkpoint

CODEBOOK_EPS = 1e-5  # floor on cluster usage when normalising a codebook (fixed in the format)
SEGMENT_FRAMES = 300  # the official decode splits long code matrices into 300-frame segments...
SEGMENT_CONTEXT = 25  # ...each decoded with 25 frames of left context (not enough to be exact)


PRECISIONS = ("float32", "tf32", "bfloat16")


def _conv_precision(device: torch.device, precision: str) -> contextlib.AbstractContextManager[None]:
    """cuDNN runs float32 convs in TF32 by default (~5e-5 off here): 'float32' (exact) turns TF32 off for
    the call, 'tf32' keeps it on and turns it on for the matmuls too (the transformers' linears, the
    stride-8 up-conv's GEMM); 'bfloat16' weights don't care. CPUs have no TF32."""
    if precision == "float32":
        return exact(device)
    return tf32(device) if precision == "tf32" else contextlib.nullcontext()


def _decoder_sizes(codec_config: dict[str, Any], file: str) -> dict[str, Any]:
    """The decoder_config with the reference's defaults for keys that no tensor shape pins down."""
    kind = codec_config.get("model_type", "qwen3_tts_tokenizer_12hz")
    if kind != "qwen3_tts_tokenizer_12hz":
        raise CheckpointError(f"{file}: model_type '{kind}' is not the 12 Hz speech tokenizer this decoder runs")
    d = codec_config.get("decoder_config")
    if not isinstance(d, dict):
        raise CheckpointError(f"{file}: missing key 'decoder_config'")
    for key in ("codebook_size", "codebook_dim", "latent_dim", "decoder_dim", "hidden_size", "intermediate_size",
                "num_hidden_layers", "num_attention_heads", "num_quantizers", "upsample_rates", "upsampling_ratios"):
        if key not in d:
            raise CheckpointError(f"{file}: missing key 'decoder_config.{key}'")
    if d.get("rope_scaling"):
        raise CheckpointError(f"{file}: decoder_config.rope_scaling is not supported by this decoder")
    out = {"sliding_window": 72, "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "hidden_act": "silu",
           "attention_bias": False, "num_key_value_heads": d["num_attention_heads"],
           "head_dim": d["hidden_size"] // d["num_attention_heads"], **{k: v for k, v in d.items() if v is not None}}
    if out["hidden_act"] not in ACTIVATIONS:
        raise CheckpointError(f"{file}: unsupported decoder_config.hidden_act '{out['hidden_act']}'")
    if out["num_quantizers"] < 2 or out["num_attention_heads"] % out["num_key_value_heads"]:
        raise CheckpointError(f"{file}: inconsistent decoder_config (num_quantizers / attention heads)")
    return out


class CodecDecoder(nn.Module):
    """codes [B, T, Q] -> waveform [B, T * decode_upsample_rate] at `output_sample_rate`."""

    def __init__(self, codec_config: dict[str, Any], file: str = "speech_tokenizer/config.json"):
        super().__init__()
        d = _decoder_sizes(codec_config, file)
        self.num_quantizers, self.sliding_window = int(d["num_quantizers"]), int(d["sliding_window"])
        self.output_sample_rate = int(codec_config.get("output_sample_rate", 24000))
        self.samples_per_frame = math.prod(d["upsample_rates"]) * math.prod(d["upsampling_ratios"])
        rate = int(codec_config.get("decode_upsample_rate", self.samples_per_frame))
        if rate != self.samples_per_frame:
            raise CheckpointError(f"{file}: decode_upsample_rate {rate} != product of the decoder's rates "
                                  f"{self.samples_per_frame}")
        self.decode_upsample_rate = rate
        self.segment_frames: int | None = SEGMENT_FRAMES  # None: one pass (exact, not the official output)
        self.segment_context = SEGMENT_CONTEXT
        cb, half, lat, dim = d["codebook_size"], d["codebook_dim"] // 2, d["latent_dim"], d["decoder_dim"]
        self.quantizer = nn.ModuleDict({"rvq_first": CodebookGroup(1, cb, half, d["codebook_dim"]),
                                        "rvq_rest": CodebookGroup(self.num_quantizers - 1, cb, half,
                                                                  d["codebook_dim"])})
        self.pre_conv = CausalConv1d(d["codebook_dim"], lat, 3)
        self.pre_transformer = WindowTransformer(d)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalUpConv1d(lat, lat, r, r), ConvNeXtBlock(lat)]) for r in d["upsampling_ratios"])
        rates = d["upsample_rates"]
        stages = [VocoderStage(dim >> i, dim >> (i + 1), r) for i, r in enumerate(rates)]
        self.decoder = nn.ModuleList([CausalConv1d(lat, dim, 7), *stages, SnakeBeta(dim >> len(rates)),
                                      CausalConv1d(dim >> len(rates), 1, 7)])
        vocoder_layers = [m for stage in self.upsample for m in stage] + list(self.decoder)
        probe = 10 ** 6  # any frame far from 0: every layer is shift-invariant at its own rate
        self.vocoder_context_frames = probe - chain_lookback(vocoder_layers, probe * self.samples_per_frame)
        front = self.pre_conv.lookback(self.pre_transformer.lookback(probe))
        self.receptive_field_frames = probe - front + self.vocoder_context_frames
        self.precision = "float32"
        self.fused = False  # set_fused

    def set_precision(self, precision: str) -> CodecDecoder:
        """'float32' (IEEE, exact: what the tests and the golden waveforms use), 'tf32' (float32 weights,
        TF32 convs and matmuls on CUDA: ~5e-5 off, several times faster) or 'bfloat16' (weights and activations;
        one way: the rounded weights cannot go back to float32)."""
        if precision not in PRECISIONS:
            raise ValueError(f"codec precision must be one of {', '.join(PRECISIONS)} (got '{precision}')")
        if self.precision == "bfloat16" and precision != "bfloat16":
            raise ValueError("a bfloat16 codec cannot go back to float32 (its weights were rounded); load it again")
        self.to(torch.bfloat16 if precision == "bfloat16" else torch.float32)
        self.precision = precision
        return self

    def set_fused(self, on: bool) -> CodecDecoder:
        """Run the vocoder's SnakeBeta activations as one kernel each (`fused_snake`: Triton on CUDA, else
        compiled) or as eager ops. Same math; the fused sum may differ in the last bit. The first decode
        compiles (seconds; on the CPU again for a new batch size class): warm it before serving."""
        impl = fused_snake if on else snake
        for m in self.modules():
            if isinstance(m, SnakeBeta):
                m.impl = impl
        self.fused = on
        return self

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint) -> CodecDecoder:
        return cls.from_config(ckpt.codec_config, ckpt.codec_weights,
                               source=str(getattr(ckpt, "path", ".")) + "/speech_tokenizer")

    @classmethod
    def from_config(cls, codec_config: dict[str, Any], weights: dict[str, torch.Tensor],
                    source: str = "speech_tokenizer") -> CodecDecoder:
        """Build from the speech_tokenizer config dict and tensors; strict about every `decoder.*` key."""
        model = cls(codec_config, file=f"{source}/config.json")
        model._load(weights, f"{source}/model.safetensors")
        return model.eval()

    def _load(self, weights: dict[str, torch.Tensor], file: str) -> None:
        own = {"decoder." + k: (k, v.shape) for k, v in self.state_dict().items()}
        books: dict[str, tuple[str, int, tuple[int, ...]]] = {}
        optional: dict[str, tuple[int, ...]] = {}
        for group_name, group in self.quantizer.items():
            n, size, dim = group.tables.shape
            prefix = f"decoder.quantizer.{group_name}."
            optional[prefix + "input_proj.weight"] = (dim, 2 * dim, 1)  # encoder side: shape-checked, unused
            for i in range(n):
                books[f"{prefix}vq.layers.{i}._codebook.embedding_sum"] = (group_name, i, (size, dim))
                books[f"{prefix}vq.layers.{i}._codebook.cluster_usage"] = (group_name, i, (size,))
        shapes = {**{k: s for k, (_, s) in own.items()}, **{k: b[2] for k, b in books.items()}}
        for key in sorted(shapes):
            if key not in weights:
                raise CheckpointError(f"{file}: missing tensor '{key}'")
        for key in sorted(k for k in weights if k.startswith("decoder.")):
            want = shapes.get(key, optional.get(key))
            if want is None:
                raise CheckpointError(f"{file}: unexpected tensor '{key}' (not part of the 12 Hz decoder)")
            if tuple(weights[key].shape) != tuple(want):
                raise CheckpointError(f"{file}: tensor '{key}' has shape {tuple(weights[key].shape)}, "
                                      f"expected {tuple(want)}")
        self.load_state_dict({name: weights[key].float() for key, (name, _) in own.items()}, strict=True)
        with torch.no_grad():
            for key, (group_name, i, _) in books.items():
                if key.endswith("embedding_sum"):
                    usage = weights[key[: -len("embedding_sum")] + "cluster_usage"].float()
                    table = weights[key].float() / usage.clamp(min=CODEBOOK_EPS)[:, None]
                    self.quantizer[group_name].tables[i].copy_(table)

    # ------------------------------------------------------------------ decoding
    def prepare(self, codes: torch.Tensor) -> torch.Tensor:
        """Validate where the codes are (host codes: no device sync) and move them to the codec's device
        (from host through pinned memory, asynchronously)."""
        if codes.dim() != 3 or codes.shape[-1] != self.num_quantizers:
            raise ValueError(f"codes must be [B, T, {self.num_quantizers}], got {tuple(codes.shape)}")
        tables = self.quantizer["rvq_first"].tables
        codes = codes.long().clamp(min=0)
        if codes.numel() and int(codes.max()) >= tables.shape[1]:
            raise InputError(f"codec code {int(codes.max())} is outside the codebook (size {tables.shape[1]})")
        return to_device(codes, tables.device)

    def _front(self, codes: torch.Tensor, carry: Carry | None = None) -> torch.Tensor:
        """codes: [B, T, Q] -> latent [B, latent, T]"""
        lat = self.quantizer["rvq_first"](codes[..., :1]) + self.quantizer["rvq_rest"](codes[..., 1:])
        lat = self.pre_conv(lat, carry=carry).transpose(1, 2)  # lat: [B, T, latent]
        return self.pre_transformer(lat, carry).transpose(1, 2)

    def _vocode(self, lat: torch.Tensor, carry: Carry | None = None) -> torch.Tensor:
        """lat: [B, latent, T] -> wav [B, T*upsample]"""
        x = lat
        for up, block in self.upsample:
            x = block(up(x, carry), carry)  # x: [B, latent, T*r]
        if self.fused and x.is_cuda and codec_kernels.available():
            return self._vocode_pending(x, carry)
        first, *stages, act, conv = self.decoder  # the last activation writes the last conv's left padding
        x = first(x, carry=carry)
        for stage in stages:
            x = stage(x, carry)
        x = conv(act(x, pad=conv.reach), padded=True, carry=carry)  # x: [B, 1, T*upsample]
        return x.squeeze(1).clamp(-1.0, 1.0)

    def _vocode_pending(self, x: torch.Tensor, carry: Carry | None = None) -> torch.Tensor:
        """The vocoder after the upsampling blocks with every bias and residual add inside the Triton snake
        kernels (`Pending`). x: [B, latent, T'] -> wav [B, T'*rates]"""
        first, *stages, act, conv = self.decoder
        p = first.pending(x, carry=carry)  # [B, dim, T']
        for stage in stages:
            p = stage.pending(p, carry)
        x = conv.taps(act.fused(p, pad=conv.reach, last=True)[1], carry)  # x: [B, 1, T*upsample]
        return x.squeeze(1).clamp(-1.0, 1.0)

    def decode_carried(self, codes: torch.Tensor, carry: Carry) -> torch.Tensor:
        """The next frames of B streams: codes `prepare`d [B, N, Q] -> float32 [B, N*upsample], equal to
        those frames of one pass over each stream (from its last reset: an empty carry). `carry` (the
        streams' state, rows stacked) is updated in place; graph-capturable."""
        with _conv_precision(codes.device, self.precision):
            return self._vocode(self._front(codes, carry), carry).float()

    @torch.inference_mode()
    def decode_window(self, codes: torch.Tensor, context_frames: int) -> torch.Tensor:
        """Decode a [B, C+N, Q] window as one pass and return float32 [B, N*upsample]: the last N frames."""
        return self.window(self.prepare(codes), context_frames)

    def window(self, codes: torch.Tensor, context_frames: int) -> torch.Tensor:  # codes: prepared [B, C+N, Q]
        """decode_window on codes already `prepare`d (device, validated): graph-capturable."""
        total = codes.shape[1]
        if not 0 <= context_frames <= total:
            raise ValueError(f"context_frames={context_frames} outside [0, {total}]")
        n = total - context_frames
        if n == 0:
            return torch.zeros(codes.shape[0], 0, dtype=torch.float32, device=codes.device)
        keep = min(total, n + self.vocoder_context_frames)  # the vocoder only needs this many frames
        with _conv_precision(codes.device, self.precision):
            lat = self._front(codes)  # lat: [B, latent, C+N]
            wav = self._vocode(lat[..., total - keep:])  # wav: [B, keep*upsample]
        return wav[:, (keep - n) * self.samples_per_frame:].float()

    def segment_start(self, frame: int) -> int:
        """First frame of the window the official decode uses for `frame` (its 300/25 segmentation)."""
        if self.segment_frames is None:
            return 0
        seg = frame // self.segment_frames * self.segment_frames
        return seg - min(self.segment_context, seg)

    def segment_restarts(self, frame: int) -> bool:
        """Whether the official decode starts a new window (with zero state) for the segment at `frame`."""
        return self.segment_frames is not None and frame > 0 and frame % self.segment_frames == 0

    def segment_pieces(self, start: int, end: int) -> Iterator[tuple[int, int]]:
        """Frames [start, end) cut where the official segments begin."""
        seg = self.segment_frames
        while start < end:
            stop = end if seg is None else min(end, (start // seg + 1) * seg)
            yield start, stop
            start = stop

    def windows(self, codes: torch.Tensor, start: int, end: int) -> list[tuple[torch.Tensor, int]]:
        """The (window [..., C+N, Q], C) pieces whose last N frames are frames [start, end) of `codes` [..., T, Q].

        One piece per official segment touched. Each gets max(receptive_field_frames, segment_context)
        frames of context but never reaches before the start of its official segment window, so
        decoding every piece with `decode_window` gives exactly that slice of `decode`.
        """
        ctx = max(self.receptive_field_frames, self.segment_context)
        out = []
        for lo, hi in self.segment_pieces(start, end):
            first = max(self.segment_start(lo), lo - ctx)
            out.append((codes[..., first:hi, :], lo - first))
        return out

    @torch.inference_mode()
    def decode_frames(self, codes: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Audio of frames [start, end) of the full matrix `codes` [B, T, Q], equal to that slice of `decode`."""
        codes = self.prepare(codes)
        out = [self.window(w, c) for w, c in self.windows(codes, start, end)]  # [B, N_i*upsample]
        if not out:
            return torch.zeros(codes.shape[0], 0, dtype=torch.float32, device=codes.device)
        return torch.cat(out, dim=-1)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """The official decode: codes [B, T, Q] (or [T, Q]) -> float32 [B, T*upsample] (or [T*upsample]).

        Codes are clamped at 0. Frames whose first code is -1 are padding: the official decode cuts each
        wave to (valid frames) * upsample samples; here those trailing samples are zeroed. Inputs over
        300 frames get the official 300-frame segments with 25 frames of context (see decode_frames).
        """
        single = codes.dim() == 2
        codes = codes[None] if single else codes  # codes: [B, T, Q]
        valid = (codes[..., 0] > -1).sum(1) * self.samples_per_frame  # valid: [B] samples to keep
        wav = self.decode_frames(codes, 0, codes.shape[1])  # wav: [B, T*upsample]
        cut = torch.arange(wav.shape[1], device=wav.device)[None] >= valid[:, None].to(wav.device)
        wav = wav.masked_fill(cut, 0.0)
        return wav[0] if single else wav
