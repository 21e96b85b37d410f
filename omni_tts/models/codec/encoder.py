"""The speech tokenizer's ENCODER: 24 kHz waveform -> 12.5 Hz codes (voice-clone reference audio).

Owns the encoder half of the Qwen3-TTS-Tokenizer-12Hz (a Mimi-style model): a causal SEANet
convolution stack, a causal transformer, a stride-2 downsampling conv and the split residual vector
quantizer (one semantic RVQ and one acoustic RVQ, both fed the same latent). It reads every size
from `speech_tokenizer/config.json` (`encoder_config`) and loads the `encoder.*` tensors strictly.
`encode` returns the codes of the first `encoder_valid_num_quantizers` quantizers, trimmed to
ceil(samples / encode_downsample_rate) frames, exactly as the official tokenizer does.

Its attention, rotary embedding, layer scale, activations and strict loading are those of
omni_tts.models.codec.transformer and omni_tts.models.layers.
Does not know: the decoder (codec/decoder.py), how audio is loaded or resampled (models/audio.py),
or what the codes are used for. Runs in float32 (the parity reference is float32).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omni_tts.errors import CheckpointError, InputError
from omni_tts.models.checkpoint import Checkpoint, require
from omni_tts.models.codec.transformer import WindowAttention
from omni_tts.models.layers import LayerScale, Rope, activation, load_prefixed_state

_CODEBOOK_EPS = 1e-5  # clamp for the codebook usage counts when turning sums into centroids


class _PaddedConv1d(nn.Module):
    """Conv1d that pads its input itself (causal: all on the left) so every input sample is covered."""

    def __init__(self, c_in: int, c_out: int, kernel: int, *, stride: int = 1, dilation: int = 1,
                 bias: bool = True, causal: bool = True, pad_mode: str = "constant"):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride=stride, dilation=dilation, bias=bias)
        self.stride = stride
        self.span = (kernel - 1) * dilation + 1  # effective kernel length
        self.pad_total = self.span - stride
        self.causal = causal
        self.pad_mode = pad_mode

    def _tail_padding(self, length: int) -> int:
        """Zeros/edge values needed on the right so the last window ends exactly at the input end."""
        windows = -(-(length - self.span + self.pad_total) // self.stride)  # ceil division
        return windows * self.stride + self.span - self.pad_total - length

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, T]
        tail = self._tail_padding(x.shape[-1])
        if self.causal:
            left, right = self.pad_total, tail
        else:
            left = self.pad_total - self.pad_total // 2
            right = self.pad_total // 2 + tail
        if self.pad_mode == "constant":
            x = F.pad(x, (left, right))
        elif self.pad_mode in ("replicate", "reflect"):
            if self.pad_mode == "reflect" and x.shape[-1] <= max(left, right):
                raise InputError("reference audio is too short for the codec encoder")
            x = F.pad(x, (left, right), mode=self.pad_mode)
        else:
            raise CheckpointError(f"codec encoder: unsupported pad_mode '{self.pad_mode}'")
        return self.conv(x)  # [B, C_out, T']


class _ResidualUnit(nn.Module):
    """ELU -> conv(k, dilation) -> ELU -> conv(1), added to the (optionally projected) input."""

    def __init__(self, dim: int, cfg: dict[str, Any], dilation: int, conv_kw: dict[str, Any]):
        super().__init__()
        hidden = dim // cfg["compress"]
        # The ELUs sit at indices 0 and 2 so the conv weights keep their stored names (block.1, block.3).
        self.block = nn.ModuleList([
            nn.ELU(), _PaddedConv1d(dim, hidden, cfg["residual_kernel_size"], dilation=dilation, **conv_kw),
            nn.ELU(), _PaddedConv1d(hidden, dim, 1, **conv_kw)])
        self.shortcut = _PaddedConv1d(dim, dim, 1, **conv_kw) if cfg["use_conv_shortcut"] else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, C, T]
        y = x
        for layer in self.block:
            y = layer(y)
        skip = self.shortcut(x) if self.shortcut is not None else x
        return skip + y


class _ConvStack(nn.Module):
    """SEANet-style encoder: conv, then per ratio (residual units, ELU, strided conv), ELU, final conv."""

    def __init__(self, cfg: dict[str, Any], conv_kw: dict[str, Any]):
        super().__init__()
        nf = cfg["num_filters"]
        layers: list[nn.Module] = [_PaddedConv1d(cfg["audio_channels"], nf, cfg["kernel_size"], **conv_kw)]
        mult = 1
        for ratio in reversed(cfg["upsampling_ratios"]):  # the encoder downsamples in reverse order
            width = nf * mult
            for j in range(cfg["num_residual_layers"]):
                layers.append(_ResidualUnit(width, cfg, cfg["dilation_growth_rate"] ** j, conv_kw))
            layers += [nn.ELU(), _PaddedConv1d(width, 2 * width, 2 * ratio, stride=ratio, **conv_kw)]
            mult *= 2
        layers += [nn.ELU(), _PaddedConv1d(nf * mult, cfg["hidden_size"], cfg["last_kernel_size"], **conv_kw)]
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, 1, N] -> [B, H, N / prod(ratios)]
        for layer in self.layers:
            x = layer(x)
        return x


class _Mlp(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        self.fc1 = nn.Linear(cfg["hidden_size"], cfg["intermediate_size"], bias=False)
        self.fc2 = nn.Linear(cfg["intermediate_size"], cfg["hidden_size"], bias=False)
        self.act = activation(cfg["hidden_act"], "speech_tokenizer encoder_config")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class _TransformerLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        h, eps = cfg["hidden_size"], cfg["norm_eps"]
        self.input_layernorm = nn.LayerNorm(h, eps=eps)
        self.self_attn = WindowAttention(h, cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"],
                                         cfg["attention_bias"])
        self.self_attn_layer_scale = LayerScale(h)
        self.post_attention_layernorm = nn.LayerNorm(h, eps=eps)
        self.mlp = _Mlp(cfg)
        self.mlp_layer_scale = LayerScale(h)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:  # x: [B, T, H]
        # plain causal attention over the whole clip: the reference applies no sliding window here
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), rope, None))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class _Transformer(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        self.layers = nn.ModuleList([_TransformerLayer(cfg) for _ in range(cfg["num_hidden_layers"])])
        self.rope = Rope(cfg["head_dim"], cfg["rope_theta"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, H]
        rope = self.rope(torch.arange(x.shape[1], device=x.device)[None], x.dtype)  # [1, T, hd] each
        for layer in self.layers:
            x = layer(x, rope)
        return x


class _Codebook(nn.Module):
    """Stored as running sums (k-means EMA state); the centroids are embed_sum / usage."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))
        self.register_buffer("centroids", torch.zeros(size, dim), persistent=False)

    def refresh(self) -> None:
        self.centroids = self.embed_sum / self.cluster_usage.clamp(min=_CODEBOOK_EPS)[:, None]

    def nearest(self, x: torch.Tensor) -> torch.Tensor:  # x: [M, D] -> [M] indices
        dist = torch.cdist(x[None].float(), self.centroids[None].float(), p=2)[0]  # [M, K]
        return dist.argmin(dim=-1)


class _CodebookSlot(nn.Module):
    """One RVQ stage (holds its codebook under the stored name `codebook`)."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.codebook = _Codebook(size, dim)


class _ResidualQuantizer(nn.Module):
    def __init__(self, cfg: dict[str, Any], n_stages: int):
        super().__init__()
        h, d = cfg["hidden_size"], cfg["vector_quantization_hidden_dimension"]
        self.layers = nn.ModuleList([_CodebookSlot(cfg["codebook_size"], cfg["codebook_dim"])
                                     for _ in range(n_stages)])
        self.input_proj = nn.Conv1d(h, d, 1, bias=False) if d != h else None
        # Only the decoder uses output_proj; it is kept so the stored weights load strictly.
        self.output_proj = nn.Conv1d(d, h, 1, bias=False) if d != h else None

    def codes(self, x: torch.Tensor, n_stages: int) -> torch.Tensor:  # x: [B, H, T] -> [B, n, T]
        if self.input_proj is not None:
            x = self.input_proj(x)  # [B, D, T]
        b, _, t = x.shape
        residual = x.transpose(1, 2).reshape(b * t, -1)  # [B*T, D]
        picked = []
        for slot in self.layers[:n_stages]:
            idx = slot.codebook.nearest(residual)  # [B*T]
            residual = residual - F.embedding(idx, slot.codebook.centroids)
            picked.append(idx.view(b, t))
        return torch.stack(picked, dim=1)


class _SplitQuantizer(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        self.n_semantic = cfg["num_semantic_quantizers"]
        self.semantic_residual_vector_quantizer = _ResidualQuantizer(cfg, self.n_semantic)
        self.acoustic_residual_vector_quantizer = _ResidualQuantizer(cfg, cfg["num_quantizers"] - self.n_semantic)

    def codes(self, x: torch.Tensor, n: int) -> torch.Tensor:  # x: [B, H, T] -> [B, n, T]
        out = self.semantic_residual_vector_quantizer.codes(x, self.n_semantic)
        if n > self.n_semantic:  # the acoustic RVQ quantizes the same latent, not the semantic residual
            acoustic = self.acoustic_residual_vector_quantizer.codes(x, n - self.n_semantic)
            out = torch.cat([out, acoustic], dim=1)
        return out


# What the reference implementation assumes for keys absent from (or null in) `encoder_config`.
_ENCODER_DEFAULTS: dict[str, Any] = {
    "sampling_rate": 24000, "audio_channels": 1, "hidden_size": 512, "num_filters": 64, "num_residual_layers": 1,
    "upsampling_ratios": [8, 6, 5, 4], "kernel_size": 7, "last_kernel_size": 3, "residual_kernel_size": 3,
    "dilation_growth_rate": 2, "use_causal_conv": True, "pad_mode": "constant", "compress": 2,
    "codebook_size": 2048, "codebook_dim": None, "num_quantizers": 32, "use_conv_shortcut": False,
    "vector_quantization_hidden_dimension": 256, "num_semantic_quantizers": 1, "num_hidden_layers": 8,
    "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": None,
    "hidden_act": "gelu", "norm_eps": 1e-5, "rope_theta": 10000.0, "attention_bias": False,
    "_frame_rate": None, "frame_rate": None,
}


def _encoder_settings(raw: Any, source: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise CheckpointError(f"{source}: 'encoder_config' must be an object")
    cfg = {**_ENCODER_DEFAULTS, **{k: v for k, v in raw.items() if v is not None}}
    cfg["codebook_dim"] = cfg["codebook_dim"] or cfg["hidden_size"]
    cfg["head_dim"] = cfg["head_dim"] or cfg["hidden_size"] // cfg["num_attention_heads"]
    if cfg["audio_channels"] != 1:
        raise CheckpointError(f"{source}: encoder_config.audio_channels={cfg['audio_channels']} (only mono)")
    return cfg


class CodecEncoder(nn.Module):
    """Waveform -> codes. Submodule names mirror the stored `encoder.*` tensor names."""

    def __init__(self, codec_config: dict[str, Any], source: str = "speech_tokenizer/config.json"):
        super().__init__()
        cfg = _encoder_settings(require(codec_config, "encoder_config", source), source)
        self.sample_rate = int(cfg["sampling_rate"])
        self.n_valid = int(codec_config.get("encoder_valid_num_quantizers", cfg["num_quantizers"]))
        hop = math.prod(cfg["upsampling_ratios"])
        self.frame_hop = int(codec_config.get("encode_downsample_rate", 2 * hop))
        if not cfg["num_semantic_quantizers"] <= self.n_valid <= cfg["num_quantizers"]:
            raise CheckpointError(f"{source}: encoder_valid_num_quantizers={self.n_valid} is out of range")
        conv_kw = {"causal": cfg["use_causal_conv"], "pad_mode": cfg["pad_mode"]}
        self.encoder = _ConvStack(cfg, conv_kw)
        self.encoder_transformer = _Transformer(cfg)
        latent_rate = math.ceil(self.sample_rate / hop)  # frames/s after the conv stack (an integer upstream)
        frame_rate = cfg["_frame_rate"] or cfg["frame_rate"] or self.sample_rate / (2 * hop)
        self.downsample = None
        if frame_rate != latent_rate:
            self.downsample = _PaddedConv1d(cfg["hidden_size"], cfg["hidden_size"], 2 * int(latent_rate / frame_rate),
                                            stride=2, bias=False, causal=conv_kw["causal"], pad_mode="replicate")
        self.quantizer = _SplitQuantizer(cfg)

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint) -> CodecEncoder:
        """Build from `ckpt.codec_config` and load the `encoder.*` tensors of `ckpt.codec_weights` strictly."""
        cfg_file = str(ckpt.path / "speech_tokenizer" / "config.json")
        model = cls(ckpt.codec_config, source=cfg_file)
        load_prefixed_state(model, ckpt.codec_weights, "encoder.",
                            str(ckpt.path / "speech_tokenizer" / "model.safetensors"))
        model.refresh_codebooks()
        return model.eval()

    def refresh_codebooks(self) -> None:
        """Recompute the centroids from the loaded sums (call after changing the buffers)."""
        for m in self.modules():
            if isinstance(m, _Codebook):
                m.refresh()

    @torch.inference_mode()
    def encode(self, wav24k: torch.Tensor) -> torch.Tensor:
        """wav24k: FloatTensor[B, N] at the codec rate -> LongTensor[B, ceil(N / hop), n_valid]."""
        if wav24k.dim() != 2 or wav24k.shape[-1] == 0:
            raise InputError(f"codec encoder expects a non-empty [batch, samples] waveform, got {tuple(wav24k.shape)}")
        p = next(self.parameters())
        x = wav24k.to(device=p.device, dtype=p.dtype)[:, None, :]  # [B, 1, N]
        h = self.encoder(x)  # [B, H, N / hop_latent]
        h = self.encoder_transformer(h.transpose(1, 2)).transpose(1, 2)  # [B, H, T25]
        if self.downsample is not None:
            h = self.downsample(h)  # [B, H, T12]
        codes = self.quantizer.codes(h, self.n_valid)  # [B, Q, T12]
        frames = -(-wav24k.shape[-1] // self.frame_hop)
        return codes[:, :, :frames].transpose(1, 2).contiguous()  # [B, frames, Q]

    def encode_batch(self, wavs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Several 1-D clips at once, zero-padded on the right like the official batch encode; each result
        is trimmed to its own ceil(len / hop) frames. Returns LongTensor[frames_i, n_valid] per clip."""
        if not wavs:
            return []
        longest = max(int(w.shape[-1]) for w in wavs)
        batch = torch.zeros(len(wavs), longest, dtype=torch.float32)
        for i, w in enumerate(wavs):
            batch[i, : w.shape[-1]] = w.float().cpu()
        codes = self.encode(batch)  # [B, ceil(longest / hop), Q]
        return [codes[i, : -(-int(w.shape[-1]) // self.frame_hop)] for i, w in enumerate(wavs)]
