"""The projection kernel of the Triton layers: out = epilogue(prologue(x) @ w^T) over a few to 128 rows.

Owns: `_proj_kernel` and its launch (`projection`, `normed_projection`), the launch options and the check for
programmatic dependent launch (`pdl_available`, `launch_options`, `after_previous`), shared by
omni_tts.kernels.layers (the predictor's layer step), .talker and .heads. The prologue may RMS-norm the input rows;
from configs.FOLD_ROWS rows, given a copy of the weight with the norm's weight folded in
(`projection(folded=True)`), the input instead streams as it is and each row's 1/rms scales its sums. The epilogue
adds a bias, applies SiLU(gate) * up (GLU) or adds a residual. The rows run on tensor cores padded to 16
(memory-bound at these sizes, so 2..16 rows cost about the same; a tile may hold whole rows of narrow inputs, loaded
at once), at most MAX_BM rows a program (more rows take a second column of programs, whose weight reads mostly hit
L2), or fewer rows a program where a config caps them (`rows_a_program`); one row runs as a multiply-and-sum
over narrow weight tiles of whole rows, or of pieces of the widest rows in a pipelined loop (more programs reading
the weights at once), as do two rows where omni_tts.kernels.configs says so (each row in turn against a whole-row
tile). The input rows may be strided. With `pdl` (Hopper+) each kernel loads its first weight tile, which no kernel
writes, before `after_previous` waits for the previous kernel and lets the next one launch. Numerics: float32
accumulation, rounded to the model dtype where the reference rounds (norm output, the projection, SiLU, residual
sums; a folded norm's weights instead of its output). Knows nothing about layers, graphs or requests. Runs on CUDA;
tests run it in Triton's CPU interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from omni_tts.kernels import configs as kernel_configs
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
MAX_BM = 64  # rows per program of a tensor-core projection: more rows split over programs (shared memory)

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
        then let the next kernel launch. Everything before this call may only read what the previous kernel
        does not write: weights, or what kernels two or more launches back wrote (this one launched only once
        the previous one had passed its own wait, so those were done)."""
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
    def _tiles_mac(x_ptr, nw_ptr, w_ptr, xoff, mmask, rn, nmask, rk, rstd, wk, wu, eps, N: tl.constexpr,
                   K: tl.constexpr, BK: tl.constexpr, NORM: tl.constexpr, RSTD: tl.constexpr,
                   SQ_PASS: tl.constexpr, GLU: tl.constexpr, IEEE: tl.constexpr, VEC: tl.constexpr,
                   dt: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        """The product over K in BK-column tiles, from the first weight tiles wk (and wu with GLU) loaded before
        the PDL wait -> [BM, BN] float32 twice (without GLU the second is 0); under RSTD each row's sums scaled
        by its 1/rms, from the input tiles' own squares unless SQ_PASS gave rstd."""
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
            acc, acc2 = _tiles_mac(x_ptr, nw_ptr, w_ptr, xoff, mmask, rn, nmask, rk, rstd, wk, wu, eps, N, K, BK,
                                   NORM, RSTD, SQ_PASS, GLU, IEEE, VEC, dt, BM, BN)
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
    cfg = cfg or config(M, n, K)
    BN, BK, stages, warps, vec = cfg[:5]
    if x.element_size() > 2 and not vec:  # float32 tiles: half as wide, or the stages overflow shared memory
        BK = max(32, BK // 2)
    dummy = x
    BM = rows_a_program(M, cfg)
    _proj_kernel[(triton.cdiv(n, BN), triton.cdiv(M, BM))](
        x, norm.weight if norm is not None else dummy, w,
        bias if bias is not None else dummy, res if res is not None else dummy, out,
        float(norm.eps) if norm is not None else 0.0, x.stride(0), M=M, N=n, K=K,
        NORM=norm is not None and not folded, BIAS=bias is not None, RES=res is not None, GLU=glu,
        IEEE=x.dtype == torch.float32 or _INTERPRET, VEC=vec, PDL=pdl,
        BM=BM, BN=BN, BK=BK, ROWS=vec and BM > 1 and BK >= K, RSTD=norm is not None and folded,
        **launch_options(pdl, warps, stages))
    return out


def rows_a_program(M: int, cfg: Config) -> int:
    """BM for M rows under `cfg`: a multiply-and-sum tile takes them all; a tensor-core one at least 16 (the
    MMA's rows), at most the config's sixth field or MAX_BM (more rows take more columns of programs)."""
    if cfg[4]:
        return next_pow2(M)
    return min(cfg[5] if len(cfg) > 5 else MAX_BM, max(16, next_pow2(M)))


def normed_projection(x: torch.Tensor, w: torch.Tensor, norm: Any, *, n: int, pdl: bool,
                      w_folded: torch.Tensor | None = None, **kw: Any) -> torch.Tensor:
    """projection(norm(x), w): the norm as the projection's prologue, or from kernel_configs.FOLD_ROWS rows, given
    `w_folded` (w with the norm's weight folded in, packed_weights.fold_norm), folded."""
    if w_folded is not None and x.shape[0] >= kernel_configs.FOLD_ROWS:
        return projection(x, w_folded, n=n, norm=norm, pdl=pdl, folded=True, **kw)
    return projection(x, w, n=n, norm=norm, pdl=pdl, **kw)
