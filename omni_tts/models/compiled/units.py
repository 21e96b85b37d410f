"""The projections the compiled units share: packed q|k|v with one norm + rope pass, packed gate|up, the
output projection, single-row projections as multiply-and-sum, and the predictor's short attention in
plain ops Inductor fuses. Tensors in, tensors out; used by the decode units (fast_path) and the prefill.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from omni_tts.models.layers import apply_rope, rms_norm

# Rows (batch x tokens) up to which a projection runs as multiply-and-sum: Inductor makes it one reduction
# kernel that reads the weight once and fuses its neighbours (cuBLAS's GEMV wins from two rows on).
GEMV_MAX_ROWS = 1


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, w, b); for at most GEMV_MAX_ROWS rows as a float32-accumulated multiply-and-sum."""
    rows = x.numel() // x.shape[-1]
    if 0 < rows <= GEMV_MAX_ROWS:
        y = (x[..., None, :].float() * w.float()).sum(-1)  # [..., N]
        return (y if b is None else y + b.float()).to(x.dtype)
    return F.linear(x, w, b)


def out_proj(attn: Any, a: torch.Tensor) -> torch.Tensor:
    """Attention.out through `linear`. a: [B, H, T, hd] -> [B, T, D]."""
    B, _, T, _ = a.shape
    return linear(a.transpose(1, 2).reshape(B, T, attn.heads * attn.head_dim), attn.o_proj.weight, attn.o_proj.bias)


def small_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """gqa_attention for a short cache (the predictor's 16 positions) in plain float32 ops, which Inductor
    fuses into a few kernels (SDPA was a cuDNN call plus a mask copy per layer and step).
    q: [B, H, T, hd]; k, v: [B, Hkv, M, hd]; mask: bool [1, 1, T, M] (True = attend). -> [B, H, T, hd]"""
    B, H, T, hd = q.shape
    Hkv, M = k.shape[1], k.shape[2]
    rep = H // Hkv
    qg = q.reshape(B, Hkv, rep * T, hd).float()  # [B, Hkv, rep*T, hd]: heads sharing a KV head
    s = (qg[:, :, :, None, :] * k[:, :, None, :, :].float()).sum(-1) * hd ** -0.5  # [B, Hkv, rep*T, M]
    m = mask.expand(1, 1, T, M)[:, :, None].expand(1, 1, rep, T, M).reshape(1, 1, rep * T, M)
    p = s.masked_fill(~m, float("-inf")).softmax(-1)  # [B, Hkv, rep*T, M]
    o = (p[..., None] * v[:, :, None, :, :].float()).sum(-2)  # [B, Hkv, rep*T, hd]
    return o.to(q.dtype).reshape(B, H, T, hd)


def qkv_fused(attn: Any, w: torch.Tensor, b: torch.Tensor | None, x: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention.qkv with one matmul and one norm + rope pass over q|k (same elementwise ops).
    x: [B, T, D] -> q [B, H, T, hd], k/v [B, Hkv, T, hd]."""
    B, T, _ = x.shape
    H, Hkv, hd = attn.heads, attn.kv_heads, attn.head_dim
    y = linear(x, w, b).view(B, T, H + 2 * Hkv, hd)  # [B, T, H + 2 Hkv, hd]
    norm_w = torch.cat([attn.q_norm.weight.expand(H, hd), attn.k_norm.weight.expand(Hkv, hd)])  # [H + Hkv, hd]
    qk = rms_norm(y[:, :, :H + Hkv], norm_w, attn.q_norm.eps).transpose(1, 2)  # [B, H + Hkv, T, hd]
    qk = apply_rope(qk, cos, sin)
    return qk[:, :H], qk[:, H:], y[:, :, H + Hkv:].transpose(1, 2)


def mlp_fused(mlp: Any, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """MLP with gate|up in one matmul. x: [B, T, D], w: [2 I, D] -> [B, T, D]."""
    gate, up = linear(x, w).chunk(2, dim=-1)  # [B, T, I] each
    return linear(mlp.act(gate) * up, mlp.down_proj.weight)
