"""omni_tts.codec_kernels: the Triton SnakeBeta (run here in Triton's CPU interpreter) against the eager
ops of codec_layers.snake, alone (strided inputs, the conv padding it writes) and inside the decoder."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # conftest.py sets TRITON_INTERPRET=1 without CUDA

from omni_tts import codec_kernels  # noqa: E402
from omni_tts.checkpoint import load_checkpoint  # noqa: E402
from omni_tts.codec import CodecDecoder  # noqa: E402
from omni_tts.codec_layers import SNAKE_EPS, SnakeBeta, snake  # noqa: E402
from _fixtures import FIXTURES  # noqa: E402


@pytest.mark.parametrize("pad", [0, 6, 18])
def test_snake_kernel_equals_the_eager_ops_on_strided_inputs(pad: int) -> None:
    torch.manual_seed(0)
    base = torch.randn(2, 5, 2600) * 4
    alpha, beta = torch.randn(5) * 0.5, torch.randn(5) * 0.5
    for x in (base, base[..., :2500], base.transpose(0, 1).contiguous().transpose(0, 1)[..., 7:]):  # plain, trimmed, rows permuted
        got = codec_kernels.snake(x, alpha, beta, pad, SNAKE_EPS)
        want = snake(x, alpha, beta, pad)
        assert got.shape == want.shape and got.is_contiguous()
        assert torch.equal(got[..., :pad], torch.zeros_like(got[..., :pad]))  # the conv's left padding
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # sin may differ in the last bit


def test_decoder_with_the_kernel_decodes_as_with_the_eager_ops() -> None:
    """Every SnakeBeta through the kernel, each writing its conv's padding: the same audio."""
    dec = CodecDecoder.from_checkpoint(load_checkpoint(FIXTURES / "custom_voice"))
    codes = torch.randint(0, 16, (2, 9, dec.num_quantizers), generator=torch.Generator().manual_seed(3))
    ref = dec.decode_window(codes, 4)
    acts = [m for m in dec.modules() if isinstance(m, SnakeBeta)]
    for m in acts:
        m.impl = lambda x, a, b, pad: codec_kernels.snake(x, a, b, pad, SNAKE_EPS)
    got = dec.decode_window(codes, 4)
    assert len(acts) > 4 and got.shape == ref.shape
    assert float((got - ref).abs().max()) <= 1e-5 * max(1.0, float(ref.abs().max()))
