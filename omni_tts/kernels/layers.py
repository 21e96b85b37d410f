"""Triton kernels implementing one step of the code predictor's omni_tts.models.layers.DecoderLayer over its
16-position KV cache (as omni_tts.models.code_predictor.CodePredictor runs it) at small batch.

Owns: one predictor layer step as five kernels instead of Inductor's many small ones (norms, cache
writes and softmax pieces):
  1. input RMSNorm + q|k|v projection (+ bias)
  2. q/k RMSNorm + rotary + K/V written into the 16-position cache + attention over it, per query head
  3. o projection + residual
  4. post-attention RMSNorm + gate|up projection + SiLU(gate) * up
  5. down projection + residual
the projections on omni_tts.kernels.projection (each RMSNorm its prologue, or from FOLD_ROWS rows folded into a
copy of its weight); the per-head helpers of the attention (`normed_rope`, `store_kv`, ...), which
omni_tts.kernels.talker shares; the kernel probes (`run_probe`, `probe`). Numerics follow the reference: float32
accumulation, values rounded to the model dtype where the reference rounds (q/k after rope, as the projection
kernel for the rest); the summation order differs, so results agree to the dtype's rounding, not bit for bit.
`predictor_layer` has the reference's contract except that the positions are a Python int (static per captured
graph) and the mask is implied (causal). Knows nothing about graphs, buckets, sampling or requests; which batch
sizes use it is the caller's choice (`supports`). Runs on CUDA; tests run it in Triton's CPU interpreter
(TRITON_INTERPRET=1) against the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from omni_tts.errors import one_line
from omni_tts.kernels.configs import next_pow2
from omni_tts.kernels.projection import launch_options, normed_projection, projection

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the engine uses the Inductor path
    triton = None

MAX_ROWS = 128  # batch x positions per call (the first step of a frame has 2 positions per row)


def available() -> bool:
    return triton is not None


def supports(layer: Any, rows: int) -> bool:
    """True when these kernels can run `layer` for `rows` = batch x positions."""
    m = layer.mlp
    return (triton is not None and rows <= MAX_ROWS and m.act is torch.nn.functional.silu
            and layer.self_attn.q_norm.eps == layer.self_attn.k_norm.eps)


if triton is not None:
    from omni_tts.kernels.projection import after_previous

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
        """This program's (row b, head: program axis 1) and its head-dim lanes d [BD] with their mask (d < HD)."""
        d = tl.arange(0, BD)
        return tl.program_id(0), tl.program_id(1), d, d < HD

    @triton.jit
    def rope_row(cos_ptr, sin_ptr, off, d, dm):
        """The rotary table's row at offset `off` (one position): cos, sin [BD] in float32."""
        cos = tl.load(cos_ptr + off + d, mask=dm, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + off + d, mask=dm, other=0.0).to(tl.float32)
        return cos, sin

    @triton.jit
    def store_kv(row, g, kn_ptr, cos, sin, eps, k_at, v_at, d, dm, wm, H: tl.constexpr, HKV: tl.constexpr,
                  HD: tl.constexpr, dt: tl.constexpr):
        """KV head g of one token's q|k|v row (`row`: [(H+2HKV)*HD]): K RMS-normed with kn and rotated, stored
        at the pointers k_at [BD]; V stored as it is at v_at; both where wm (dm, or less where another program
        writes them) -> (k dt-rounded in float32, v): the values the cache holds."""
        k = normed_rope(row + (H + g) * HD, d, dm, HD // 2, HD, kn_ptr, cos, sin, eps, dt)
        v = tl.load(row + (H + HKV + g) * HD + d, mask=dm, other=0.0)
        tl.store(k_at, k.to(dt), mask=wm)
        tl.store(v_at, v, mask=wm)
        return k, v

    @triton.jit
    def _attn_kernel(y_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, kc_ptr, vc_ptr, out_ptr, pos0, eps, scale,
                     T: tl.constexpr, H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, P: tl.constexpr,
                     BD: tl.constexpr, BP: tl.constexpr, PDL: tl.constexpr):
        """Program (row b, query head h): normed + rotated K/V of positions pos0..pos0+T-1 of h's KV head g
        into the cache [B, HKV, P, HD], then h's causal attention over it. y: [B*T, (H+2HKV)*HD]. The REP
        programs of one KV head each write its new K/V (the same values) and attend over them as computed,
        the earlier positions read from the cache: no program waits for another, nor for its own stores."""
        dt = out_ptr.dtype.element_ty
        b, h, d, dm = lanes(HD, BD)
        g = h // (H // HKV)
        HALF: tl.constexpr = HD // 2
        W: tl.constexpr = (H + 2 * HKV) * HD
        p = tl.arange(0, BP)
        cache = (b * HKV + g) * P * HD
        # the earlier positions, written by this layer's kernel of an earlier step, load before the wait
        earlier = (p[:, None] < pos0) & dm[None, :]
        kk = tl.load(kc_ptr + cache + p[:, None] * HD + d[None, :], mask=earlier, other=0.0).to(tl.float32)  # [BP, BD]
        vv = tl.load(vc_ptr + cache + p[:, None] * HD + d[None, :], mask=earlier, other=0.0).to(tl.float32)
        after_previous(PDL)
        for t in tl.static_range(T):
            row = y_ptr + (b * T + t) * W
            cos, sin = rope_row(cos_ptr, sin_ptr, (pos0 + t) * HD, d, dm)
            at = cache + (pos0 + t) * HD + d
            k, v = store_kv(row, g, kn_ptr, cos, sin, eps, kc_ptr + at, vc_ptr + at, d, dm, dm, H, HKV, HD, dt)
            new = (p == pos0 + t)[:, None]
            kk = tl.where(new, k[None, :], kk)
            vv = tl.where(new, v.to(tl.float32)[None, :], vv)
        for t in tl.static_range(T):
            row = y_ptr + (b * T + t) * W
            cos, sin = rope_row(cos_ptr, sin_ptr, (pos0 + t) * HD, d, dm)
            q = normed_rope(row + h * HD, d, dm, HALF, HD, qn_ptr, cos, sin, eps, dt)
            s = tl.sum(q[None, :] * kk, axis=1) * scale  # [BP]
            s = tl.where(p <= pos0 + t, s, float("-inf"))
            w = tl.exp(s - tl.max(s, axis=0))
            w = w / tl.sum(w, axis=0)
            o = tl.sum(w[:, None] * vv, axis=0)  # [BD]
            tl.store(out_ptr + (b * T + t) * H * HD + h * HD + d, o.to(dt), mask=dm)


def run_probe(device: torch.device, build: Callable[[], str]) -> str:
    """The frame of every kernel probe: `build` launches the kernels a capture will use (so each variant
    compiles now) and returns '' or why they do not apply; waits for the device. -> '' or the reason, or
    the first error in one line (a GPU whose Triton cannot build them, e.g. too little shared memory, no
    bfloat16 tensor cores, no programmatic dependent launch): the caller then keeps Inductor's kernels."""
    try:
        why = build()
        if not why and device.type == "cuda":
            torch.cuda.synchronize(device)
        return why
    except Exception as e:  # compile or launch failure
        return one_line(e)


def probe(layer: Any, w: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor], cos: torch.Tensor,
          sin: torch.Tensor, batches: list[int], max_rows: int, pdl: bool = False,
          folded: tuple[torch.Tensor, torch.Tensor] | None = None) -> str:
    """Run the predictor `layer` once for every (batch, 1 or 2 positions) of at most max_rows rows that a
    capture will use (`run_probe`; folded: as predictor_layer takes it). -> "" or why not, in one line."""
    a, dev = layer.self_attn, cos.device
    width = layer.input_layernorm.weight.shape[0]

    def build() -> str:
        for b in batches:
            for T in (1, 2):
                if b * T > max_rows:
                    continue
                if not supports(layer, b * T):
                    return "this layer's activation or norms are not what the kernels implement"
                x = torch.zeros(b, T, width, device=dev, dtype=cos.dtype)
                kc = torch.zeros(b, a.kv_heads, cos.shape[1], a.head_dim, device=dev, dtype=cos.dtype)
                predictor_layer(layer, *w, x, cos, sin, kc, torch.zeros_like(kc), 0, pdl, folded)
        return ""

    return run_probe(dev, build)


def predictor_layer(layer: Any, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None, w_gu: torch.Tensor,
                    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                    pos0: int, pdl: bool = False, folded: tuple[torch.Tensor, torch.Tensor] | None = None
                    ) -> torch.Tensor:
    """The predictor DecoderLayer (input norm, Attention.qkv, K/V written into the cache, causal attention over
    it, o projection + residual, MLP block) in five kernels. x: [B, T, d] at positions pos0..pos0+T-1; cos/sin:
    the rope table [1, P, hd] of all P cache positions; kc/vc: [B, Hkv, P, hd] (written). pdl: launch them with
    programmatic dependent launch (`pdl_available`). folded: w_qkv and w_gu with the input and post-attention
    norms' weights folded in (packed_weights.fold_norm), which steps of FOLD_ROWS rows or more take. -> [B, T, d]"""
    attn = layer.self_attn
    B, T, D = x.shape
    H, Hkv, hd, P = attn.heads, attn.kv_heads, attn.head_dim, kc.shape[2]
    x2 = x.reshape(B * T, D)  # [M, d]
    fq, fgu = folded if folded is not None else (None, None)
    y = normed_projection(x2, w_qkv, layer.input_layernorm, n=(H + 2 * Hkv) * hd, bias=b_qkv, pdl=pdl,
                          w_folded=fq)  # [M, (H+2Hkv) hd]
    a = torch.empty(B * T, H * hd, device=x.device, dtype=x.dtype)  # [M, H hd]
    _attn_kernel[(B, H)](y, attn.q_norm.weight, attn.k_norm.weight, cos.reshape(-1, hd), sin.reshape(-1, hd),
                         kc, vc, a, pos0, float(attn.q_norm.eps), hd ** -0.5, T=T, H=H, HKV=Hkv, HD=hd, P=P,
                         BD=next_pow2(hd), BP=next_pow2(P), PDL=pdl,
                         **launch_options(pdl, 1))  # 1 warp: fastest on the H200
    return mlp_block(layer, w_gu, x2, a, pdl, fgu).view(B, T, D)  # [B, T, d]


def mlp_block(layer: Any, w_gu: torch.Tensor, x: torch.Tensor, a: torch.Tensor, pdl: bool,
              w_gu_folded: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, D] + o_proj(a [M, H hd]), then + the MLP of its post-attention norm -> [M, D] (three kernels);
    w_gu_folded: w_gu with the norm's weight folded in (`normed_projection`)."""
    attn, D = layer.self_attn, x.shape[1]
    x1 = projection(a, attn.o_proj.weight, n=D, bias=attn.o_proj.bias, res=x, pdl=pdl)  # [M, D]
    m = normed_projection(x1, w_gu, layer.post_attention_layernorm, n=w_gu.shape[0] // 2, glu=True, pdl=pdl,
                          w_folded=w_gu_folded)  # [M, I]
    return projection(m, layer.mlp.down_proj.weight, n=D, res=x1, pdl=pdl)  # [M, D]
