"""The talker's prefill as one compile unit per layer: prompts at positions 0..T-1 into their slots.

A prompt always starts at position 0, so the cache positions its attention reads (0..T-1) hold exactly
the K/V its own layer just computed: the unit attends over those directly (causal SDPA); the caller
stores them in the slot cache for the decode steps. The projections run over the packed q|k|v and
gate|up weights (`fuse_layer`), as the decode units do.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from omni_tts.models.compiled.units import mlp_fused, out_proj, qkv_fused


def prefill_layer(layer: Any, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None, w_gu: torch.Tensor,
                  x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One talker layer over prompts x: [B, T, D] (right-padded) at positions 0..T-1. w_*: fuse_layer(layer);
    cos/sin: [1, T, hd]. Writes nothing: a write into the slot cache inside the compiled unit made Inductor
    copy the layer's whole cache; the caller stores K/V. -> (x [B, T, D], k, v [B, Hkv, T, hd])"""
    a = layer.self_attn
    q, k, v = qkv_fused(a, w_qkv, b_qkv, layer.input_layernorm(x), cos, sin)  # q: [B, H, T, hd]; k/v: [B, Hkv, T, hd]
    rep = a.heads // a.kv_heads
    o = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                       is_causal=True)  # [B, H, T, hd]
    x = x + out_proj(a, o)  # [B, T, D]
    return x + mlp_fused(layer.mlp, w_gu, layer.post_attention_layernorm(x)), k, v
