"""omni_tts.kernels.causal_conv: the Triton causal conv (run here in Triton's CPU interpreter) against
F.conv1d, the function it replaces, alone (dilations, channel blocks, float16 and float32 inputs, row
strides of a wider buffer) and inside the codec's pending vocoder, in one pass and streamed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")  # conftest.py sets TRITON_INTERPRET=1 without CUDA

from _fixtures import fixture_dir  # noqa: E402

from omni_tts.kernels import causal_conv  # noqa: E402
from omni_tts.models.checkpoint import load_checkpoint  # noqa: E402
from omni_tts.models.codec.decoder import CodecDecoder  # noqa: E402
from omni_tts.models.codec.layers import CausalConv1d  # noqa: E402


@pytest.mark.parametrize(("c_in", "c_out", "dilation", "dtype"), [
    (32, 64, 1, torch.float32), (64, 96, 3, torch.float16), (96, 32, 9, torch.float16), (32, 48, 3, torch.float32)])
def test_the_kernel_is_conv1d_on_a_padded_input(c_in: int, c_out: int, dilation: int, dtype: torch.dtype) -> None:
    torch.manual_seed(c_out + dilation)
    reach, T = 6 * dilation, 300  # T not a whole number of the kernel's sample blocks
    wide = torch.randn(2, c_in + 8, reach + T)  # rows of a wider buffer: the channel and row strides differ
    xp, w = wide[:, 4: 4 + c_in].to(dtype), (torch.randn(c_out, c_in, 7) / c_in ** 0.5).to(dtype)
    got = causal_conv.conv(xp, causal_conv.taps(w), dilation)
    want = F.conv1d(xp.float(), w.float(), dilation=dilation)
    assert got.dtype == dtype and got.shape == (2, c_out, T) and got.is_contiguous()
    tol = 1e-4 if dtype == torch.float32 else 4 * torch.finfo(dtype).eps * float(want.abs().max())
    torch.testing.assert_close(got.float(), want, rtol=0, atol=tol)
    assert causal_conv.conv(xp[..., : reach], causal_conv.taps(w), dilation).shape == (2, c_out, 0)


def test_channels_that_do_not_fill_its_tiles_stay_with_torch() -> None:
    assert causal_conv.usable(32, 16) and not causal_conv.usable(16, 32) and not causal_conv.usable(32, 8)
    conv = CausalConv1d(16, 16, 7, dilation=3)
    conv.tf32 = True
    assert not conv._kernel(torch.zeros(1, 16, 30))
    wide = CausalConv1d(32, 32, 7)
    assert wide._kernel(torch.zeros(1, 32, 30, dtype=torch.float16)) and not wide._kernel(torch.zeros(1, 32, 30))
    wide.tf32 = True  # float32 in TF32 only; never bfloat16
    assert wide._kernel(torch.zeros(1, 32, 30)) and not wide._kernel(torch.zeros(1, 32, 30, dtype=torch.bfloat16))


@pytest.mark.parametrize("pieces", [(6,), (1, 2, 3)])
def test_pending_vocoder_with_the_kernel_decodes_as_the_module_vocoder(pieces: tuple[int, ...]) -> None:
    """With TF32 allowed (float32 in the interpreter) the 32- and 64-channel convs of the tiny codec take
    the kernel: the vocoder in one pass and streamed with carried state equals the modules' forward."""
    dec = CodecDecoder.from_checkpoint(load_checkpoint(fixture_dir("custom_voice"))).set_precision("tf32")
    convs = [m for m in dec.modules() if isinstance(m, CausalConv1d)]
    used = [m for m in convs if m._kernel(torch.zeros(1, m.conv.in_channels, 8))]
    assert len(used) >= 4  # the first conv and the first stage's dilated convs
    lat = torch.randn(2, dec.upsample[0][0].conv.in_channels, 6, generator=torch.Generator().manual_seed(6))
    carry: dict = {}
    out, at = [], 0
    with torch.inference_mode():
        ref = dec._vocode(lat)
        for n in pieces:
            x = lat[..., at: at + n]
            for up, block in dec.upsample:
                x = block(up(x, carry), carry)
            out.append(dec._vocode_pending(x, carry))
            at += n
    got = torch.cat(out, dim=-1)
    assert got.shape == ref.shape and float(ref.abs().max()) > 1e-3
    assert all(m._taps is not None for m in used)
    assert float((got - ref).abs().max()) <= 1e-5 * max(1.0, float(ref.abs().max()))
