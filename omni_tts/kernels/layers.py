"""Triton kernels implementing one step of the code predictor's omni_tts.models.layers.DecoderLayer over its
16-position KV cache (as omni_tts.models.code_predictor.CodePredictor runs it) at small batch.

Owns: one predictor layer step as five kernels instead of Inductor's many small ones (norms, cache
writes and softmax pieces):
  1. input RMSNorm (recomputed per program, the row is 2 KB) + q|k|v projection (+ bias)
  2. q/k RMSNorm + rotary + K/V written into the 16-position cache + attention over it, per KV head
  3. o projection + residual
  4. post-attention RMSNorm + gate|up projection + SiLU(gate) * up
  5. down projection + residual
and as four for one token of one row (up to ATTN_OUT_ROWS rows), 2 and 3 in one kernel
(omni_tts.kernels.attention: every program of the o projection computes the attention itself).
The projections run on tensor cores with the rows padded to 16 (memory-bound at these sizes, so 2..16
rows cost about the same), at most MAX_BM rows a program (more rows take a second column of programs,
whose weight reads mostly hit L2); a one-row step runs them as a multiply-and-sum over narrow weight tiles
(more programs reading the weights at once). The projection kernel (`projection`) also serves
omni_tts.kernels.talker and omni_tts.kernels.heads (its input rows may be strided or gathered from a
table). With `pdl` (programmatic dependent launch, Hopper+: omni_tts.kernels.launch) each kernel loads
what no kernel writes (its first weight tile) before `after_previous` waits for the previous kernel and
lets the next one launch. Launch configs per (rows, shape) come from omni_tts.kernels.configs. Numerics
follow the reference: float32 accumulation, values rounded to the model dtype where the reference rounds
(norm output, q/k after rope, each projection, SiLU, residual sums); the summation order differs, so
results agree to the dtype's rounding, not bit for bit. `predictor_layer` has the reference's contract
except that the positions are a Python int (static per captured graph) and the mask is implied (causal).
Knows nothing about graphs, buckets, sampling or requests; which batch sizes use it is the caller's
choice (`supports`). Runs on CUDA; tests run it in Triton's CPU interpreter (TRITON_INTERPRET=1)
against the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from omni_tts.errors import one_line
from omni_tts.kernels import attention
from omni_tts.kernels.configs import Config, config, next_pow2
from omni_tts.kernels.launch import INTERPRET, launch_options, triton

MAX_ROWS = 128  # batch x positions per call (the first step of a frame has 2 positions per row)
ATTN_OUT_ROWS = 1  # steps of at most this many rows fold the attention into the o projection
MAX_BM = 64  # rows per program of a tensor-core projection: more rows split over programs (shared memory)


def available() -> bool:
    return triton is not None


def supports(layer: Any, rows: int) -> bool:
    """True when these kernels can run `layer` for `rows` = batch x positions."""
    m = layer.mlp
    return (triton is not None and rows <= MAX_ROWS and m.act is torch.nn.functional.silu
            and layer.self_attn.q_norm.eps == layer.self_attn.k_norm.eps)


if triton is not None:
    import triton.language as tl

    from omni_tts.kernels.launch import after_previous

    @triton.jit
    def _dot(a, b, IEEE: tl.constexpr):
        if IEEE:  # float32 operands (or any, upcast, in the interpreter): no TF32 rounding
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b)

    @triton.jit
    def _mac(xk, wk, IEEE: tl.constexpr, VEC: tl.constexpr):
        """xk [BM, BK] times wk [BN, BK]^T -> [BM, BN] float32: a multiply-and-sum for a few rows (VEC: the
        weight tile can be narrow, so more programs share the weight reads), else tensor cores (BM, BN >= 16)."""
        if VEC:
            return tl.sum(wk[None, :, :].to(tl.float32) * xk[:, None, :].to(tl.float32), axis=2)
        return _dot(xk, tl.trans(wk), IEEE)

    @triton.jit
    def _w_block(w_ptr, rn, nmask, kk, N: tl.constexpr, K: tl.constexpr, GLU: tl.constexpr):
        """The weight tile [BN, BK] at columns kk (and its up half's with GLU; else the same tile again)."""
        wmask = nmask[:, None] & (kk < K)[None, :]
        wk = tl.load(w_ptr + rn[:, None] * K + kk[None, :], mask=wmask, other=0.0)
        wu = wk
        if GLU:
            wu = tl.load(w_ptr + (rn[:, None] + N) * K + kk[None, :], mask=wmask, other=0.0)
        return wk, wu

    @triton.jit
    def _x_block(x_ptr, nw_ptr, xoff, mmask, kk, rstd, K: tl.constexpr, NORM: tl.constexpr, dt: tl.constexpr):
        """The input tile [BM, BK] at columns kk of the rows at offsets xoff [BM], RMS-normed (rstd [BM]) and
        scaled by nw with NORM."""
        kmask = kk < K
        xk = tl.load(x_ptr + xoff[:, None] + kk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
        if NORM:
            h = (xk.to(tl.float32) * rstd[:, None]).to(dt).to(tl.float32)
            nw = tl.load(nw_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
            xk = (nw[None, :] * h).to(dt)
        return xk

    @triton.jit
    def _proj_kernel(x_ptr, idx_ptr, nw_ptr, w_ptr, b_ptr, res_ptr, out_ptr, eps, sx, M: tl.constexpr,
                     N: tl.constexpr, K: tl.constexpr,
                     NORM: tl.constexpr, BIAS: tl.constexpr, RES: tl.constexpr, GLU: tl.constexpr,
                     GATHER: tl.constexpr, IEEE: tl.constexpr, VEC: tl.constexpr, PDL: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        """Program (N block, M block) of out[M, N] = epilogue(prologue(x[M, K]) @ w[N, K]^T), x's rows sx
        apart (GATHER: x is a table and row m is its row idx[m]). NORM: x is RMS-normed with nw first; GLU:
        w has 2N rows (gate then up) and out = silu(gate) * up; RES: out += res[M, N]. PDL (programmatic
        dependent launch, Hopper+): the first weight tile loads while the previous kernel is still running;
        everything that kernel writes (x, idx, res) is read after gdc_wait."""
        dt = out_ptr.dtype.element_ty
        rm = tl.program_id(1) * BM + tl.arange(0, BM)
        rn = tl.program_id(0) * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        mmask, nmask = rm < M, rn < N
        wk, wu = _w_block(w_ptr, rn, nmask, rk, N, K, GLU)  # [BN, BK]: weights never depend on the last kernel
        after_previous(PDL)
        if GATHER:
            xoff = tl.load(idx_ptr + rm, mask=mmask, other=0).to(tl.int64) * K  # [BM] table rows
        else:
            xoff = rm.to(tl.int64) * sx
        rstd = tl.zeros([BM], tl.float32)
        if NORM:
            ss = tl.zeros([BM], tl.float32)
            for k0 in range(0, K, BK):
                kk = k0 + rk
                xs = tl.load(x_ptr + xoff[:, None] + kk[None, :], mask=mmask[:, None] & (kk[None, :] < K), other=0.0)
                xs = xs.to(tl.float32)
                ss += tl.sum(xs * xs, axis=1)
            rstd = tl.rsqrt(ss / K + eps)  # [BM]
        xk = _x_block(x_ptr, nw_ptr, xoff, mmask, rk, rstd, K, NORM, dt)  # [BM, BK]
        acc = _mac(xk, wk, IEEE, VEC)  # [BM, BN]
        acc2 = tl.zeros([BM, BN], tl.float32)
        if GLU:
            acc2 += _mac(xk, wu, IEEE, VEC)
        for k0 in range(BK, K, BK):
            kk = k0 + rk
            wk, wu = _w_block(w_ptr, rn, nmask, kk, N, K, GLU)
            xk = _x_block(x_ptr, nw_ptr, xoff, mmask, kk, rstd, K, NORM, dt)
            acc += _mac(xk, wk, IEEE, VEC)
            if GLU:
                acc2 += _mac(xk, wu, IEEE, VEC)
        if BIAS:
            acc += tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)[None, :]
        y = acc.to(dt)
        if GLU:
            g = y.to(tl.float32)
            s = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
            y = (s * acc2.to(dt).to(tl.float32)).to(dt)
        omask = mmask[:, None] & nmask[None, :]
        if RES:
            r = tl.load(res_ptr + rm[:, None] * N + rn[None, :], mask=omask, other=0.0)
            y = (r.to(tl.float32) + y.to(tl.float32)).to(dt)
        tl.store(out_ptr + rm[:, None] * N + rn[None, :], y, mask=omask)


def projection(x: torch.Tensor, w: torch.Tensor, *, n: int, bias: torch.Tensor | None = None,
          norm: Any = None, res: torch.Tensor | None = None, glu: bool = False, cfg: Config | None = None,
          pdl: bool = False, idx: torch.Tensor | None = None) -> torch.Tensor:
    """x: [M, K] (rows may be strided; the last dim contiguous) -> [M, n] (see _proj_kernel); w: [n, K], or
    [2n, K] with glu. idx: [M] row ids into the table x [rows, K] (then x's rows are gathered)."""
    assert x.stride(-1) == 1
    K = x.shape[1]
    M = x.shape[0] if idx is None else idx.shape[0]
    out = torch.empty(M, n, device=x.device, dtype=x.dtype)
    BN, BK, stages, warps, vec = cfg or config(M, n, K)
    if x.element_size() > 2 and not vec:  # float32 tiles: half as wide, or the stages overflow shared memory
        BK = max(32, BK // 2)
    dummy = x
    BM = next_pow2(M) if vec else min(MAX_BM, max(16, next_pow2(M)))
    _proj_kernel[(triton.cdiv(n, BN), triton.cdiv(M, BM))](
        x, idx if idx is not None else dummy, norm.weight if norm is not None else dummy, w,
        bias if bias is not None else dummy, res if res is not None else dummy, out,
        float(norm.eps) if norm is not None else 0.0, x.stride(0), M=M, N=n, K=K,
        NORM=norm is not None, BIAS=bias is not None, RES=res is not None, GLU=glu, GATHER=idx is not None,
        # Triton's CPU interpreter (3.6) multiplies bfloat16 dot operands wrongly: upcast them there (the
        # products of bfloat16 values are exact in float32, as in the GPU's bfloat16 MMA with float32 accumulation)
        IEEE=x.dtype == torch.float32 or INTERPRET, VEC=vec, PDL=pdl,
        BM=BM, BN=BN, BK=BK, **launch_options(pdl, warps, stages))
    return out


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
          sin: torch.Tensor, batches: list[int], max_rows: int, pdl: bool = False) -> str:
    """Run the predictor `layer` once for every (batch, 1 or 2 positions) of at most max_rows rows that a
    capture will use (`run_probe`). -> "" or why not, in one line."""
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
                predictor_layer(layer, *w, x, cos, sin, kc, torch.zeros_like(kc), 0, pdl)
        return ""

    return run_probe(dev, build)


def predictor_layer(layer: Any, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None, w_gu: torch.Tensor,
                    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                    pos0: int, pdl: bool = False) -> torch.Tensor:
    """The predictor DecoderLayer (input norm, Attention.qkv, K/V written into the cache, causal attention over
    it, o projection + residual, MLP block) in five kernels, four for one token of one row (its attention
    folded into the o projection: `attention.attend_out`). x: [B, T, d] at positions pos0..pos0+T-1; cos/sin:
    the rope table [1, P, hd] of all P cache positions; kc/vc: [B, Hkv, P, hd] (written). pdl: launch them
    with programmatic dependent launch (`launch.pdl_available`). -> [B, T, d]"""
    attn = layer.self_attn
    B, T, D = x.shape
    x2 = x.reshape(B * T, D)  # [M, d]
    y = projection(x2, w_qkv, n=(attn.heads + 2 * attn.kv_heads) * attn.head_dim, bias=b_qkv,
                   norm=layer.input_layernorm, pdl=pdl)  # [M, (H+2Hkv) hd]
    if B * T <= ATTN_OUT_ROWS:
        x1 = attention.attend_out(attn, y, x2, cos, sin, kc, vc, pos0, pdl)  # [M, d]
    else:
        x1 = projection(attention.attend(attn, y, cos, sin, kc, vc, pos0, T, pdl), attn.o_proj.weight, n=D,
                        bias=attn.o_proj.bias, res=x2, pdl=pdl)  # [M, d]
    return mlp(layer, w_gu, x1, pdl).view(B, T, D)  # [B, T, d]


def mlp_block(layer: Any, w_gu: torch.Tensor, x: torch.Tensor, a: torch.Tensor, pdl: bool) -> torch.Tensor:
    """x [M, D] + o_proj(a [M, H hd]), then + the MLP of its post-attention norm -> [M, D] (three kernels)."""
    attn, D = layer.self_attn, x.shape[1]
    return mlp(layer, w_gu, projection(a, attn.o_proj.weight, n=D, bias=attn.o_proj.bias, res=x, pdl=pdl), pdl)


def mlp(layer: Any, w_gu: torch.Tensor, x: torch.Tensor, pdl: bool) -> torch.Tensor:
    """x [M, D] + the MLP of its post-attention norm -> [M, D] (two kernels)."""
    m = projection(x, w_gu, n=w_gu.shape[0] // 2, norm=layer.post_attention_layernorm, glu=True, pdl=pdl)  # [M, I]
    return projection(m, layer.mlp.down_proj.weight, n=x.shape[1], res=x, pdl=pdl)  # [M, D]
