"""The 12 Hz speech tokenizer's causal attention: the decoder's sliding-window transformer
(`WindowTransformer`, between the codebooks and the upsampling convs) and the attention both tokenizer
halves use (`WindowAttention`; the encoder's runs without a window).

Owns: their math and parameter names (they match the checkpoint's keys), the transformer's `lookback(j)`
and its streaming state in a layers.Carry (each attention's last window - 1 keys/values, each row's next
position), so that a stream decoded piece by piece equals the decode of the whole. The RMS norm, rotary
embedding, SwiGLU MLP, attention projections and layer scale are those of omni_tts.models.layers.
Does not know: configs or checkpoint files, devices, dtypes, streaming policy.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omni_tts.models.codec.layers import Carry
from omni_tts.models.layers import (
    MLP,
    AttentionProjections,
    LayerScale,
    RMSNorm,
    apply_rope,
    rope_cos_sin,
    rope_frequencies,
)


class WindowAttention(AttentionProjections):
    """Causal attention under the caller's mask (the decoder's sliding window; None: every earlier
    position, as the encoder attends), RoPE on q and k, KV heads repeated for grouped queries."""

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor | None,
                carry: Carry | None = None) -> torch.Tensor:
        """carry: holds this layer's past keys and values [B, 2*nkv, M, hd] (rotated), put in front of the
        new ones (the mask covers M + T keys); it then holds the last M of them."""
        t = x.shape[1]
        q, k, v = (h.transpose(1, 2) for h in self.heads_of(x))  # q: [B, nh, T, hd], k/v: [B, nkv, T, hd]
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if carry is not None:
            past_k, past_v = carry[self].chunk(2, dim=1)  # [B, nkv, M, hd] each
            m = past_k.shape[2]
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)  # [B, nkv, M+T, hd]
            carry[self] = torch.cat([k[:, :, k.shape[2] - m:], v[:, :, v.shape[2] - m:]], dim=1)
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)  # k: [B, nh, T, hd]
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and t > 1,
                                             scale=self.head_dim ** -0.5)  # [B, nh, T, hd]
        return self.out(out)  # [B, T, H]


class TransformerLayer(nn.Module):
    def __init__(self, d: dict[str, Any]):
        super().__init__()
        h = d["hidden_size"]
        self.input_layernorm = RMSNorm(h, d["rms_norm_eps"])
        self.self_attn = WindowAttention(h, d["num_attention_heads"], d["num_key_value_heads"], d["head_dim"],
                                         d["attention_bias"])
        self.self_attn_layer_scale = LayerScale(h)
        self.post_attention_layernorm = RMSNorm(h, d["rms_norm_eps"])
        self.mlp = MLP(h, d["intermediate_size"], d["hidden_act"], "speech_tokenizer decoder_config")
        self.mlp_layer_scale = LayerScale(h)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor,
                carry: Carry | None = None) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), rope, mask, carry))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))  # x: [B, T, H]


class WindowTransformer(nn.Module):
    """latent -> hidden, L pre-norm layers with causal sliding-window attention + RoPE -> latent."""

    def __init__(self, d: dict[str, Any]):
        super().__init__()
        self.window, self.head_dim, self.theta = d["sliding_window"], d["head_dim"], float(d["rope_theta"])
        self.input_proj = nn.Linear(d["latent_dim"], d["hidden_size"])
        self.layers = nn.ModuleList(TransformerLayer(d) for _ in range(d["num_hidden_layers"]))
        self.norm = RMSNorm(d["hidden_size"], d["rms_norm_eps"])
        self.output_proj = nn.Linear(d["hidden_size"], d["latent_dim"])

    def forward(self, x: torch.Tensor, carry: Carry | None = None) -> torch.Tensor:
        """x: [B, T, latent] -> [B, T, latent]. Positions restart at 0, or with carry continue each row's
        stream: its next position (this module's entry, [B]) and each layer's last window - 1 keys/values."""
        t, dev = x.shape[1], x.device
        pos = torch.arange(t, device=dev)[None]  # [1, T]
        q_idx, k_idx = pos[0][:, None], pos  # [T, 1], [1, T]
        if carry is not None:
            past = self.window - 1
            start = carry.get(self)  # [B] each row's next position
            start = torch.zeros(x.shape[0], dtype=torch.long, device=dev) if start is None else start
            carry[self] = start + t
            pos = start[:, None] + pos  # [B, T]
            # key column j holds position start - past + j; columns before the row's stream are empty
            k_idx = torch.arange(past + t, device=dev)[None] - past  # [1, past+T]
            empty = k_idx[None] < -start.clamp(max=past)[:, None, None]  # [B, 1, past+T]
            for layer in self.layers:
                attn = layer.self_attn
                if attn not in carry:
                    carry[attn] = x.new_zeros(x.shape[0], 2 * attn.kv_heads, past, self.head_dim)
        # frequencies made on x's device each call, as the module's dtype may be bfloat16 (no float32 buffer)
        rope = rope_cos_sin(pos, rope_frequencies(self.head_dim, self.theta, dev), x.dtype)  # [1 or B, T, hd]
        mask = (k_idx <= q_idx) & (k_idx > q_idx - self.window)  # mask: [T, T or past+T], True = attend
        if carry is not None:
            mask = (mask[None] & ~empty)[:, None]  # [B, 1, T, past+T]
        h = self.input_proj(x)  # h: [B, T, H]
        for layer in self.layers:
            h = layer(h, rope, mask, carry)
        return self.output_proj(self.norm(h))  # [B, T, latent]

    def lookback(self, j: int) -> int:
        return j - len(self.layers) * (self.window - 1)
