"""Triton kernels implementing the talker's omni_tts.models.layers.DecoderLayer (omni_tts.models.talker) around
its attention, one new token per row, at small batch.

Owns: the talker layer around its attention in five kernels (norm + q|k|v, then q/k norm + rope with
K/V written at each row's own cache position; o + residual, norm + gate|up + SiLU, down + residual:
the projection kernel of omni_tts.kernels.layers). The attention between them stays the reference's.
Numerics follow the references to the dtype's rounding (float32 accumulation; the order of sums
differs). Knows nothing about graphs, buckets or requests; which batches use the kernels is the
caller's choice. Runs on CUDA; tests run it in Triton's CPU interpreter against the references.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_tts.kernels import layers as kernels
from omni_tts.kernels.configs import next_pow2

if kernels.triton is not None:
    import triton
    import triton.language as tl

    from omni_tts.kernels.layers import after_previous, lanes, normed_rope, rope_row, store_kv

    @triton.jit
    def _rope_cache_kernel(y_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, kc_ptr, vc_ptr, q_ptr, eps,
                           kc_row, kc_head, H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr,
                           BD: tl.constexpr, PDL: tl.constexpr):
        """Program (row b, KV head g) of a one-token talker step: K/V of head g normed + rotated into the
        cache at the row's own position pos[b]; the query heads sharing g normed + rotated into q [B, H, HD].
        y: [B, (H+2HKV)*HD]; cos/sin: [B, HD] (each row's position); kc/vc: [B, HKV, M, HD] strided."""
        dt = q_ptr.dtype.element_ty
        b, g, d, dm = lanes(HD, BD)
        REP: tl.constexpr = H // HKV
        HALF: tl.constexpr = HD // 2
        W: tl.constexpr = (H + 2 * HKV) * HD
        after_previous(PDL)
        cos, sin = rope_row(cos_ptr, sin_ptr, b * HD, d, dm)
        row = y_ptr + b * W
        at = b * kc_row + g * kc_head + tl.load(pos_ptr + b) * HD + d
        store_kv(row, g, kn_ptr, cos, sin, eps, kc_ptr + at, vc_ptr + at, d, dm, H, HKV, HD, dt)
        for r in tl.static_range(REP):
            h = g * REP + r
            q = normed_rope(row + h * HD, d, dm, HALF, HD, qn_ptr, cos, sin, eps, dt)
            tl.store(q_ptr + (b * H + h) * HD + d, q.to(dt), mask=dm)


def talker_attn_in(layer: Any, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None, x: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor,
                   pdl: bool = False) -> torch.Tensor:
    """The DecoderLayer before its attention (rows 0..B-1) in two kernels: input norm + q|k|v, then q/k norm +
    rope (Attention.qkv) and K/V written at each row's position. x: [B, 1, D]; cos/sin: [B, 1, hd]; kc/vc:
    [B, Hkv, M, hd] (last two dims contiguous); pos: [B]. -> q [B, H, 1, hd]"""
    attn = layer.self_attn
    B, _, D = x.shape
    H, Hkv, hd = attn.heads, attn.kv_heads, attn.head_dim
    assert kc.stride() == vc.stride() and kc.stride(3) == 1 and kc.stride(2) == hd
    y = kernels.projection(x.reshape(B, D), w_qkv, n=(H + 2 * Hkv) * hd, bias=b_qkv, norm=layer.input_layernorm,
                      pdl=pdl)  # y: [B, (H+2Hkv) hd]
    q = torch.empty(B, H, 1, hd, device=x.device, dtype=x.dtype)  # [B, H, 1, hd]
    _rope_cache_kernel[(B, Hkv)](y, attn.q_norm.weight, attn.k_norm.weight, cos.contiguous(), sin.contiguous(),
                                 pos, kc, vc, q, float(attn.q_norm.eps), kc.stride(0), kc.stride(1), H=H, HKV=Hkv,
                                 HD=hd, BD=next_pow2(hd), PDL=pdl, **kernels.launch_options(pdl, 1))
    return q


def talker_attn_out(layer: Any, w_gu: torch.Tensor, x: torch.Tensor, a: torch.Tensor, pdl: bool = False
                    ) -> torch.Tensor:
    """The DecoderLayer after its attention: o projection + residual, then the MLP block, in three kernels.
    x: [B, 1, D], a: [B, H, 1, hd] -> [B, 1, D]"""
    B, _, D = x.shape
    return kernels.mlp_block(layer, w_gu, x.reshape(B, D), a.reshape(B, -1), pdl).view(B, 1, D)


def probe(layer: Any, w: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor], batches: list[int],
          max_rows: int, dtype: torch.dtype, pdl: int = 0) -> str:
    """Build and run the talker kernels a capture will use, for every batch of at most max_rows rows,
    through `kernels.run_probe`; pdl: with PDL for batches of at most `pdl` rows. -> "" or why not, one
    line."""
    a, dev = layer.self_attn, layer.input_layernorm.weight.device
    D = layer.input_layernorm.weight.shape[0]

    def build() -> str:
        for b in (b for b in batches if b <= max_rows):
            if not kernels.supports(layer, b):
                return "the talker layer's activation or norms are not what the kernels implement"
            kc = torch.zeros(b, a.kv_heads, 4, a.head_dim, device=dev, dtype=dtype)
            pos = torch.zeros(b, dtype=torch.long, device=dev)
            x = torch.zeros(b, 1, D, device=dev, dtype=dtype)
            rope = torch.zeros(b, 1, a.head_dim, device=dev, dtype=dtype)
            q = talker_attn_in(layer, w[0], w[1], x, rope, rope, kc, torch.zeros_like(kc), pos, b <= pdl)
            talker_attn_out(layer, w[2], x, q, b <= pdl)
        return ""

    return kernels.run_probe(dev, build)
