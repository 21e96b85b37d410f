"""Convolutional building blocks of the 12 Hz speech tokenizer's decoder (decoder.py): causal convs,
SnakeBeta vocoder stages, ConvNeXt blocks and the split residual-VQ codebook groups (its sliding-window
transformer is in transformer.py).

Owns: each layer's math and parameter names (they match the checkpoint's `decoder.*` keys), each
layer's `lookback(j)` (the earliest input index output j depends on) that decoder.py chains to
compute the decoder's receptive field, the streaming state `Carry` and each conv's entry in it (its last
input columns, a transposed conv's overlapping inputs), so that a stream decoded piece by piece with one
carry equals the decode of the whole.
Does not know: configs or checkpoint files (decoder.py reads `decoder_config` and loads tensors),
devices, dtypes, streaming or segmentation policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from omni_tts.kernels import snake as codec_kernels
from omni_tts.models.codec.conv_forms import FOLD_BELOW, channels_last, conv_channels_last, conv_folded, fold_weight

CONVNEXT_LN_EPS = 1e-6
SNAKE_EPS = 1e-9
RESIDUAL_DILATIONS = (1, 3, 9)
# from this stride on, a K = 2s transposed conv runs as a GEMM + overlap-add: faster than cuDNN's
# transposed-conv kernels there, slower below it (docs/levers.md, the codec's transposed convs)
GEMM_MIN_STRIDE = 8


class Pending(NamedTuple):
    """A vocoder tensor not yet summed: raw (a conv's output without its bias, any strides) + bias[c]
    (+ res, the residual stream). The next SnakeBeta's kernel does the sums (`SnakeBeta.fused`)."""
    raw: torch.Tensor  # [B, C, T]; with phases d > 1 [B, d, S, C] (`CausalConv1d.phased`)
    bias: torch.Tensor | None  # [C]
    res: torch.Tensor | None  # [B, C, T] channels last (a snake kernel's kept sum), which the next may write over
    phases: int = 1
    length: int = 0  # T, where raw is in phases


Carry = dict[nn.Module, torch.Tensor]
"""Streaming state of a batch of decoder rows: {layer module: tensor [B, ...]}, written by the layers as
they run. A layer missing from it starts from what a decode sees at position 0: zeros (the causal
padding), an empty attention window."""


def carried(carry: Carry, owner: nn.Module, x: torch.Tensor, reach: int) -> torch.Tensor:
    """x [B, C, T] behind the owner's carried `reach` input columns (zeros at first) -> [B, C, reach + T];
    the carry then holds the last `reach` columns of that for the next piece."""
    if reach == 0:
        return x
    tail = carry.get(owner)
    xp = torch.cat([x.new_zeros(*x.shape[:2], reach) if tail is None else tail, x], dim=-1)
    carry[owner] = xp[..., xp.shape[-1] - reach:].contiguous()
    return xp


def refill(carry: Carry, owner: nn.Module, xp: torch.Tensor, reach: int) -> None:
    """`carried` for an input that already has `reach` zero columns in front (a SnakeBeta wrote them):
    those columns get the carried ones, in place."""
    tail = carry.get(owner)
    if tail is not None:
        xp[..., :reach].copy_(tail)
    carry[owner] = xp[..., xp.shape[-1] - reach:].contiguous()


def refill_phased(carry: Carry, owner: nn.Module, xp: torch.Tensor, reach: int, length: int) -> None:
    """`refill` for a padded input laid out in phases (`CausalConv1d.phased`): the carried columns go to
    padded samples 0..reach-1 (steps 0..reach/d - 1 of every phase), the carry then holds samples
    length..length + reach - 1."""
    B, d, _, C = xp.shape
    tail = carry.get(owner)
    if tail is not None:  # [B, C, reach]: sample s * d + r -> [b, r, s, c]
        xp[:, :, :reach // d].copy_(tail.view(B, C, reach // d, d).permute(0, 3, 2, 1))
    u = torch.arange(length, length + reach, device=xp.device)
    carry[owner] = xp[:, u % d, u // d].transpose(1, 2).contiguous()  # [B, C, reach]


class CausalConv1d(nn.Module):
    """Stride-1 conv that only looks back: left-pads (kernel-1)*dilation zeros."""

    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, dilation=dilation, groups=groups)
        self.reach = (kernel - 1) * dilation
        self._forms: dict[str, tuple[tuple[Any, ...], torch.Tensor]] = {}  # `_weight_form`

    def forward(self, x: torch.Tensor, padded: bool = False, carry: Carry | None = None) -> torch.Tensor:
        """x: [B, Cin, T] -> [B, Cout, T]; padded: x already starts with the `reach` zero columns (a
        SnakeBeta called with pad=reach wrote them), so x is [B, Cin, reach + T] and is not copied;
        carry: the padding is the previous piece's last input columns instead of zeros."""
        return self.conv(self._padded(x, padded, carry))

    def pending(self, x: torch.Tensor, padded: bool = False, carry: Carry | None = None) -> Pending:
        """forward with the bias left to the next kernel (cuDNN adds it as a pass of its own)."""
        c, xp = self.conv, self._padded(x, padded, carry)
        if channels_last(xp):
            return Pending(self._channels_last_conv(xp, c.dilation[0]), c.bias, None)
        return Pending(F.conv1d(xp, c.weight, None, 1, 0, c.dilation, c.groups), c.bias, None)  # [B, Cout, T]

    def phased(self, xp: torch.Tensor, length: int, carry: Carry | None = None) -> Pending:
        """`pending` of a conv of dilation d on its padded input in d phases ([B, d, S, C] from a SnakeBeta
        with phases=d): one undilated conv over the B * d channels-last sequences (cuDNN's fast kernels;
        a dilated conv has slower ones and reads channels first), the output in phases too."""
        c, (B, d, steps, C) = self.conv, xp.shape
        if carry is not None:
            refill_phased(carry, self, xp, self.reach, length)
        y = self._channels_last_conv(xp.view(B * d, steps, C).transpose(1, 2))  # over [B*d, C, S] channels last
        return Pending(y.transpose(1, 2).reshape(B, d, -1, y.shape[1]), c.bias, None, d, length)

    def _folds(self, xp: torch.Tensor) -> bool:
        """Whether this conv, run undilated on xp [B, C, S] channels last, runs folded (`conv_folded`)."""
        c = self.conv
        return c.in_channels < FOLD_BELOW and c.groups == 1 and (c.kernel_size[0] - 1) % 2 == 0 \
            and xp.shape[-1] % 2 == 0

    def _channels_last_conv(self, xp: torch.Tensor, dilation: int = 1) -> torch.Tensor:
        """This conv without its bias on channels-last xp [B, C, S] (cuDNN reads it in place), over sample
        pairs folded into twice the channels where `_folds` says so."""
        c = self.conv
        if dilation == 1 and self._folds(xp):
            return conv_folded(xp, self._weight_form("folded", lambda w: fold_weight(w, 2)))
        return conv_channels_last(xp, c.weight, dilation=dilation, groups=c.groups)

    def _weight_form(self, name: str, build: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """build(weight), made once per weight tensor (rebuilt when its storage, dtype, device or version
        changes)."""
        w = self.conv.weight
        key = (w.data_ptr(), w.dtype, w.device, w._version)
        if self._forms.get(name, (None,))[0] != key:
            self._forms[name] = (key, build(w.detach()))
        return self._forms[name][1]

    def taps(self, xp: torch.Tensor, carry: Carry | None = None) -> torch.Tensor:
        """forward of an undilated conv to few output channels (the vocoder's last, to one) on a padded
        channels-last input [B, C, reach + T]: one GEMM to every (tap, output) column, then each output's
        taps summed along their diagonal. cuDNN would transpose the input first and run a kernel sized for
        many outputs."""
        c, (B, C, S) = self.conv, xp.shape
        (K,), N, T = c.kernel_size, c.out_channels, S - self.reach
        assert c.dilation == (1,) and c.groups == 1, "taps: an undilated, ungrouped conv"
        if carry is not None:
            refill(carry, self, xp, self.reach)
        cols = -(-K * N // 4) * 4  # rows of 16 bytes: cuBLAS's aligned kernels
        # [C, cols]: column k*N + n holds tap k of output n
        w = self._weight_form("taps", lambda w: F.pad(w.permute(1, 2, 0).reshape(C, K * N), (0, cols - K * N)))
        taps = xp.transpose(1, 2).reshape(B * S, C) @ w  # [B*S, cols]
        y = taps.as_strided((B, N, T, K), (S * cols, 1, cols, cols + N)).sum(-1)  # y[b, n, t]: taps[b, t+k, k*N+n]
        return y + c.bias[None, :, None] if c.bias is not None else y

    def _padded(self, x: torch.Tensor, padded: bool, carry: Carry | None) -> torch.Tensor:
        if self.reach == 0:
            return x  # F.pad would copy it
        if carry is None:
            return x if padded else F.pad(x, (self.reach, 0))
        if not padded:
            return carried(carry, self, x, self.reach)
        if self.reach:
            refill(carry, self, x, self.reach)
        return x

    def lookback(self, j: int) -> int:
        return j - self.reach


class CausalUpConv1d(nn.Module):
    """Transposed conv (kernel K >= stride s) keeping the first T*s samples, i.e. the causal ones. Output
    sample j sums inputs ceil((j-K+1)/s)..j//s: streamed, the last ceil(K/s)-1 inputs are carried and
    run again in front of the next piece, whose first (ceil(K/s)-1)*s outputs are the overlap, dropped.
    With K = 2s and s >= GEMM_MIN_STRIDE it runs as one GEMM and an overlap-add (`_up_gemm`)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(c_in, c_out, kernel, stride=stride)
        self.kernel, self.stride = kernel, stride
        self.reach = -(-kernel // stride) - 1  # input columns each piece needs from the previous one
        self.gemm = kernel == 2 * stride and stride >= GEMM_MIN_STRIDE

    def forward(self, x: torch.Tensor, carry: Carry | None = None) -> torch.Tensor:
        return self._up(x, self.conv.bias, carry)  # [B, Cin, T] -> [B, Cout, T*s]

    def pending(self, x: torch.Tensor, carry: Carry | None = None, padded: bool = False) -> Pending:
        """forward with the bias left to the next kernel; raw is a strided view of cuDNN's untrimmed output
        or the GEMM form's own output. padded (cuDNN's form): x starts with `reach` zero columns."""
        if not padded:
            return Pending(self._up(x, None, carry), self.conv.bias, None)  # raw: [B, Cout, T*s]
        if carry is not None:
            refill(carry, self, x, self.reach)
        return Pending(self._transposed(x, None, self.reach), self.conv.bias, None)

    def _up(self, x: torch.Tensor, bias: torch.Tensor | None, carry: Carry | None) -> torch.Tensor:
        if self.gemm:
            return self._up_gemm(x, bias, carry)
        if carry is not None and self.reach:
            return self._transposed(carried(carry, self, x, self.reach), bias, self.reach)
        return self._transposed(x, bias, 0)

    def _transposed(self, xp: torch.Tensor, bias: torch.Tensor | None, lead: int) -> torch.Tensor:
        """cuDNN's transposed conv of xp [B, Cin, lead + T], whose first `lead` columns are the carried (or
        zero) inputs, trimmed to the T*s outputs after their overlap: [B, Cout, T*s], a strided view."""
        skip, t = lead * self.stride, (xp.shape[-1] - lead) * self.stride
        if channels_last(xp):
            y = conv_channels_last(xp, self.conv.weight, bias, stride=self.stride, transposed=True)
        else:
            y = F.conv_transpose1d(xp, self.conv.weight, bias, self.stride)
        return y[..., skip: skip + t]

    def _up_gemm(self, x: torch.Tensor, bias: torch.Tensor | None, carry: Carry | None) -> torch.Tensor:
        """The same output from one GEMM: with K = 2s, output block t (s samples) is W[:, :, :s]^T x[t] +
        W[:, :, s:]^T x[t-1], x[-1] being the carried column (zeros at a stream's start)."""
        b, c_in, t = x.shape
        w, s = self.conv.weight, self.stride  # w: [Cin, Cout, 2s]
        xp = carried(carry, self, x, 1) if carry is not None else F.pad(x, (1, 0))  # [B, Cin, 1 + T]
        y = torch.matmul(w.reshape(c_in, -1).t(), xp)  # in TF32 under the tf32 codec's block
        y = y.view(b, w.shape[1], 2, s, t + 1)  # [B, Cout, 2, s, 1+T]
        out = x.new_empty(b, w.shape[1], t, s)
        with torch.no_grad():  # inference only; `out=` refuses tensors that track gradients
            torch.add(y[:, :, 0, :, 1:], y[:, :, 1, :, :-1], out=out.transpose(-1, -2))  # overlap-add, one pass
        out = out.view(b, w.shape[1], t * s)
        return out if bias is None else out.add_(bias[:, None])

    def lookback(self, j: int) -> int:
        return -((self.kernel - 1 - j) // self.stride)  # ceil((j - K + 1) / s)


def snake(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, pad: int = 0) -> torch.Tensor:
    """x + sin^2(x * e^alpha) / e^beta, per channel, then `pad` zero columns on the left (the next causal
    conv's padding). x: [B, C, T]; alpha, beta: [C] -> [B, C, pad + T]"""
    freq = alpha.exp()[None, :, None]
    gain = 1.0 / (beta.exp()[None, :, None] + SNAKE_EPS)
    y = x + gain * torch.sin(x * freq).pow(2)
    return F.pad(y, (pad, 0)) if pad else y


_compiled_snake: Callable[..., torch.Tensor] | None = None


def fused_snake(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, pad: int = 0) -> torch.Tensor:
    """`snake` as one kernel: on CUDA the Triton kernel of omni_tts.kernels.snake (one read of x, one write
    of the padded output, instead of the six passes of the eager ops and the conv's padded copy: at 24 kHz
    and many rows those passes are the vocoder's memory traffic); elsewhere `snake` compiled once per
    process (Inductor, dynamic shapes)."""
    global _compiled_snake
    if x.is_cuda and codec_kernels.available():
        return codec_kernels.snake(x, alpha, beta, pad, SNAKE_EPS)[1]
    if _compiled_snake is None:
        # not fullgraph: should a long-running server hit dynamo's recompile limit (a new size class, e.g.
        # batch == time steps, compiles once more), the call runs as eager ops instead of failing the decode
        _compiled_snake = torch.compile(snake, dynamic=True)
    return _compiled_snake(x, alpha, beta, pad)


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / e^beta, per channel (alpha, beta stored in log scale)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self.impl: Callable[..., torch.Tensor] = snake  # or fused_snake (CodecDecoder.set_fused)

    def forward(self, x: torch.Tensor, pad: int = 0) -> torch.Tensor:  # x: [B, C, T] -> [B, C, pad + T]
        # detached: plain tensors get dynamic shapes (dynamo keeps parameter shapes static, which made one
        # compile per channel count of the compiled function)
        return self.impl(x, self.alpha.detach(), self.beta.detach(), pad)

    def fused(self, p: Pending, pad: int = 0, keep: bool = False, last: bool = False, phases: int = 1
              ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The sums of p and this activation as one Triton kernel (CUDA, or the interpreter): -> (the summed
        tensor [B, C, T] if keep else None, the activation [B, C, pad + T] with the next conv's padding,
        laid out channels last if `last`, or in `phases` for a dilated conv's `phased`)."""
        return codec_kernels.snake(p.raw, self.alpha.detach(), self.beta.detach(), pad, SNAKE_EPS, p.bias,
                                   p.res, keep, channels_last=last, phases=phases, x_phases=p.phases,
                                   length=p.length)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1, self.conv1 = SnakeBeta(dim), CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2, self.conv2 = SnakeBeta(dim), CausalConv1d(dim, dim, 1)

    def forward(self, x: torch.Tensor, carry: Carry | None = None) -> torch.Tensor:  # x: [B, C, T]
        h = self.conv1(self.act1(x, pad=self.conv1.reach), padded=True, carry=carry)  # h: [B, C, T]
        return x + self.conv2(self.act2(h))

    def pending(self, p: Pending, carry: Carry | None = None) -> Pending:
        """forward on a pending input, the output left pending: 2 element-wise kernels instead of 5 (the
        convs' bias adds and the residual add move into the snakes), which write the convs' inputs channels
        last (the dilated conv's in phases, see `CausalConv1d.phased`)."""
        conv1, d = self.conv1, self.conv1.conv.dilation[0]
        x, s = self.act1.fused(p, conv1.reach, keep=True, last=d == 1, phases=d)  # x: the unit's input, summed
        q = conv1.pending(s, padded=True, carry=carry) if d == 1 else conv1.phased(s, x.shape[-1], carry)
        _, s = self.act2.fused(q, last=True)  # s: [B, C, T]
        return self.conv2.pending(s)._replace(res=x)

    def lookback(self, j: int) -> int:
        return self.conv1.lookback(self.conv2.lookback(j))


class VocoderStage(nn.Module):
    """Snake, x`rate` transposed-conv upsampling halving the channels, three dilated residual units."""

    def __init__(self, c_in: int, c_out: int, rate: int):
        super().__init__()
        units = [ResidualUnit(c_out, d) for d in RESIDUAL_DILATIONS]
        self.block = nn.ModuleList([SnakeBeta(c_in), CausalUpConv1d(c_in, c_out, 2 * rate, rate), *units])

    def forward(self, x: torch.Tensor, carry: Carry | None = None) -> torch.Tensor:  # [B, Cin, T] -> [B, Cout, T*rate]
        act, up, *units = self.block
        x = up(act(x), carry)
        for unit in units:
            x = unit(x, carry)
        return x

    def pending(self, p: Pending, carry: Carry | None = None) -> Pending:
        """forward on a pending input, the output left pending (see ResidualUnit.pending)."""
        act, up, *units = self.block
        if up.gemm:
            p = up.pending(act.fused(p)[1], carry)  # [B, Cout, T*rate]
        else:  # cuDNN's transposed conv, on channels-last input with the carried column written in front
            p = up.pending(act.fused(p, up.reach, last=True)[1], carry, padded=True)
        for unit in units:
            p = unit.pending(p, carry)
        return p

    def lookback(self, j: int) -> int:
        return chain_lookback(self.block, j)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=CONVNEXT_LN_EPS)
        self.pwconv1, self.pwconv2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, carry: Carry | None = None) -> torch.Tensor:  # x: [B, C, T]
        h = self.norm(self.dwconv(x, carry=carry).transpose(1, 2))  # h: [B, T, C]
        h = self.gamma * self.pwconv2(F.gelu(self.pwconv1(h)))
        return x + h.transpose(1, 2)

    def lookback(self, j: int) -> int:
        return self.dwconv.lookback(j)


def chain_lookback(layers: Any, j: int) -> int:
    """Earliest input index that output index j of `layers` (applied in order) depends on."""
    for layer in reversed(list(layers)):
        j = layer.lookback(j) if hasattr(layer, "lookback") else j  # pointwise layers keep j
    return j


class CodebookGroup(nn.Module):
    """Some of the residual codebooks, summed then projected (1x1 conv, no bias) to codebook_dim."""

    def __init__(self, n_books: int, size: int, dim: int, out_dim: int):
        super().__init__()
        self.register_buffer("tables", torch.zeros(n_books, size, dim), persistent=False)
        self.output_proj = nn.Conv1d(dim, out_dim, 1, bias=False)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:  # codes: [B, T, n] -> [B, out_dim, T]
        summed = self.tables[0][codes[..., 0]]  # summed: [B, T, dim]
        for i in range(1, codes.shape[-1]):
            summed = summed + self.tables[i][codes[..., i]]
        return self.output_proj(summed.transpose(1, 2))
