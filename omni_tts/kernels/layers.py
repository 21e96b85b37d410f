"""Triton kernels implementing one step of the code predictor's omni_tts.models.layers.DecoderLayer over its
16-position KV cache (as omni_tts.models.code_predictor.CodePredictor runs it) at small batch.

Owns: one predictor layer step as five kernels instead of Inductor's many small ones (norms, cache
writes and softmax pieces):
  1. input RMSNorm + q|k|v projection (+ bias)
  2. q/k RMSNorm + rotary + K/V written into the 16-position cache + attention over it, per query head
  3. o projection + residual
  4. post-attention RMSNorm + gate|up projection + SiLU(gate) * up
  5. down projection + residual
Each RMSNorm is its projection's prologue; from FOLD_ROWS rows, given a copy of the projection's weight with the
norm's weight folded in (`projection(folded=True)`), the input instead streams as it is and each row's 1/rms
scales its sums.
The projections run on tensor cores with the rows padded to 16 (memory-bound at these sizes, so 2..16 rows cost
about the same; a tile may hold whole rows of narrow inputs, loaded at once), at most MAX_BM rows a program (more
rows take a second column of programs, whose weight reads mostly hit L2); a one-row step runs them as a
multiply-and-sum over narrow weight tiles of whole rows, or of pieces of the widest rows in a pipelined loop (more
programs reading the weights at once), as do two rows where omni_tts.kernels.configs says so (each row in turn
against a whole-row tile). `projection` and `store_kv` also serve
omni_tts.kernels.talker and omni_tts.kernels.heads (the projection's input rows may be strided). With `pdl`
(programmatic dependent launch, Hopper+: `pdl_available`) each kernel loads what no kernel writes (its first weight
tile) before `after_previous` waits for the previous kernel and lets the next one launch. Numerics follow the
reference: float32 accumulation, values rounded to the model dtype where the reference rounds (norm output, q/k
after rope, each projection, SiLU, residual sums; a folded norm's weights instead of its output); the summation
order differs, so results agree to the dtype's rounding, not bit for bit. `predictor_layer` has the reference's
contract except that the positions are a Python int (static per captured graph) and the mask is implied (causal).
Knows nothing about graphs, buckets, sampling or requests; which batch sizes use it is the caller's choice
(`supports`). Runs on CUDA; tests run it in Triton's CPU interpreter (TRITON_INTERPRET=1) against the reference.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from omni_tts.errors import one_line
from omni_tts.kernels.configs import Config, config, next_pow2

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the engine uses the Inductor path
    triton = None
try:  # grid dependency control (programmatic dependent launch), Triton >= 3.4
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:
    gdc_wait = gdc_launch_dependents = None

# Triton's CPU interpreter (3.6) multiplies bfloat16 dot operands wrongly: upcast them there (the products
# of bfloat16 values are exact in float32, as in the GPU's bfloat16 MMA with float32 accumulation)
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
MAX_ROWS = 128  # batch x positions per call (the first step of a frame has 2 positions per row)
MAX_BM = 64  # rows per program of a tensor-core projection: more rows split over programs (shared memory)
# from this many rows a normed projection takes the norm folded into its weight: the input tiles then stream
# unchanged into the tensor-core pipeline, which pays there; below, the prologue's pass over the rows costs less
FOLD_ROWS = 33


def available() -> bool:
    return triton is not None


def supports(layer: Any, rows: int) -> bool:
    """True when these kernels can run `layer` for `rows` = batch x positions."""
    m = layer.mlp
    return (triton is not None and rows <= MAX_ROWS and m.act is torch.nn.functional.silu
            and layer.self_attn.q_norm.eps == layer.self_attn.k_norm.eps)


if triton is not None:
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
            if xk.shape[0] == 1:  # summed in the weight tile's own layout: the 3-D product moves it through
                return tl.sum(wk.to(tl.float32) * xk.to(tl.float32), axis=1)[None, :]  # shared memory
            return tl.sum(wk[None, :, :].to(tl.float32) * xk[:, None, :].to(tl.float32), axis=2)
        return _dot(xk, tl.trans(wk), IEEE)

    @triton.jit
    def after_previous(PDL: tl.constexpr):
        """With programmatic dependent launch: wait until the previous kernel is done (its writes visible),
        then let the next kernel launch. Everything before this call may only read what no kernel writes."""
        if PDL:
            gdc_wait()
            gdc_launch_dependents()

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
    def _normed(x, rstd, nw_ptr, kk, kmask, dt: tl.constexpr):
        """x (float32, rows x columns kk, or one row) RMS-normed with rstd (broadcast over its columns) and
        scaled by nw, rounded to dt where the reference rounds (the normed value, then the product)."""
        h = (x * rstd).to(dt).to(tl.float32)
        nw = tl.load(nw_ptr + kk, mask=kmask, other=0.0).to(tl.float32)
        return (nw * h).to(dt)

    @triton.jit
    def _x_block(x_ptr, nw_ptr, xoff, mmask, kk, rstd, K: tl.constexpr, NORM: tl.constexpr, dt: tl.constexpr):
        """The input tile [BM, BK] at columns kk of the rows at offsets xoff [BM], RMS-normed (rstd [BM]) and
        scaled by nw with NORM."""
        kmask = kk < K
        xk = tl.load(x_ptr + xoff[:, None] + kk[None, :], mask=mmask[:, None] & kmask[None, :], other=0.0)
        if NORM:
            xk = _normed(xk.to(tl.float32), rstd[:, None], nw_ptr, kk, kmask, dt)
        return xk

    @triton.jit
    def _rms_pass(x_ptr, xoff, mmask, eps, K: tl.constexpr, CH: tl.constexpr):
        """1/rms of the rows at offsets xoff [BM] (where mmask), read CH columns at a time -> [BM] float32."""
        ss = tl.zeros([xoff.shape[0]], tl.float32)
        for k0 in range(0, K, CH):
            kk = k0 + tl.arange(0, CH)
            xs = tl.load(x_ptr + xoff[:, None] + kk[None, :], mask=mmask[:, None] & (kk[None, :] < K), other=0.0)
            xs = xs.to(tl.float32)
            ss += tl.sum(xs * xs, axis=1)
        return tl.rsqrt(ss / K + eps)

    @triton.jit
    def _squares(xk, IEEE: tl.constexpr, VEC: tl.constexpr):
        """The input tile xk [BM, BK]'s part of its rows' sums of squares in float32: [BM] on CUDA cores (VEC, or
        fewer than 64 rows), else xk xk^T [BM, BM] on tensor cores, whose diagonal holds them (`_diagonal`): 64 rows
        of a tile in registers would spill."""
        if VEC or xk.shape[0] < 64:
            xf = xk.to(tl.float32)
            sq = tl.sum(xf * xf, axis=1)
        else:
            sq = _dot(xk, tl.trans(xk), IEEE)
        return sq

    @triton.jit
    def _diagonal(sq):
        """The rows' sums of squares from `_squares`' running sum: itself, or its diagonal."""
        if len(sq.shape) == 1:
            d = sq
        else:
            i = tl.arange(0, sq.shape[0])
            d = tl.sum(tl.where(i[:, None] == i[None, :], sq, 0.0), axis=1)
        return d

    @triton.jit
    def _rows_mac(x_ptr, nw_ptr, sx, M, kk, rstd, wk, wu, eps, K: tl.constexpr, NORM: tl.constexpr,
                  RSTD: tl.constexpr, GLU: tl.constexpr, dt: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        """This program's BM rows of x (sx apart, whole rows, normed with rstd under NORM; under RSTD each row's
        sums scaled by its own 1/rms) times the weight tiles wk (and wu with GLU) one row at a time -> [BM, BN]
        float32 twice (without GLU the second is 0)."""
        first, mi, kmask = tl.program_id(1).to(tl.int64) * BM, tl.arange(0, BM), kk < K
        acc, acc2 = tl.zeros([BM, BN], tl.float32), tl.zeros([BM, BN], tl.float32)
        for m in tl.static_range(BM):
            here = mi == m
            x = tl.load(x_ptr + (first + m) * sx + kk, mask=kmask & (first + m < M), other=0.0)
            if NORM:
                x = _normed(x.to(tl.float32), tl.sum(tl.where(here, rstd, 0.0), axis=0), nw_ptr, kk, kmask, dt)
            x = x.to(tl.float32)
            r = 1.0
            if RSTD:
                r = tl.rsqrt(tl.sum(x * x, axis=0) / K + eps)
            acc = tl.where(here[:, None], (tl.sum(wk.to(tl.float32) * x[None, :], axis=1) * r)[None, :], acc)
            if GLU:
                acc2 = tl.where(here[:, None], (tl.sum(wu.to(tl.float32) * x[None, :], axis=1) * r)[None, :], acc2)
        return acc, acc2

    @triton.jit
    def _proj_kernel(x_ptr, nw_ptr, w_ptr, b_ptr, res_ptr, out_ptr, eps, sx, M: tl.constexpr,
                     N: tl.constexpr, K: tl.constexpr,
                     NORM: tl.constexpr, BIAS: tl.constexpr, RES: tl.constexpr, GLU: tl.constexpr,
                     IEEE: tl.constexpr, VEC: tl.constexpr, PDL: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, ROWS: tl.constexpr = False,
                     RSTD: tl.constexpr = False):
        """Program (N block, M block) of out[M, N] = epilogue(prologue(x[M, K]) @ w[N, K]^T), x's rows sx
        apart. NORM: x is RMS-normed with nw first; RSTD: x is RMS-normed with the norm's weight folded into w
        (packed_weights.fold_norm), so x streams as it is and each row's 1/rms scales its sums; GLU: w has 2N
        rows (gate then up) and out = silu(gate) * up; RES: out += res[M, N]. ROWS (a multiply-and-sum whole-row
        tile, BK >= K, over 2+ rows): the rows one at a time against the one weight tile, not as a [BM, BN, BK]
        product. PDL (programmatic dependent launch, Hopper+): the first weight tile loads while the previous
        kernel is still running; everything that kernel writes (x, res) is read after gdc_wait."""
        dt = out_ptr.dtype.element_ty
        rm = tl.program_id(1) * BM + tl.arange(0, BM)
        rn = tl.program_id(0) * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        mmask, nmask = rm < M, rn < N
        wk, wu = _w_block(w_ptr, rn, nmask, rk, N, K, GLU)  # [BN, BK]: weights never depend on the last kernel
        after_previous(PDL)
        xoff = rm.to(tl.int64) * sx
        rstd = tl.zeros([BM], tl.float32)
        # under RSTD the rows' sums of squares come from the product's own input tiles (`_squares`), except for
        # tensor-core tiles of whole rows, where a pass over narrow pieces of the rows costs fewer registers
        SQ_PASS: tl.constexpr = RSTD and not VEC and BK >= K
        if NORM:
            rstd = _rms_pass(x_ptr, xoff, mmask, eps, K, BK)  # [BM]
        if SQ_PASS:
            rstd = _rms_pass(x_ptr, xoff, mmask, eps, K, min(BK, 128))
        if ROWS:  # whole-row tile, a few rows: each row against the weight tile held in registers
            acc, acc2 = _rows_mac(x_ptr, nw_ptr, sx, M, rk, rstd, wk, wu, eps, K, NORM, RSTD, GLU, dt, BM, BN)
        else:
            xk = _x_block(x_ptr, nw_ptr, xoff, mmask, rk, rstd, K, NORM, dt)  # [BM, BK]
            acc = _mac(xk, wk, IEEE, VEC)  # [BM, BN]
            acc2 = tl.zeros([BM, BN], tl.float32)
            if GLU:
                acc2 += _mac(xk, wu, IEEE, VEC)
            if RSTD and not SQ_PASS:
                sq = _squares(xk, IEEE, VEC)  # [BM], or [BM, BM] whose diagonal they are
            for k0 in range(BK, K, BK):
                kk = k0 + rk
                wk, wu = _w_block(w_ptr, rn, nmask, kk, N, K, GLU)
                xk = _x_block(x_ptr, nw_ptr, xoff, mmask, kk, rstd, K, NORM, dt)
                acc += _mac(xk, wk, IEEE, VEC)
                if GLU:
                    acc2 += _mac(xk, wu, IEEE, VEC)
                if RSTD and not SQ_PASS:
                    sq += _squares(xk, IEEE, VEC)
            if RSTD and not SQ_PASS:
                rstd = tl.rsqrt(_diagonal(sq) / K + eps)
            if RSTD:
                acc, acc2 = acc * rstd[:, None], acc2 * rstd[:, None]
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
        after_previous(PDL)
        b, h, d, dm = lanes(HD, BD)
        g = h // (H // HKV)
        HALF: tl.constexpr = HD // 2
        W: tl.constexpr = (H + 2 * HKV) * HD
        p = tl.arange(0, BP)
        cache = (b * HKV + g) * P * HD
        earlier = (p[:, None] < pos0) & dm[None, :]  # issued with y's loads: one memory round trip, not two
        kk = tl.load(kc_ptr + cache + p[:, None] * HD + d[None, :], mask=earlier, other=0.0).to(tl.float32)  # [BP, BD]
        vv = tl.load(vc_ptr + cache + p[:, None] * HD + d[None, :], mask=earlier, other=0.0).to(tl.float32)
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


def pdl_available(device: torch.device) -> bool:
    """True where programmatic dependent launch can run: a Hopper-or-newer CUDA GPU and a Triton with grid
    dependency control (never in the CPU interpreter)."""
    return (triton is not None and gdc_wait is not None and not _INTERPRET and device.type == "cuda"
            and torch.cuda.get_device_capability(device)[0] >= 9)


def launch_options(pdl: bool, warps: int, stages: int | None = None) -> dict[str, Any]:
    opts: dict[str, Any] = {"num_warps": warps}
    if stages is not None:
        opts["num_stages"] = stages
    if pdl:
        opts["launch_pdl"] = True
    return opts


def projection(x: torch.Tensor, w: torch.Tensor, *, n: int, bias: torch.Tensor | None = None,
          norm: Any = None, res: torch.Tensor | None = None, glu: bool = False, cfg: Config | None = None,
          pdl: bool = False, folded: bool = False) -> torch.Tensor:
    """x: [M, K] (rows may be strided; the last dim contiguous) -> [M, n] (see _proj_kernel); w: [n, K], or
    [2n, K] with glu; folded: `norm`'s weight is folded into w (packed_weights.fold_norm), its eps still applies."""
    assert x.stride(-1) == 1
    K = x.shape[1]
    M = x.shape[0]
    out = torch.empty(M, n, device=x.device, dtype=x.dtype)
    BN, BK, stages, warps, vec = cfg or config(M, n, K)
    if x.element_size() > 2 and not vec:  # float32 tiles: half as wide, or the stages overflow shared memory
        BK = max(32, BK // 2)
    dummy = x
    BM = next_pow2(M) if vec else min(MAX_BM, max(16, next_pow2(M)))
    _proj_kernel[(triton.cdiv(n, BN), triton.cdiv(M, BM))](
        x, norm.weight if norm is not None else dummy, w,
        bias if bias is not None else dummy, res if res is not None else dummy, out,
        float(norm.eps) if norm is not None else 0.0, x.stride(0), M=M, N=n, K=K,
        NORM=norm is not None and not folded, BIAS=bias is not None, RES=res is not None, GLU=glu,
        IEEE=x.dtype == torch.float32 or _INTERPRET, VEC=vec, PDL=pdl,
        BM=BM, BN=BN, BK=BK, ROWS=vec and BM > 1 and BK >= K, RSTD=norm is not None and folded,
        **launch_options(pdl, warps, stages))
    return out


def normed_projection(x: torch.Tensor, w: torch.Tensor, norm: Any, *, n: int, pdl: bool,
                      w_folded: torch.Tensor | None = None, **kw: Any) -> torch.Tensor:
    """projection(norm(x), w): the norm as the projection's prologue, or from FOLD_ROWS rows, given `w_folded`
    (w with the norm's weight folded in, packed_weights.fold_norm), folded."""
    if w_folded is not None and x.shape[0] >= FOLD_ROWS:
        return projection(x, w_folded, n=n, norm=norm, pdl=pdl, folded=True, **kw)
    return projection(x, w, n=n, norm=norm, pdl=pdl, **kw)


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
