"""Triton kernels for the per-head work of omni_tts.models.layers.Attention at decode: q/k RMSNorm + rotary,
K/V written into a cache, and the code predictor's attention over its 16-position cache.

Owns the helpers the talker's kernels share (`normed_rope`, `rope_row`, `store_kv`, `lanes`) and the
predictor's attention in two forms: `attend` (its own kernel, one program per row and KV head: K/V of
the new positions written, causal attention of the query heads sharing it) and `attend_out` (one token
per row: the attention folded into the o projection + residual, so a one-row layer step is four kernels,
not five; every program of the projection computes all heads' attention from the cache in L2, reading
the new position's K/V from q|k|v rather than from the cache it writes). Numerics follow the reference:
float32 math, q/k after rope and the attention output rounded to the model dtype where the reference
rounds. Knows nothing about graphs, buckets or requests. Runs on CUDA; tests run it in Triton's CPU
interpreter against the reference.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_tts.kernels.configs import config, next_pow2
from omni_tts.kernels.launch import launch_options, triton

if triton is not None:
    import triton.language as tl

    from omni_tts.kernels.launch import after_previous

    @triton.jit
    def normed_rope(base, d, dm, HALF: tl.constexpr, HD: tl.constexpr, nw_ptr, cos, sin, eps,
                     dt: tl.constexpr):
        """One head's vector at `base` ([HD] in y): RMS-normed with nw, rotated (rotate-half) -> fp32 [BD]."""
        a = tl.load(base + d, mask=dm, other=0.0).to(tl.float32)
        partner = tl.where(d < HALF, d + HALF, d - HALF)
        b = tl.load(base + partner, mask=dm, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(a * a, axis=0) / HD + eps)
        na = (tl.load(nw_ptr + d, mask=dm, other=0.0).to(tl.float32) * (a * rstd).to(dt).to(tl.float32)).to(dt)
        nb = (tl.load(nw_ptr + partner, mask=dm, other=0.0).to(tl.float32) * (b * rstd).to(dt).to(tl.float32)).to(dt)
        rot = tl.where(d < HALF, -nb.to(tl.float32), nb.to(tl.float32))
        return (na.to(tl.float32) * cos + rot * sin).to(dt).to(tl.float32)

    @triton.jit
    def lanes(HD: tl.constexpr, BD: tl.constexpr):
        """This program's (row b, KV head g) and its head-dim lanes d [BD] with their mask (d < HD)."""
        d = tl.arange(0, BD)
        return tl.program_id(0), tl.program_id(1), d, d < HD

    @triton.jit
    def rope_row(cos_ptr, sin_ptr, off, d, dm):
        """The rotary table's row at offset `off` (one position): cos, sin [BD] in float32."""
        cos = tl.load(cos_ptr + off + d, mask=dm, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + off + d, mask=dm, other=0.0).to(tl.float32)
        return cos, sin

    @triton.jit
    def store_kv(row, g, kn_ptr, cos, sin, eps, k_at, v_at, d, dm, H: tl.constexpr, HKV: tl.constexpr,
                  HD: tl.constexpr, dt: tl.constexpr):
        """KV head g of one token's q|k|v row (`row`: [(H+2HKV)*HD]): K RMS-normed with kn and rotated, stored
        at the pointers k_at [BD]; V stored as it is at v_at."""
        k = normed_rope(row + (H + g) * HD, d, dm, HD // 2, HD, kn_ptr, cos, sin, eps, dt)
        v = tl.load(row + (H + HKV + g) * HD + d, mask=dm, other=0.0)
        tl.store(k_at, k.to(dt), mask=dm)
        tl.store(v_at, v, mask=dm)

    @triton.jit
    def _attn_kernel(y_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, out_ptr, pos0, eps, scale,
                     T: tl.constexpr, H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, P: tl.constexpr,
                     BD: tl.constexpr, BP: tl.constexpr, PDL: tl.constexpr):
        """Program (row b, KV head g): normed + rotated K/V of positions pos0..pos0+T-1 into the cache
        [B, HKV, P, HD], then causal attention of the REP query heads sharing g. y: [B*T, (H+2HKV)*HD]."""
        dt = out_ptr.dtype.element_ty
        after_previous(PDL)
        b, g, d, dm = lanes(HD, BD)
        REP: tl.constexpr = H // HKV
        HALF: tl.constexpr = HD // 2
        W: tl.constexpr = (H + 2 * HKV) * HD
        p = tl.arange(0, BP)
        cache = (b * HKV + g) * P * HD
        for t in tl.static_range(T):
            cos, sin = rope_row(cos_ptr, sin_ptr, (pos0 + t) * HD, d, dm)
            at = cache + (pos0 + t) * HD + d
            store_kv(y_ptr + (b * T + t) * W, g, kn_ptr, cos, sin, eps, kc_ptr + at, vc_ptr + at, d, dm, H, HKV, HD,
                      dt)
        tl.debug_barrier()  # the cache rows just written are read below by other threads
        kvmask = (p[:, None] < P) & dm[None, :]
        kk = tl.load(kc_ptr + cache + p[:, None] * HD + d[None, :], mask=kvmask, other=0.0).to(tl.float32)  # [BP, BD]
        vv = tl.load(vc_ptr + cache + p[:, None] * HD + d[None, :], mask=kvmask, other=0.0).to(tl.float32)
        for t in tl.static_range(T):
            row = y_ptr + (b * T + t) * W
            cos, sin = rope_row(cos_ptr, sin_ptr, (pos0 + t) * HD, d, dm)
            for r in tl.static_range(REP):
                h = g * REP + r
                q = normed_rope(row + h * HD, d, dm, HALF, HD, qn_ptr, cos, sin, eps, dt)
                s = tl.sum(q[None, :] * kk, axis=1) * scale  # [BP]
                s = tl.where(p <= pos0 + t, s, float("-inf"))
                w = tl.exp(s - tl.max(s, axis=0))
                w = w / tl.sum(w, axis=0)
                o = tl.sum(w[:, None] * vv, axis=0)  # [BD]
                tl.store(out_ptr + (b * T + t) * H * HD + h * HD + d, o.to(dt), mask=dm)

    @triton.jit
    def _attn_out_kernel(y_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, w_ptr, b_ptr, res_ptr, out_ptr,
                         pos0, eps, scale, N: tl.constexpr, H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr,
                         P: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
                         BIAS: tl.constexpr, PDL: tl.constexpr):
        """Program (output block n, row b) of one token at position pos0: the causal attention of every head
        over the cache [B, HKV, P, HD] (positions < pos0) and the new K/V (normed + rotated from y: [B, (H+2HKV)*HD]),
        then out[b, block] = res[b, block] + o_proj. Program n = 0 also writes the new K/V into the cache."""
        dt = out_ptr.dtype.element_ty
        REP: tl.constexpr = H // HKV
        HALF: tl.constexpr = HD // 2
        W: tl.constexpr = (H + 2 * HKV) * HD
        n, b = tl.program_id(0), tl.program_id(1)
        rn = n * BN + tl.arange(0, BN)
        hh, d, p = tl.arange(0, BH), tl.arange(0, BD), tl.arange(0, BP)
        dm, nmask = d < HD, rn < N
        wmask = nmask[:, None, None] & (hh < H)[None, :, None] & dm[None, None, :]
        wt = tl.load(w_ptr + rn[:, None, None] * (H * HD) + hh[None, :, None] * HD + d[None, None, :], mask=wmask,
                     other=0.0)  # [BN, BH, BD]: the weights never depend on the previous kernel
        after_previous(PDL)
        cos, sin = rope_row(cos_ptr, sin_ptr, pos0 * HD, d, dm)
        row = y_ptr + b * W
        past, new = (p < pos0)[:, None] & dm[None, :], (p == pos0)[:, None]
        a = tl.zeros([BH, BD], tl.float32)  # every head's attention output, rounded to the dtype
        for g in tl.static_range(HKV):
            cache = kc_ptr + (b * HKV + g) * P * HD
            at = (b * HKV + g) * P * HD + pos0 * HD + d
            k = normed_rope(row + (H + g) * HD, d, dm, HALF, HD, kn_ptr, cos, sin, eps, dt)  # [BD]
            v = tl.load(row + (H + HKV + g) * HD + d, mask=dm, other=0.0)
            tl.store(kc_ptr + at, k.to(dt), mask=dm & (n == 0))
            tl.store(vc_ptr + at, v, mask=dm & (n == 0))
            kk = tl.load(cache + p[:, None] * HD + d[None, :], mask=past, other=0.0).to(tl.float32)  # [BP, BD]
            vv = tl.load(vc_ptr + (b * HKV + g) * P * HD + p[:, None] * HD + d[None, :], mask=past,
                         other=0.0).to(tl.float32)
            kk = tl.where(new, k[None, :], kk)
            vv = tl.where(new, v.to(tl.float32)[None, :], vv)
            for r in tl.static_range(REP):
                q = normed_rope(row + (g * REP + r) * HD, d, dm, HALF, HD, qn_ptr, cos, sin, eps, dt)
                s = tl.where(p <= pos0, tl.sum(q[None, :] * kk, axis=1) * scale, float("-inf"))  # [BP]
                e = tl.exp(s - tl.max(s, axis=0))
                o = tl.sum((e / tl.sum(e, axis=0))[:, None] * vv, axis=0)  # [BD]
                a = tl.where((hh == g * REP + r)[:, None], o.to(dt).to(tl.float32)[None, :], a)
        acc = tl.sum(tl.sum(wt.to(tl.float32) * a[None, :, :], axis=2), axis=1)  # [BN]
        if BIAS:
            acc += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
        res = tl.load(res_ptr + b * N + rn, mask=nmask, other=0.0).to(tl.float32)
        tl.store(out_ptr + b * N + rn, (res + acc.to(dt).to(tl.float32)).to(dt), mask=nmask)


def attend(attn: Any, y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
           pos0: int, T: int, pdl: bool) -> torch.Tensor:
    """The predictor's attention for B rows of T new positions pos0..: y [B*T, (H+2Hkv)*hd] (q|k|v), cos/sin
    the rope table [1, P, hd], kc/vc [B, Hkv, P, hd] (the new positions written). -> [B*T, H*hd]"""
    H, Hkv, hd, P = attn.heads, attn.kv_heads, attn.head_dim, kc.shape[2]
    B = y.shape[0] // T
    a = torch.empty(B * T, H * hd, device=y.device, dtype=y.dtype)  # [M, H hd]
    _attn_kernel[(B, Hkv)](y, attn.q_norm.weight, attn.k_norm.weight, cos.reshape(-1, hd), sin.reshape(-1, hd),
                           kc, vc, a, pos0, float(attn.q_norm.eps), hd ** -0.5, T=T, H=H, HKV=Hkv, HD=hd, P=P,
                           BD=next_pow2(hd), BP=next_pow2(P), PDL=pdl,
                           **launch_options(pdl, 1))  # 1 warp: fastest on the H200
    return a


def attend_out(attn: Any, y: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               kc: torch.Tensor, vc: torch.Tensor, pos0: int, pdl: bool) -> torch.Tensor:
    """x + o_proj(attention) for one new token per row at position pos0, in one kernel (`_attn_out_kernel`):
    y [B, (H+2Hkv)*hd] (q|k|v), x [B, D] (the residual), cos/sin the rope table [1, P, hd], kc/vc
    [B, Hkv, P, hd] (position pos0 written). -> [B, D]"""
    H, Hkv, hd, P = attn.heads, attn.kv_heads, attn.head_dim, kc.shape[2]
    B, D = x.shape
    w = attn.o_proj.weight  # [D, H hd]
    out = torch.empty_like(x)
    BN, _, _, warps, _ = config(1, D, H * hd)
    _attn_out_kernel[(triton.cdiv(D, BN), B)](
        y, attn.q_norm.weight, attn.k_norm.weight, cos.reshape(-1, hd), sin.reshape(-1, hd), kc, vc, w,
        attn.o_proj.bias if attn.o_proj.bias is not None else w, x, out, pos0, float(attn.q_norm.eps), hd ** -0.5,
        N=D, H=H, HKV=Hkv, HD=hd, P=P, BH=next_pow2(H), BD=next_pow2(hd), BP=next_pow2(P), BN=BN,
        BIAS=attn.o_proj.bias is not None, PDL=pdl, **launch_options(pdl, warps))
    return out
