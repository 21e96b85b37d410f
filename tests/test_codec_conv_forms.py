"""The forms the codec's convs take on cuDNN (omni_tts.models.codec.conv_forms and the conv layers' fast
paths) against each conv's own forward, in float32 on the CPU: one pass, and streamed with the carried
columns written into the padding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from omni_tts.models.codec.conv_forms import channels_last, conv_folded, fold_weight
from omni_tts.models.codec.layers import CausalConv1d, CausalUpConv1d


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(1, 2).contiguous().transpose(1, 2)


def test_a_conv_with_nothing_to_pad_does_not_copy_its_input() -> None:
    """A kernel-1 conv (the residual units' second) reads its input as it is; a wider one pads it."""
    x = torch.randn(2, 8, 19)
    assert CausalConv1d(8, 6, 1)._padded(x, False, None) is x
    assert CausalConv1d(8, 6, 3)._padded(x, False, None).shape == (2, 8, 21)


@pytest.mark.parametrize("stride", [3, 5])
def test_a_transposed_conv_on_padded_channels_last_input_equals_its_forward(stride: int) -> None:
    """CausalUpConv1d.pending(padded=True), cuDNN's form in the fused vocoder: an input with its reach of zero
    columns in front, channels first or last, one pass or streamed with the carried column written into
    those zeros, gives the forward's output (the bias left pending)."""
    torch.manual_seed(stride)
    up = CausalUpConv1d(6, 4, 2 * stride, stride).eval()
    x = torch.randn(2, 6, 9)
    want = up(x)
    with torch.no_grad():
        for last in (False, True):
            def padded(piece: torch.Tensor) -> torch.Tensor:
                xp = F.pad(piece, (up.reach, 0))
                return _channels_last(xp) if last else xp
            p = up.pending(padded(x), padded=True)
            assert channels_last(p.raw) == last
            torch.testing.assert_close(p.raw + p.bias[:, None], want, rtol=1e-5, atol=1e-5)
            carry: dict = {}
            pieces = [up.pending(padded(x[..., a:b]), carry, padded=True) for a, b in ((0, 4), (4, 5), (5, 9))]
            got = torch.cat([q.raw + q.bias[:, None] for q in pieces], dim=-1)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("c_out", [1, 3])
def test_a_conv_to_few_outputs_as_one_gemm_to_its_taps_equals_its_forward(c_out: int) -> None:
    """CausalConv1d.taps (the fused vocoder's last conv) on padded channels-last input, in one pass and
    streamed with the carried columns written into the padding, gives the forward's output."""
    torch.manual_seed(c_out)
    conv = CausalConv1d(5, c_out, 7).eval()
    x = torch.randn(2, 5, 13)

    def padded(piece: torch.Tensor) -> torch.Tensor:
        return _channels_last(F.pad(piece, (conv.reach, 0)))
    with torch.no_grad():
        want = conv(x)
        torch.testing.assert_close(conv.taps(padded(x)), want, rtol=1e-5, atol=1e-5)
        carry: dict = {}
        got = torch.cat([conv.taps(padded(x[..., a:b]), carry) for a, b in ((0, 2), (2, 3), (3, 13))], dim=-1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("g,kernel", [(2, 7), (2, 3), (3, 7)])
def test_a_conv_over_folded_samples_equals_the_conv(g: int, kernel: int) -> None:
    """conv_folded with fold_weight(w, g): g samples folded into g times the channels (views of channels-last
    memory), the same outputs as the conv."""
    torch.manual_seed(g * kernel)
    w, x = torch.randn(3, 5, kernel), torch.randn(2, 5, 4 * g * 3 + kernel - 1)  # S and S - K + 1: multiples of g
    got = conv_folded(_channels_last(x), fold_weight(w, g))
    assert channels_last(got)
    torch.testing.assert_close(got, F.conv1d(x, w), rtol=1e-5, atol=1e-5)


def test_a_narrow_conv_runs_folded_on_even_channels_last_input_and_plainly_else() -> None:
    """CausalConv1d.pending takes the folded form where the input is channels last, narrow and of an even
    length (the fused vocoder's kernel-7 convs), the plain one on an odd length; both equal the forward."""
    torch.manual_seed(0)
    conv = CausalConv1d(6, 6, 7).eval()
    for length in (10, 11):
        x = torch.randn(2, 6, length)
        xp = _channels_last(F.pad(x, (conv.reach, 0)))
        assert conv._folds(xp) == (length % 2 == 0)
        with torch.no_grad():
            p = conv.pending(xp, padded=True)
            torch.testing.assert_close(p.raw + p.bias[:, None], conv(x), rtol=1e-5, atol=1e-5)
