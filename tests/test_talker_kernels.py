"""omni_tts.kernels.talker in Triton's CPU interpreter against the units they implement
(omni_tts.models.compiled.fast_path.talker_attn_in / talker_attn_out, run uncompiled) on the tiny checkpoint's real
talker layers: q, layer output and the cache rows written at each row's own position, float32 and
bfloat16; a whole layer step around omni_tts.models.layers.gqa_attention against the reference
DecoderLayer; and the probe. Skips where triton is not installed."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("triton")  # conftest.py sets TRITON_INTERPRET=1 without CUDA

from test_fastpath import model_and_fast  # noqa: E402

from omni_tts.kernels import configs as kernel_configs  # noqa: E402
from omni_tts.kernels import talker as talker_kernels  # noqa: E402
from omni_tts.models.compiled.fast_path import fuse_layer, talker_attn_in, talker_attn_out  # noqa: E402
from omni_tts.models.layers import gqa_attention  # noqa: E402

pytestmark = pytest.mark.interpreter  # CPU tensors (its gpu tests excepted): conftest.py


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


@pytest.mark.parametrize("rows", [16, 40])
def test_talker_kernels_past_eight_rows_and_with_norm_kernels_equal_the_units(rows: int) -> None:
    """Rows a configs JSON may move onto the kernels (talker_kernel_rows), from 33 rows with the norms as
    kernels of their own."""
    got = _talker_pair(torch.float32, [i % 12 for i in range(rows)])
    for g, r in zip(got[:4], got[4:]):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


def test_talker_kernels_agree_to_bfloat16_rounding() -> None:
    got = _talker_pair(torch.bfloat16, [5, 9])
    for g, r in zip(got[:4], got[4:]):  # loosely, as for the predictor layer (the interpreter's bf16 rounding)
        scale = r.float().abs().max().item()
        assert (g.float() - r.float()).abs().max().item() <= 0.03 * scale
        assert (g.float() - r.float()).abs().mean().item() <= 0.005 * scale


def test_kernel_layer_step_equals_the_reference_decoder_layer() -> None:
    """Both kernel halves around gqa_attention over each row's own positions: the reference
    omni_tts.models.layers.DecoderLayer with the Talker's cache write and attention."""
    m, _ = model_and_fast()
    layer = m.talker.layers[1]
    w, a = fuse_layer(layer), layer.self_attn
    B, M = 3, 10
    torch.manual_seed(4)
    x = torch.randn(B, 1, layer.input_layernorm.weight.shape[0])
    p = torch.tensor([2, 7, 0])
    cos, sin = m.talker.rope(p[:, None], torch.float32)  # [B, 1, hd]
    kc0 = torch.randn(B, a.kv_heads, M, a.head_dim)
    vc0 = torch.randn_like(kc0)
    mask = (torch.arange(M)[None, :] <= p[:, None])[:, None, None]  # [B, 1, 1, M]
    kc, vc = kc0.clone(), vc0.clone()
    q = talker_kernels.talker_attn_in(layer, w[0], w[1], x, cos, sin, kc, vc, p)
    got = talker_kernels.talker_attn_out(layer, w[2], x, gqa_attention(q, kc, vc, mask))
    rk, rv = kc0.clone(), vc0.clone()

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        rk[torch.arange(B), :, p] = k[:, :, 0]
        rv[torch.arange(B), :, p] = v[:, :, 0]
        return gqa_attention(q, rk, rv, mask)

    want = layer(x, cos, sin, attend)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kc, rk, rtol=1e-5, atol=1e-5)
    assert not torch.equal(kc, kc0)  # rows were written


BLOCK = talker_kernels.ATTEND_BLOCK


@pytest.mark.parametrize("dtype,pos,splits", [(torch.float32, [2, BLOCK + BLOCK // 3 + 1, 0, BLOCK], 1),
                                              (torch.float32, [2, BLOCK + BLOCK // 3 + 1, 0, BLOCK], 2),
                                              (torch.bfloat16, [BLOCK + BLOCK // 10, 5], 2),
                                              (torch.float32, [BLOCK + 3], 1),  # one row: its loads before the wait
                                              (torch.bfloat16, [BLOCK // 2], 2)])
def test_attention_kernel_equals_the_rope_kernel_then_gqa_attention(dtype: torch.dtype, pos: list[int],
                                                                    splits: int) -> None:
    """talker_attend (q/k norm + rope, the cache write and the attention in one kernel, over blocks of
    cache positions, in one program or split over two whose softmaxes a third kernel joins; rows below the
    second block leave its split nothing; one row loads its first block before the wait) against
    talker_attn_in then gqa_attention over the whole cache with the causal mask; positions above each row's
    own hold junk the attention must not read."""
    m, _ = model_and_fast()
    layer = copy.deepcopy(m.talker.layers[1]).to(dtype)
    w, a = fuse_layer(layer), layer.self_attn
    B, M = len(pos), 2 * talker_kernels.ATTEND_BLOCK  # two blocks: rows whose position lies in the first or second
    torch.manual_seed(len(pos))
    x = torch.randn(B, 1, layer.input_layernorm.weight.shape[0]).to(dtype)
    p = torch.tensor(pos)
    cos, sin = m.talker.rope(p[:, None], dtype)  # [B, 1, hd]
    kc0 = torch.randn(B, a.kv_heads, M, a.head_dim).to(dtype)
    vc0 = torch.randn_like(kc0)
    mask = (torch.arange(M)[None, :] <= p[:, None])[:, None, None]  # [B, 1, 1, M]
    kc, vc, rk, rv = kc0.clone(), vc0.clone(), kc0.clone(), vc0.clone()
    got = talker_kernels.talker_attend(layer, w[0], w[1], x, cos, sin, kc, vc, p, M, splits=splits)
    want = gqa_attention(talker_kernels.talker_attn_in(layer, w[0], w[1], x, cos, sin, rk, rv, p), rk, rv, mask)
    tol = 1e-5 if dtype == torch.float32 else 0.03 * want.float().abs().max().item()
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(kc, rk, rtol=0, atol=0)  # the same rows written, the others untouched
    torch.testing.assert_close(vc, rv, rtol=0, atol=0)


@pytest.mark.parametrize("dtype,splits", [(torch.float32, 1), (torch.bfloat16, 1), (torch.float32, 3)])
def test_attention_alone_equals_gqa_attention_over_the_rows_positions(dtype: torch.dtype, splits: int) -> None:
    """talker_kernels.attend (the cache already written) against gqa_attention over the first kv_len positions
    with the causal mask, for a strided q as the compiled attn-in unit returns it, in one program or split
    a block each; junk past each row's position and past kv_len must not count."""
    m, _ = model_and_fast()
    a = m.talker.layers[0].self_attn
    pos = [0, BLOCK // 2 - 1, BLOCK // 2, BLOCK + BLOCK // 2 + 8, 17, 2 * BLOCK + 43]
    L = 2 * talker_kernels.ATTEND_BLOCK + 44  # rows whose position lies in the first block, the second or the third
    B, M = len(pos), L + 100  # the cache longer than L, junk in the third block past L
    torch.manual_seed(7)
    q = torch.randn(B, 1, a.heads, a.head_dim).to(dtype).transpose(1, 2)  # [B, H, 1, hd], not contiguous
    kc = torch.randn(B, a.kv_heads, M, a.head_dim).to(dtype)
    vc = torch.randn_like(kc)
    p = torch.tensor(pos)
    mask = (torch.arange(L)[None, :] <= p[:, None])[:, None, None]  # [B, 1, 1, L]
    got = talker_kernels.attend(q, kc, vc, p, L, splits=splits)
    want = gqa_attention(q, kc[:, :, :L], vc[:, :, :L], mask)
    tol = 1e-5 if dtype == torch.float32 else 0.03 * want.float().abs().max().item()
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("rows,kv_len,splits", [(1, 1025, 8), (1, 1025, 100), (2, 512, 4), (4, 300, 7), (3, 64, 5)])
def test_a_split_attention_covers_kv_len_in_whole_blocks_none_empty(rows: int, kv_len: int, splits: int) -> None:
    S, chunk = talker_kernels._split(rows, 16, kv_len, torch.device("cpu"), splits)
    block = talker_kernels.ATTEND_BLOCK
    assert chunk % block == 0 and 1 <= S <= splits
    assert (S - 1) * chunk < kv_len <= S * chunk  # the last split holds a position below kv_len
    assert talker_kernels._split(rows, 16, kv_len, torch.device("cpu"), None) == (1, -(-kv_len // block) * block)


def test_attend_waves_give_an_sm_more_programs_where_rows_leave_it_idle(tmp_path) -> None:
    """The kernel-configs key `attend_waves` (loaded as a sweep's JSON) sets the programs the default split gives
    each SM where rows x heads leave SMs idle: 8 rows x 16 heads fill 132 SMs once, so one wave splits nothing,
    and the default four split each row and head over four programs (three over a 1,025-position cache: whole
    blocks, none empty); 16 rows x 16 heads outnumber the SMs and never split."""
    assert [talker_kernels.default_splits(b, 16, 132) for b in (1, 8, 9, 16, 64)] == [33, 4, 1, 1, 1]
    assert talker_kernels.default_splits(8, 16, 129) == 4 and talker_kernels.default_splits(8, 16, 128) == 1
    assert talker_kernels.default_splits(8, 16, 0) == 1  # no SMs: off CUDA
    assert talker_kernels._split(8, 16, 1025, torch.device("cpu"), 4) == (3, 3 * BLOCK)
    (tmp_path / "aw.json").write_text('{"attend_waves": 1}')
    waves = kernel_configs.ATTEND_WAVES
    try:
        kernel_configs.load_configs(str(tmp_path / "aw.json"))
        assert [talker_kernels.default_splits(b, 16, 132) for b in (1, 8, 16, 64)] == [8, 1, 1, 1]
    finally:
        kernel_configs.set_options({"attend_waves": waves})


def test_probe_builds_the_talker_kernels() -> None:
    m, _ = model_and_fast()
    layer = m.talker.layers[0]
    assert talker_kernels.probe(layer, fuse_layer(layer), [1, 2, 3], 2, torch.float32) == ""
    gelu = copy.deepcopy(layer)
    gelu.mlp.act = torch.nn.functional.gelu
    assert "activation" in talker_kernels.probe(gelu, fuse_layer(gelu), [1], 2, torch.float32)


def test_a_kept_probe_outcome_restores_every_kernel_choice() -> None:
    """The probe-outcome cache (KernelChoice.CHOICE) names every limit KernelChoice sets, so a start that
    reuses a kept outcome runs the same kernels as the start that probed (the talker's attention included)."""
    from omni_tts.models.compiled.kernel_choice import KernelChoice

    limits = {n for n, v in vars(KernelChoice).items() if not n.startswith("_") and isinstance(v, (bool, int))}
    assert "talker_attend_len" in limits and limits == set(KernelChoice.CHOICE)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compiled_attention_reads_up_to_each_rows_own_position(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled, over a kv_len of several blocks, each row's loop stops at the block holding its position: rows
    at the first and last position of a block, and past junk, against gqa_attention with the causal mask; and
    every row, a padded one at the cache's last position (past kv_len) too, as the loop over all kv_len gives;
    and split over several programs, the rows below kv_len."""
    m, _ = model_and_fast()
    dev = torch.device("cuda")
    layer = copy.deepcopy(m.talker.layers[1]).to(dev)
    w, a = fuse_layer(layer), layer.self_attn
    L = 4 * talker_kernels.ATTEND_BLOCK + 1
    M = L + 7
    pos = [0, BLOCK - 1, BLOCK, 2 * BLOCK + 44, L - 1, M - 1]
    B, n = len(pos), len(pos) - 1  # rows [:n] below kv_len
    torch.manual_seed(3)
    x = torch.randn(B, 1, layer.input_layernorm.weight.shape[0], device=dev)
    p = torch.tensor(pos, device=dev)
    cos, sin = (t.to(dev) for t in m.talker.rope(p[:, None].cpu(), torch.float32))
    kc0 = torch.randn(B, a.kv_heads, M, a.head_dim, device=dev)
    vc0 = torch.randn_like(kc0)
    mask = (torch.arange(M, device=dev)[None, :] <= p[:, None])[:, None, None]  # [B, 1, 1, M]
    kc, vc, rk, rv = kc0.clone(), vc0.clone(), kc0.clone(), vc0.clone()
    got = talker_kernels.talker_attend(layer, w[0], w[1], x, cos, sin, kc, vc, p, L)
    q = talker_kernels.talker_attn_in(layer, w[0], w[1], x, cos, sin, rk, rv, p)
    want = gqa_attention(q, rk, rv, mask)
    torch.testing.assert_close(got[:n], want[:n], rtol=1e-4, atol=1e-4)
    alone = talker_kernels.attend(q, rk, rv, p, L)
    torch.testing.assert_close(alone[:n], want[:n], rtol=1e-4, atol=1e-4)
    for splits in (2, 5):  # one split wholly past the low rows' positions; one split a block
        split = talker_kernels.talker_attend(layer, w[0], w[1], x, cos, sin, kc0.clone(), vc0.clone(), p, L,
                                             splits=splits)
        torch.testing.assert_close(split[:n], want[:n], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(talker_kernels.attend(q, rk, rv, p, L, splits=splits)[:n], want[:n], rtol=1e-4,
                                   atol=1e-4)
    monkeypatch.setattr(talker_kernels, "_INTERPRET", True)  # the loop over all of kv_len, as interpreted
    full = talker_kernels.talker_attend(layer, w[0], w[1], x, cos, sin, kc0.clone(), vc0.clone(), p, L)
    torch.testing.assert_close(got, full, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(alone, talker_kernels.attend(q, rk, rv, p, L), rtol=1e-6, atol=1e-6)
