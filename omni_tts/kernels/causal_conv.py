"""Triton kernel for the codec vocoder's causal convs (omni_tts.models.codec.layers.CausalConv1d.pending)
on an input that already holds its left padding, without the bias.

Owns: `conv(xp, taps, dilation)`: raw[b, o, t] = sum_k sum_i taps[k, o, i] * xp[b, i, t + k * dilation]
for t < T = xp's length - (K - 1) * dilation, i.e. F.conv1d(xp, w, None, dilation=dilation) with taps =
w.permute(2, 0, 1) (`taps`). cuDNN runs these convs as implicit GEMMs over a channels-last copy of the
input and transposes the output back; this kernel reads the [B, C, T] input as the snake kernel wrote it:
one program per (block of samples, block of output channels, row) sums K tile products [BO, BI] x [BI, BT]
on tensor cores into a float32 accumulator and stores the output's dtype. float16 inputs run as such,
float32 inputs in TF32 (bfloat16 would run too, but Triton's interpreter cannot check its products).
Knows nothing about models or streaming. Tests run it in Triton's CPU interpreter against F.conv1d.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the convs stay with torch
    triton = None

BI, BT = 32, 128  # input channels per tile product; samples per program


def available() -> bool:
    return triton is not None


def taps(weight: torch.Tensor) -> torch.Tensor:
    """A conv1d weight [Cout, Cin, K] as the kernel reads it: [K, Cout, Cin], contiguous."""
    return weight.permute(2, 0, 1).contiguous()


if triton is not None:
    # window lengths and row strides change every chunk: one compiled kernel for all of them
    @triton.jit(do_not_specialize=["T", "sxb", "sxc"])
    def _conv_kernel(x_ptr, w_ptr, out_ptr, T, sxb, sxc, CIN: tl.constexpr, COUT: tl.constexpr,
                     K: tl.constexpr, DIL: tl.constexpr, BO: tl.constexpr, BI: tl.constexpr, BT: tl.constexpr):
        """Program (block j of samples, block of output channels, row b): out[b, o, t] for o, t in its
        blocks, summed over the K taps and all input channels (CIN a multiple of BI)."""
        t = tl.program_id(0) * BT + tl.arange(0, BT)
        o = tl.program_id(1) * BO + tl.arange(0, BO)
        b = tl.program_id(2).to(tl.int64)
        acc = tl.zeros([BO, BT], dtype=tl.float32)
        om = o[:, None] < COUT
        tm = t[None, :] < T
        for k in tl.static_range(K):
            for i0 in range(0, CIN, BI):
                i = i0 + tl.arange(0, BI)
                w = tl.load(w_ptr + (k * COUT + o[:, None]) * CIN + i[None, :], mask=om, other=0.0)
                x = tl.load(x_ptr + b * sxb + i[:, None].to(tl.int64) * sxc + (t[None, :] + k * DIL), mask=tm,
                            other=0.0)
                acc = tl.dot(w, x, acc)
        out = out_ptr + b * COUT * T + o[:, None].to(tl.int64) * T + t[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=om & tm)


def usable(c_in: int, c_out: int) -> bool:
    """Channel counts the kernel's tiles fit (tensor-core tiles of 16 and whole input blocks)."""
    return triton is not None and c_in % BI == 0 and c_out % 16 == 0


def conv(xp: torch.Tensor, w_taps: torch.Tensor, dilation: int) -> torch.Tensor:
    """xp [B, Cin, reach + T] (its last dim contiguous), w_taps [K, Cout, Cin] (`taps`) -> [B, Cout, T],
    contiguous, in xp's dtype; reach = (K - 1) * dilation."""
    B, c_in, width = xp.shape
    K, c_out, _ = w_taps.shape
    T = width - (K - 1) * dilation
    assert w_taps.shape[2] == c_in and usable(c_in, c_out) and xp.stride(2) == 1 and T >= 0
    out = torch.empty(B, c_out, T, dtype=xp.dtype, device=xp.device)
    if B == 0 or T == 0:
        return out
    bo = 64 if c_out % 64 == 0 else 32 if c_out % 32 == 0 else 16
    grid = (triton.cdiv(T, BT), c_out // bo, B)
    _conv_kernel[grid](xp, w_taps, out, T, xp.stride(0), xp.stride(1), CIN=c_in, COUT=c_out, K=K, DIL=dilation,
                       BO=bo, BI=BI, BT=BT, num_warps=4, num_stages=3)
    return out
