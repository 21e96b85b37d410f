"""Triton kernel implementing omni_tts.models.codec.layers.snake (the codec vocoder's SnakeBeta activation)
on CUDA, with the sums before it and the next causal conv's padding after it.

Owns: `snake(x, alpha, beta, pad, bias, res, keep)`: h = x + bias + res (the bias a conv run without it would
have added, the residual stream), then h + sin^2(h * e^alpha) / (e^beta + eps) per channel, computed in
float32 and stored in x's dtype, written into a new contiguous [B, C, pad + T] tensor whose first `pad`
columns are zeros: the left padding of the causal conv that follows, so that conv needs no padded copy of its
input (a full pass over the largest tensors of the decoder); with `keep`, h too (the residual stream's next
value). One read of each input and one write of each output, where the eager ops take a pass per bias add,
residual add and padding. x may be any strided view (a transposed conv's trimmed output, a channels-last
conv's output), and the output may be written channels last, the layout cuDNN's convs read without transposing
it first, or in d phases (sample u at phase u % d, step u // d: a conv of dilation d over it is d undilated
channels-last convs), and read back from them. One program per (row, block of channels, block of samples): the
per-channel constants are loaded once per program, and no element needs an integer division to find its
channel (Inductor's dynamic-shape kernel for the same function did); offsets inside a row are 32-bit where
they fit. Same math as the reference, but the sine is the GPU's approximate one (a single instruction; the
accurate one carries a slow path per element) where compiled, the exact one in the interpreter, and the sum
may be contracted to a fused multiply-add: results agree to float rounding, not bit for bit.
Knows nothing about models, windows or streaming. Tests run it in Triton's CPU interpreter.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # CPU-only installs: codec/layers.py uses the compiled or eager function
    triton = None

BLOCK_C, BLOCK_T, WARPS = 32, 64, 4  # channels x samples per program (128-byte runs of channels-last rows)


def available() -> bool:
    return triton is not None


if triton is not None:
    # channel counts and strides keep Triton's specialisation (a unit stride, a multiple of 16): runs of
    # channels are then known contiguous, aligned and wholly in or out of the masks, so they move as 128-bit
    # vectors. The sample count and the padding take none: a new chunk length compiles no new variant.
    @triton.jit
    def _at(u, step, phase, D: tl.constexpr):
        """Offset of sample u: u * step, or with D phases (u // D) * step + (u % D) * phase."""
        if D == 1:
            return u * step
        return (u // D) * step + (u % D) * phase

    @triton.jit(do_not_specialize=["T", "pad"])
    def _snake_kernel(x_ptr, bias_ptr, res_ptr, h_ptr, alpha_ptr, beta_ptr, out_ptr, C, T, pad, sxb, sxc, sxt,
                      sxr, sob, soc, sot, sor, eps, BIAS: tl.constexpr, RES: tl.constexpr, KEEP: tl.constexpr,
                      BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr, PADB: tl.constexpr, DX: tl.constexpr,
                      DO: tl.constexpr, FAST: tl.constexpr, I32: tl.constexpr):
        """Program (row b, block of channels, block of samples j): h = x[b, c, t] (+ bias[c]) (+ res[b, c, t]),
        each sum rounded to the dtype as the eager adds round it; h[b, c, t] = h with KEEP; out[b, c, pad + t]
        = snake(h). The first sample block also zeroes out[b, c, :pad]. x and out are read and written
        through their strides (channels first or channels last); res and h lie channels last ([B, T, C]). With
        DX > 1, x's sample t lies at phase t % DX, step t // DX (strides sxr, sxt); with DO > 1, out's
        padded sample u = pad + t likewise at phase u % DO, step u // DO (sor, sot)."""
        dt = out_ptr.dtype.element_ty
        b = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        j = tl.program_id(2)
        t = j * BLOCK_T + tl.arange(0, BLOCK_T)
        mc = c < C
        m = mc[:, None] & (t < T)[None, :]
        freq = tl.exp(tl.load(alpha_ptr + c, mask=mc, other=0.0).to(tl.float32))[:, None]
        gain = (1.0 / (tl.exp(tl.load(beta_ptr + c, mask=mc, other=0.0).to(tl.float32)) + eps))[:, None]
        if I32:  # offsets inside a row fit 32 bits: half the integer work of 64-bit ones
            cc, tt = c[:, None], t[None, :]
        else:
            cc, tt = c.to(tl.int64)[:, None], t.to(tl.int64)[None, :]
        x = tl.load(x_ptr + b * sxb + (cc * sxc + _at(tt, sxt, sxr, DX)), mask=m, other=0.0).to(tl.float32)
        if BIAS:
            x = (x + tl.load(bias_ptr + c, mask=mc, other=0.0).to(tl.float32)[:, None]).to(dt).to(tl.float32)
        flat = b * C * T + (tt * C + cc)  # res and h: [B, C, T] channels last, the layout of x and out
        if RES:
            x = (tl.load(res_ptr + flat, mask=m, other=0.0).to(tl.float32) + x).to(dt).to(tl.float32)
        if KEEP:
            tl.store(h_ptr + flat, x.to(dt), mask=m)
        if FAST:
            s = libdevice.fast_sinf(x * freq)
        else:
            s = tl.sin(x * freq)
        y = x + gain * (s * s)
        base = out_ptr + b * sob
        tl.store(base + (cc * soc + _at(pad + tt, sot, sor, DO)), y.to(dt), mask=m)
        if j == 0:
            p = tl.arange(0, PADB)[None, :]
            tl.store(base + (cc * soc + _at(p, sot, sor, DO)), tl.zeros([BLOCK_C, PADB], tl.float32).to(dt),
                     mask=mc[:, None] & (p < pad))


def snake(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, pad: int = 0, eps: float = 1e-9,
          bias: torch.Tensor | None = None, res: torch.Tensor | None = None, keep: bool = False,
          channels_last: bool = False, phases: int = 1, x_phases: int = 1, length: int = 0
          ) -> tuple[torch.Tensor | None, torch.Tensor]:
    """h = x (+ bias [C] per channel) (+ res [B, C, T] channels last) -> (h [B, C, T] if `keep` else None,
    laid out like res: a contiguous [B, T, C] tensor seen as [B, C, T]; snake(h) [B, C, pad + T], zeros first:
    contiguous, or with `channels_last` a [B, pad + T, C] contiguous tensor seen as [B, C, pad + T], the
    layout a channels-last conv reads without a transpose).
    With keep and res, h is written over res (and returned). x: [B, C, T], any strides; alpha / beta [C]
    (log scale). bias and res are what a conv run without its bias and a residual add would add.
    phases = d > 1: the output is a contiguous [B, d, S, C] tensor, S = ceil((pad + T) / d) rounded up to
    even, holding padded sample u at [b, u % d, u // d, c] (zeros past pad + T): d channels-last sequences,
    the undilated form of a conv of dilation d. x_phases = d > 1: x is such a [B, d, S', C] tensor (any
    strides) holding the `length` samples of a [B, C, T] one."""
    if x_phases > 1:
        B, _, _, C = x.shape
        T = length
        sxb, sxr, sxt, sxc = x.stride()
    else:
        B, C, T = x.shape
        (sxb, sxc, sxt), sxr = x.stride(), 0
    if phases > 1:
        n = pad + T
        steps = -(-n // phases)
        steps += steps % 2  # an even count: a narrow conv over each phase may fold samples in pairs
        out = torch.empty(B, phases, steps, C, dtype=x.dtype, device=x.device)
        full = n // phases  # samples past the end: zeros (a folded conv multiplies some by zero taps)
        out[:, n - full * phases:, full:full + 1].zero_()
        out[:, :, full + 1:].zero_()
        sob, sor, sot, soc = out.stride()
    else:
        shape = (B, pad + T, C) if channels_last else (B, C, pad + T)
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
        out = out.transpose(1, 2) if channels_last else out
        (sob, soc, sot), sor = out.stride(), 0
    # h over res when both: each element is read, then written, by the same thread (and one 32-row window
    # holds ~0.8 GB per float32 tensor at 24 kHz; the caller's res is used up)
    # h and res channels last like the convs' outputs: a tile's every access then runs along its channels
    h = (res if res is not None else _channels_last(B, C, T, x)) if keep else None
    if B * C == 0 or T == 0:
        return h, out.zero_()
    if res is not None:
        assert res.shape == (B, C, T) and res.transpose(1, 2).is_contiguous()
    dummy = x
    grid = (B, triton.cdiv(C, BLOCK_C), triton.cdiv(T, BLOCK_T))
    _snake_kernel[grid](x, bias if bias is not None else dummy, res if res is not None else dummy,
                        h if h is not None else dummy, alpha, beta, out, C, T, pad, sxb, sxc, sxt, sxr, sob, soc,
                        sot, sor, eps, BIAS=bias is not None, RES=res is not None, KEEP=keep, BLOCK_C=BLOCK_C,
                        BLOCK_T=BLOCK_T, PADB=max(16, triton.next_power_of_2(max(pad, 1))), DX=x_phases, DO=phases,
                        FAST=not _interpreted(), I32=_fits_32(x, out, C * T),
                        num_warps=WARPS)
    return h, out


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _fits_32(x: torch.Tensor, out: torch.Tensor, row: int) -> bool:
    """Whether every offset inside one row of x, out and the [C, T] rows of res / h fits 32 bits."""
    reach = max(row, *(sum((n - 1) * st for n, st in zip(t.shape[1:], t.stride()[1:])) for t in (x, out)))
    return reach < 2**31


def _channels_last(B: int, C: int, T: int, like: torch.Tensor) -> torch.Tensor:
    """An empty [B, C, T] tensor laid out as a contiguous [B, T, C] one."""
    return torch.empty(B, T, C, dtype=like.dtype, device=like.device).transpose(1, 2)
