"""The forms the codec's convs take on cuDNN: channels-last input read in place, and narrow convs folded.

Owns: `channels_last` (whether a [B, C, T] tensor lies channels last), `conv_channels_last` (a conv of such
an input as a 2-D conv, which cuDNN reads without a transpose), and the folded form of an undilated conv:
`fold_weight` and `conv_folded` run it over g samples folded into g times the channels, the same sums over
wider channels (cuDNN's kernels for narrow channels are slower and put a conversion pass before them).
Does not know: layers, carries, streaming; tensors in, tensors out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# below this many input channels an undilated conv on channels-last input runs on pairs of samples folded
# into twice the channels: cuDNN's kernels for narrow channels are the slow ones
FOLD_BELOW = 128


def channels_last(x: torch.Tensor) -> bool:  # x [B, C, T]: a SnakeBeta wrote it so for the conv after it
    return x.shape[1] > 1 and x.stride(1) == 1 and x.stride(2) == x.shape[1]


def conv_channels_last(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride: int = 1,
                       dilation: int = 1, groups: int = 1, transposed: bool = False) -> torch.Tensor:
    """A conv (no padding) of a channels-last x [B, C, T] as a 2-D conv over [B, C, 1, T], which cuDNN reads
    as it lies (conv1d would copy x to channels first, cuDNN transpose it back) -> [B, Cout, T'] alike."""
    x4, w4 = x.unsqueeze(2), weight.unsqueeze(2)
    if transposed:
        return F.conv_transpose2d(x4, w4, bias, (1, stride)).squeeze(2)
    return F.conv2d(x4, w4, bias, (1, stride), 0, (1, dilation), groups).squeeze(2)


def fold_weight(weight: torch.Tensor, g: int) -> torch.Tensor:
    """The [Cout, Cin, K] weight of an undilated conv as the weight [g * Cout, g * Cin, Kf] of the same conv
    over its input folded g samples to a step (sample g * s + p, channel c at step s, channel p * Cin + c),
    its output folded alike: output phase q's tap k reads step (q + k) // g, phase (q + k) % g; the other
    taps of the folded weight are zeros."""
    cout, cin, k = weight.shape
    kf = (g + k - 2) // g + 1
    w = weight.new_zeros(g, cout, kf, g, cin)  # [q, o, j, p, c]
    for q in range(g):
        for tap in range(k):
            j, p = divmod(q + tap, g)
            w[q, :, j, p] = weight[:, :, tap]
    return w.permute(0, 1, 3, 4, 2).reshape(g * cout, g * cin, kf)


def conv_folded(x: torch.Tensor, folded: torch.Tensor) -> torch.Tensor:
    """An undilated conv (no padding) of a channels-last x [B, C, S] with a `fold_weight(w, g)` weight: x read
    as [B, g * C, S / g] channels last (a view), the output [B, g * Cout, T / g] channels last read back as
    [B, Cout, T] channels last (a view). S and T = S - K + 1 multiples of g."""
    B, C, S = x.shape
    g = folded.shape[1] // C
    xf = x.transpose(1, 2).reshape(B, S // g, g * C).transpose(1, 2)
    y = conv_channels_last(xf, folded)  # [B, g * Cout, T / g]
    return y.transpose(1, 2).reshape(B, -1, folded.shape[0] // g).transpose(1, 2)
