"""omni_tts.kernels.talker in Triton's CPU interpreter against the Inductor-path units they replace
(omni_tts.engine.step_impl.talker_attn_in / talker_attn_out and models.layers.gqa_attention, run uncompiled) on the
tiny checkpoint's real talker layers: q, layer output and the cache rows written at each row's own
position, and the decode attention over each row's first pos+1 positions (blocks of 32, so a long
cache streams several), float32 and bfloat16; and the probe. Skips where triton is not installed."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("triton")  # conftest.py sets TRITON_INTERPRET=1 without CUDA

from omni_tts.kernels import talker as talker_kernels  # noqa: E402
from omni_tts.engine.step_impl import fuse_layer, talker_attn_in, talker_attn_out  # noqa: E402
from omni_tts.models.layers import gqa_attention  # noqa: E402
from test_fastpath import model_and_fast  # noqa: E402


def _talker_pair(dtype: torch.dtype, pos: list[int]) -> tuple[torch.Tensor, ...]:
    """One talker layer step for len(pos) rows at positions pos, through the kernels and the Inductor-path
    units: -> (q, out, k cache, v cache) of the kernels, then the same of the reference."""
    m, _ = model_and_fast()
    tk = m.talker
    layer = copy.deepcopy(tk.layers[-1]).to(dtype)
    w = fuse_layer(layer)
    a = layer.self_attn
    B, M = len(pos), 12
    torch.manual_seed(sum(pos))
    x = torch.randn(B, 1, tk.layers[0].input_layernorm.weight.shape[0]).to(dtype)
    p = torch.tensor(pos)
    cos, sin = tk.rope(p[:, None], dtype)  # [B, 1, hd]
    kc0 = torch.randn(B, a.kv_heads, M, a.head_dim).to(dtype)
    vc0 = torch.randn_like(kc0)
    out = []
    for attn_in, attn_out, extra in ((talker_kernels.talker_attn_in, talker_kernels.talker_attn_out, ()),
                                     (talker_attn_in, talker_attn_out, None)):
        kc, vc = kc0.clone(), vc0.clone()
        args = (torch.arange(B), p) if extra is None else (p,)
        q = attn_in(layer, w[0], w[1], x, cos, sin, kc, vc, *args)  # [B, H, 1, hd]
        att = torch.randn(B, a.heads, 1, a.head_dim, generator=torch.Generator().manual_seed(1)).to(dtype)
        out += [q, attn_out(layer, w[2], x, att), kc, vc]
    return tuple(out)


def test_talker_kernels_equal_the_inductor_path_units_in_float32() -> None:
    got = _talker_pair(torch.float32, [3, 0, 11])
    for g, r in zip(got[:4], got[4:]):  # q, layer output, K cache, V cache (rows written at their own positions)
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


def test_talker_kernels_agree_to_bfloat16_rounding() -> None:
    got = _talker_pair(torch.bfloat16, [5, 9])
    for g, r in zip(got[:4], got[4:]):  # loosely, as for the predictor layer (the interpreter's bf16 rounding)
        scale = r.float().abs().max().item()
        assert (g.float() - r.float()).abs().max().item() <= 0.03 * scale
        assert (g.float() - r.float()).abs().mean().item() <= 0.005 * scale


def _attention_pair(dtype: torch.dtype, pos: list[int], M: int = 80) -> tuple[torch.Tensor, torch.Tensor]:
    m, _ = model_and_fast()
    a = m.talker.layers[0].self_attn
    B = len(pos)
    torch.manual_seed(M + sum(pos))
    q = torch.randn(B, a.heads, 1, a.head_dim).to(dtype)
    kc = torch.randn(B, a.kv_heads, M, a.head_dim).to(dtype)
    vc = torch.randn_like(kc)
    p = torch.tensor(pos)
    L = max(pos) + 1  # the kv bucket: positions beyond a row's own are masked
    mask = (torch.arange(L)[None, :] <= p[:, None])[:, None, None]
    return talker_kernels.decode_attention(q, kc, vc, p, L), gqa_attention(q, kc[:, :, :L], vc[:, :, :L], mask)


def test_decode_attention_equals_sdpa_over_each_rows_positions() -> None:
    got, ref = _attention_pair(torch.float32, [0, 31, 32, 70])  # one key, a full block, a block edge, 3 blocks
    assert got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_decode_attention_agrees_to_bfloat16_rounding() -> None:
    got, ref = _attention_pair(torch.bfloat16, [5, 40])
    torch.testing.assert_close(got.float(), ref.float(), rtol=0.03, atol=0.03)


def test_decode_attention_reads_strided_queries() -> None:
    m, _ = model_and_fast()
    a = m.talker.layers[0].self_attn
    q = torch.randn(2, 1, a.heads, a.head_dim).transpose(1, 2)  # [B, H, 1, hd], not contiguous
    kc = torch.randn(2, a.kv_heads, 8, a.head_dim)
    p = torch.tensor([3, 7])
    mask = (torch.arange(8)[None, :] <= p[:, None])[:, None, None]
    torch.testing.assert_close(talker_kernels.decode_attention(q, kc, kc, p, 8), gqa_attention(q, kc, kc, mask),
                               rtol=1e-5, atol=1e-5)


def test_probe_builds_the_talker_kernels() -> None:
    m, _ = model_and_fast()
    layer = m.talker.layers[0]
    assert talker_kernels.probe(layer, fuse_layer(layer), [1, 2, 3], 2, [8, 40], torch.float32) == ""
    gelu = copy.deepcopy(layer)
    gelu.mlp.act = torch.nn.functional.gelu
    assert "activation" in talker_kernels.probe(gelu, fuse_layer(gelu), [1], 2, None, torch.float32)
