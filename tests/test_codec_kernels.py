"""omni_tts.kernels.snake: the Triton SnakeBeta (in Triton's CPU interpreter, or on the GPU where there is one, with
TF32 off) against the function it implements, omni_tts.models.codec.layers.snake, alone (strided inputs, the conv
padding it writes, the bias and residual sums it takes over) and inside the decoder (each activation alone, and
the whole pending-sum vocoder)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

pytest.importorskip("triton")  # conftest.py sets TRITON_INTERPRET=1 without CUDA

from _fixtures import fixture_dir  # noqa: E402

from omni_tts.kernels import snake as codec_kernels  # noqa: E402
from omni_tts.models.checkpoint import load_checkpoint  # noqa: E402
from omni_tts.models.codec.decoder import CodecDecoder  # noqa: E402
from omni_tts.models.codec.layers import SNAKE_EPS, SnakeBeta, snake  # noqa: E402
from omni_tts.models.precision import exact  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def _ieee() -> Iterator[None]:
    """Float32 convs and matmuls in IEEE on a GPU too: TF32 would round the two paths' small differences
    apart."""
    with exact(DEV):
        yield


def _decoder() -> CodecDecoder:
    return CodecDecoder.from_checkpoint(load_checkpoint(fixture_dir("custom_voice"))).to(DEV)


def _channels_last(t: torch.Tensor) -> torch.Tensor:
    """t [B, C, T] laid out as a contiguous [B, T, C] tensor: the residual stream's layout."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("pad", [0, 6, 18])
def test_snake_kernel_equals_the_eager_ops_on_strided_inputs(pad: int) -> None:
    torch.manual_seed(0)
    base = (torch.randn(2, 5, 2600) * 4).to(DEV)
    alpha, beta = (torch.randn(5) * 0.5).to(DEV), (torch.randn(5) * 0.5).to(DEV)
    permuted = base.transpose(0, 1).contiguous().transpose(0, 1)[..., 7:]  # rows in another memory order
    for x in (base, base[..., :2500], permuted):  # plain, trimmed, permuted
        h, got = codec_kernels.snake(x, alpha, beta, pad, SNAKE_EPS)
        want = snake(x, alpha, beta, pad)
        assert h is None and got.shape == want.shape and got.is_contiguous()
        assert torch.equal(got[..., :pad], torch.zeros_like(got[..., :pad]))  # the conv's left padding
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)  # sin may differ in the last bit


def test_snake_kernel_reads_and_writes_channels_last() -> None:
    """A channels-last input (a channels-last conv's output) in, the output written channels last with its
    padding: the same values as the eager ops, laid out as a [B, pad + T, C] tensor seen as [B, C, pad + T],
    and the summed h channels last over res."""
    torch.manual_seed(2)
    x = (torch.randn(2, 2300, 20) * 3).to(DEV).transpose(1, 2)  # [B, C, T], channels last
    alpha, beta, bias = (t.to(DEV) for t in (torch.randn(20) * 0.5, torch.randn(20) * 0.5, torch.randn(20)))
    res = _channels_last((torch.randn(2, 20, 2300) * 3).to(DEV))
    want_h = res + (x + bias[None, :, None])
    h, got = codec_kernels.snake(x, alpha, beta, 6, SNAKE_EPS, bias=bias, res=res.clone(), keep=True,
                                 channels_last=True)
    assert got.shape == (2, 20, 2306) and got.stride() == (2306 * 20, 1, 20) and h.transpose(1, 2).is_contiguous()
    assert torch.equal(h, want_h) and torch.equal(got[..., :6], torch.zeros(2, 20, 6, device=DEV))
    torch.testing.assert_close(got, snake(want_h, alpha, beta, 6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("d,T,pad", [(3, 40, 18), (9, 31, 54), (9, 99, 54), (3, 39, 18)])
def test_snake_kernel_writes_and_reads_dilation_phases(d: int, T: int, pad: int) -> None:
    """phases=d: the padded activation laid out as d sequences (sample u at [b, u % d, u // d, c]) of an
    even number of steps, zeros in the padding and past its end; x_phases=d reads such a tensor back as the
    samples it holds."""
    torch.manual_seed(3)
    x = (torch.randn(2, 20, T) * 3).to(DEV)
    alpha, beta, bias = (t.to(DEV) for t in (torch.randn(20) * 0.5, torch.randn(20) * 0.5, torch.randn(20)))
    res = _channels_last((torch.randn(2, 20, T) * 3).to(DEV))
    want_h = res + (x + bias[None, :, None])
    h, got = codec_kernels.snake(x, alpha, beta, pad, SNAKE_EPS, bias=bias, res=res.clone(), keep=True, phases=d)
    steps = -(-(pad + T) // d)
    steps += steps % 2
    assert got.shape == (2, d, steps, 20) and got.is_contiguous() and torch.equal(h, want_h)
    full = torch.nn.functional.pad(snake(want_h, alpha, beta, pad), (0, steps * d - pad - T))  # [B, C, S*d]
    as_phases = full.view(2, 20, steps, d).permute(0, 3, 2, 1)
    torch.testing.assert_close(got, as_phases, rtol=1e-5, atol=1e-5)
    zero = torch.zeros_like(full, dtype=torch.bool)
    zero[..., :pad], zero[..., pad + T:] = True, True
    assert torch.equal(got[zero.view(2, 20, steps, d).permute(0, 3, 2, 1)], torch.zeros(int(zero.sum()), device=DEV))
    _, again = codec_kernels.snake(got, alpha, beta, 0, SNAKE_EPS, x_phases=d, length=pad + T)
    torch.testing.assert_close(again, snake(full[..., :pad + T], alpha, beta), rtol=1e-5, atol=1e-5)


def test_snake_kernel_64_bit_offsets_agree_with_32_bit_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows too large for 32-bit offsets take 64-bit ones: the same output and h, in phases and channels last
    (small tensors here, the size check forced)."""
    torch.manual_seed(4)
    x = (torch.randn(2, 40, 20) * 3).to(DEV).transpose(1, 2)  # channels last
    alpha, beta, bias = (t.to(DEV) for t in (torch.randn(20) * 0.5, torch.randn(20) * 0.5, torch.randn(20)))
    res = _channels_last((torch.randn(2, 20, 40) * 3).to(DEV))
    runs = {}
    for wide in (False, True):
        if wide:
            monkeypatch.setattr(codec_kernels, "_fits_32", lambda *a: False)
        h, phased = codec_kernels.snake(x, alpha, beta, 18, SNAKE_EPS, bias=bias, res=res.clone(), keep=True,
                                        phases=3)
        runs[wide] = (h, phased, codec_kernels.snake(x, alpha, beta, 6, SNAKE_EPS, channels_last=True)[1])
    assert all(torch.equal(a, b) for a, b in zip(runs[False], runs[True]))


def test_decoder_with_the_kernel_decodes_as_with_the_eager_ops() -> None:
    """Every SnakeBeta through the kernel, each writing its conv's padding: the same audio."""
    dec = _decoder()
    codes = torch.randint(0, 16, (2, 9, dec.num_quantizers), generator=torch.Generator().manual_seed(3)).to(DEV)
    ref = dec.decode_window(codes, 4)
    acts = [m for m in dec.modules() if isinstance(m, SnakeBeta)]
    for m in acts:
        m.impl = lambda x, a, b, pad: codec_kernels.snake(x, a, b, pad, SNAKE_EPS)[1]
    got = dec.decode_window(codes, 4)
    assert len(acts) > 4 and got.shape == ref.shape
    assert float((got - ref).abs().max()) <= 1e-5 * max(1.0, float(ref.abs().max()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_snake_kernel_sums_bias_and_residual_as_the_eager_adds_do(dtype: torch.dtype) -> None:
    """h = (x + bias) + res rounded after each add, as a conv's bias add then the residual add round it
    (float32: bit for bit), kept, and the activation of h."""
    torch.manual_seed(1)
    base = (torch.randn(2, 4, 2100) * 3).to(DEV, dtype)
    x = base[..., :2000]  # a trimmed transposed-conv output: strided
    bias, res = torch.randn(4).to(DEV, dtype), _channels_last((torch.randn(2, 4, 2000) * 3).to(DEV, dtype))
    alpha, beta = (torch.randn(4) * 0.5).to(DEV), (torch.randn(4) * 0.5).to(DEV)
    want_h = res + (x + bias[None, :, None])
    h, got = codec_kernels.snake(x, alpha, beta, 6, SNAKE_EPS, bias=bias, res=res, keep=True)
    assert h.data_ptr() == res.data_ptr()  # written over res (which the vocoder no longer needs)
    if dtype == torch.float32:
        assert torch.equal(h, want_h)
    else:  # the CPU interpreter's float32 -> bfloat16 cast truncates (the GPU's rounds to nearest): up to
        # 1 ulp per add, and an ulp is <= 2^-4 for |h| < 16
        assert float((h.float() - want_h.float()).abs().max()) <= 2.0 ** -3
    want = snake(want_h.float(), alpha, beta, 6).to(dtype)
    tol = 1e-5 if dtype == torch.float32 else 2.0 ** -2  # bf16: h's two ulps, then the activation's own
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    h2, got2 = codec_kernels.snake(x, alpha, beta, 0, SNAKE_EPS, bias=bias)  # bias only, nothing kept
    assert h2 is None
    want2 = snake((x + bias[None, :, None]).float(), alpha, beta).to(dtype)
    torch.testing.assert_close(got2.float(), want2.float(), rtol=tol, atol=tol)


def test_pending_vocoder_decodes_as_the_module_vocoder() -> None:
    """CodecDecoder._vocode_pending (convs without their bias, the sums inside the snake kernels: the CUDA
    path of a fused codec) against the modules' own forward on the same latent."""
    dec = _decoder()
    lat = torch.randn(2, dec.upsample[0][0].conv.in_channels, 5, generator=torch.Generator().manual_seed(4)).to(DEV)
    x = lat
    with torch.inference_mode():
        for up, block in dec.upsample:
            x = block(up(x))
        ref = dec._vocode(lat)
        got = dec._vocode_pending(x)
    assert got.shape == ref.shape and float(ref.abs().max()) > 1e-3
    assert float((got - ref).abs().max()) <= 1e-5 * max(1.0, float(ref.abs().max()))


def test_pending_vocoder_streamed_with_carried_state_decodes_as_in_one_pass() -> None:
    """The fused path streamed: each conv's carried input columns go into the zero padding the kernel
    wrote (in place), so latent frames vocoded 1, 2 then 3 at a time join to the eager one-pass vocoder."""
    dec = _decoder()
    lat = torch.randn(2, dec.upsample[0][0].conv.in_channels, 6, generator=torch.Generator().manual_seed(5)).to(DEV)
    carry: dict = {}
    pieces, at = [], 0
    with torch.inference_mode():
        ref = dec._vocode(lat)
        for n in (1, 2, 3):
            x = lat[..., at: at + n]
            for up, block in dec.upsample:
                x = block(up(x, carry), carry)
            pieces.append(dec._vocode_pending(x, carry))
            at += n
    got = torch.cat(pieces, dim=-1)
    assert got.shape == ref.shape and float(ref.abs().max()) > 1e-3
    assert float((got - ref).abs().max()) <= 1e-5 * max(1.0, float(ref.abs().max()))
