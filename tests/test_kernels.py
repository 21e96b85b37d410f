"""omni_tts.kernels.layers (the hand-written Triton predictor layer) and omni_tts.kernels.heads (its heads and
sampling) in Triton's CPU interpreter against the Inductor-path units they replace (omni_tts.models.compiled.fast_path's
predictor_layer / predictor_head / predictor_feed, run uncompiled) on the tiny checkpoint's real
layers: outputs and cache rows, float32 and bfloat16, the 2-position first step and a later
1-position step, greedy and sampled rows drawing the same noise; and a FastPath whose predictor and
talker run every hand-written kernel reproducing the official golden greedy codes. Skips where triton
is not installed (requirements-dev.txt has it)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

pytest.importorskip("triton")  # conftest.py sets TRITON_INTERPRET=1 without CUDA

from _fixtures import FIXTURES  # noqa: E402
from test_fastpath import golden_cases, model_and_fast, params_of, run_loop  # noqa: E402

from omni_tts.kernels import configs as kernel_configs  # noqa: E402
from omni_tts.kernels import layers as kernels  # noqa: E402
from omni_tts.kernels import projection as proj_kernels  # noqa: E402
from omni_tts.models import sampling  # noqa: E402
from omni_tts.models.compiled.fast_path import FastPath, fuse_layer, predictor_layer  # noqa: E402
from omni_tts.models.compiled.packed_weights import fold_norm  # noqa: E402

pytestmark = pytest.mark.interpreter  # CPU tensors (its gpu tests excepted): conftest.py


def _layer_pair(dtype: torch.dtype, B: int, T: int, pos0: int) -> tuple[torch.Tensor, ...]:
    m, _ = model_and_fast()
    cp = m.code_predictor
    layer = copy.deepcopy(cp.layers[-1]).to(dtype)
    w = fuse_layer(layer)
    P, hd = cp.num_groups, cp.head_dim
    torch.manual_seed(pos0)
    x = torch.randn(B, T, cp.hidden_size).to(dtype)
    cos, sin = cp.rope(torch.arange(P)[None], dtype)  # [1, P, hd]
    kc0 = torch.randn(B, cp.num_kv_heads, P, hd).to(dtype)  # earlier positions hold keys, later ones junk
    vc0 = torch.randn_like(kc0)
    pos = torch.arange(pos0, pos0 + T)
    mask = (torch.arange(P)[None, :] <= pos[:, None])[None, None]  # [1, 1, T, P]
    kc1, vc1, kc2, vc2 = kc0.clone(), vc0.clone(), kc0.clone(), vc0.clone()
    ref = predictor_layer(layer, *w, x, cos[:, pos0:pos0 + T], sin[:, pos0:pos0 + T], mask, kc1, vc1, pos)
    folded = (fold_norm(w[0], layer.input_layernorm), fold_norm(w[2], layer.post_attention_layernorm))
    got = kernels.predictor_layer(layer, *w, x, cos, sin, kc2, vc2, pos0, folded=folded)
    return got, ref, kc2, kc1, vc2, vc1


# (40, 2, 0): 80 rows, more than one program's MAX_BM, so each projection runs two columns of programs (and,
# from FOLD_ROWS rows, the norms folded into the weights)
@pytest.mark.parametrize("B,T,pos0", [(1, 2, 0), (1, 1, 4), (3, 1, 7), (5, 1, 15), (40, 2, 0)])
def test_kernel_layer_equals_the_inductor_path_layer_in_float32(B: int, T: int, pos0: int) -> None:
    got, ref, kc2, kc1, vc2, vc1 = _layer_pair(torch.float32, B, T, pos0)
    assert got.shape == ref.shape == (B, T, ref.shape[-1])
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kc2, kc1, rtol=1e-5, atol=1e-5)  # the new rows written, the others untouched
    torch.testing.assert_close(vc2, vc1, rtol=1e-5, atol=1e-5)


# (20, 2, 0): 40 rows, past FOLD_ROWS, so the norms are folded into the weights
@pytest.mark.parametrize("B,T,pos0", [(2, 2, 0), (3, 1, 9), (20, 2, 0)])
def test_kernel_layer_agrees_to_bfloat16_rounding(B: int, T: int, pos0: int) -> None:
    got, ref, kc2, kc1, vc2, vc1 = _layer_pair(torch.bfloat16, B, T, pos0)
    # Triton 3.6's interpreter rounds float32 -> bfloat16 differently from torch in about half the cases
    # (the GPU rounds to nearest even), so this bounds the error loosely: a few bf16 ulps; an indexing or
    # math error would be off by the values' own size
    scale = ref.float().abs().max().item()
    assert (got.float() - ref.float()).abs().max().item() <= 0.03 * scale
    assert (got.float() - ref.float()).abs().mean().item() <= 0.005 * scale
    torch.testing.assert_close(kc2.float(), kc1.float(), rtol=0.03, atol=0.05)
    torch.testing.assert_close(vc2.float(), vc1.float(), rtol=0.03, atol=0.05)


# whole-row tiles over 2+ rows take each row in turn against the tile (ROWS); 3 and 5 rows leave masked rows
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 12])
@pytest.mark.parametrize("cfg", [(2, 128, 1, 4, True), (4, 256, 1, 8, True), (16, 32, 2, 4, False),
                                 (1, 64, 2, 4, True), (2, 16, 2, 4, True), (16, 256, 1, 4, False)])
def test_projection_kernel_is_config_independent_including_whole_row_tiles(cfg: tuple, rows: int) -> None:
    """Norm + gate|up + SiLU and o + residual under a whole-row tile (BK >= K: one tile, loaded before the
    PDL wait on a GPU), K-loop tiles (one of a single weight row; one of two weight rows over 2-4 pieces of
    a row, as the 1.7B talker's one-row down projection runs), a tensor-core tile and a tensor-core tile of
    whole rows (as the predictor's q|k|v runs at 3..16 rows): the same results as the reference ops."""
    m, _ = model_and_fast()
    layer = copy.deepcopy(m.code_predictor.layers[0]).float()
    _, _, w_gu = fuse_layer(layer)
    torch.manual_seed(5)
    x = torch.randn(rows, w_gu.shape[1])
    n = w_gu.shape[0] // 2
    h = layer.post_attention_layernorm(x)
    ref = torch.nn.functional.silu(h @ w_gu[:n].T) * (h @ w_gu[n:].T)
    got = proj_kernels.projection(x, w_gu, n=n, norm=layer.post_attention_layernorm, glu=True, cfg=cfg)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    wd = layer.mlp.down_proj.weight
    a = torch.randn(rows, wd.shape[1])
    got = proj_kernels.projection(a, wd, n=wd.shape[0], res=x, cfg=cfg)
    torch.testing.assert_close(got, x + a @ wd.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3])
def test_whole_row_tiles_take_strided_rows_a_bias_and_a_ragged_last_tile(rows: int) -> None:
    """Rows taken one at a time against a whole-row tile (ROWS) read input rows that are further apart than
    their width, add the bias and leave out the weight rows past n in the last tile (n = 13, BN = 4)."""
    torch.manual_seed(7)
    K, n = 48, 13
    x = torch.randn(rows, K + 5)[:, :K]  # rows K + 5 apart
    w, b = torch.randn(n, K), torch.randn(n)
    got = proj_kernels.projection(x, w, n=n, bias=b, cfg=(4, 64, 1, 4, True))
    torch.testing.assert_close(got, x @ w.T + b, rtol=1e-5, atol=1e-5)


# (the tiny predictor's rows are 32 wide) one row on a whole-row tile and over pieces of rows; 3 rows on a
# whole-row tile, row by row; 5 rows on tensor cores over whole rows (the sums in a pass of their own) and over
# a K loop (the sums from each tile on CUDA cores); 80 rows over a K loop (the sums on tensor cores, two
# columns of programs; or 16 rows a program, the sums on CUDA cores, five columns)
@pytest.mark.parametrize("rows,cfg", [(1, (2, 128, 1, 4, True)), (1, (2, 16, 2, 4, True)), (3, (4, 256, 1, 8, True)),
                                      (5, (16, 256, 1, 4, False)), (5, (16, 16, 2, 4, False)),
                                      (80, (16, 16, 2, 4, False)), (80, (16, 16, 2, 4, False, 16))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_folded_norm_projection_equals_the_normed_prologue(rows: int, cfg: tuple, dtype: torch.dtype) -> None:
    """A norm's weight folded into the projection's weights, each row scaled by its own 1/rms summed from the
    input tiles, gives the projection of the normed input (float32: to rounding; bfloat16: within a few of its
    roundings, which differ in place: the reference rounds the normed input, the fold the folded weights)."""
    m, _ = model_and_fast()
    layer = copy.deepcopy(m.code_predictor.layers[0]).to(dtype)
    _, _, w_gu = fuse_layer(layer)
    norm = layer.post_attention_layernorm
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, norm.weight.shape[0]))  # a norm weight that matters
    torch.manual_seed(rows)
    x = (3 * torch.randn(rows, w_gu.shape[1])).to(dtype)
    n = w_gu.shape[0] // 2
    folded = proj_kernels.projection(x, fold_norm(w_gu, norm), n=n, norm=norm, glu=True, cfg=cfg, folded=True)
    h = norm(x).float()
    ref = torch.nn.functional.silu(h @ w_gu[:n].float().T) * (h @ w_gu[n:].float().T)
    if dtype == torch.float32:
        torch.testing.assert_close(folded, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(folded, proj_kernels.projection(x, w_gu, n=n, norm=norm, glu=True, cfg=cfg),
                                   rtol=1e-5, atol=1e-5)
    else:
        scale = ref.abs().max().item()
        assert (folded.float() - ref).abs().max().item() <= 0.03 * scale
        assert (folded.float() - ref).abs().mean().item() <= 0.005 * scale


def test_a_configs_sixth_field_caps_a_tensor_core_programs_rows() -> None:
    rows_a_program = proj_kernels.rows_a_program
    assert rows_a_program(40, (16, 128, 4, 4, False)) == proj_kernels.MAX_BM == 64
    assert rows_a_program(40, (16, 128, 4, 4, False, 16)) == 16 and rows_a_program(80, (16, 128, 4, 4, False, 32)) == 32
    assert rows_a_program(8, (16, 128, 4, 4, False, 16)) == 16 and rows_a_program(3, (16, 128, 4, 4, False)) == 16
    assert rows_a_program(3, (4, 256, 1, 8, True)) == 4  # a multiply-and-sum tile: all its rows


@pytest.mark.parametrize("rows,cap", [(40, 16), (80, 32)])
def test_fewer_rows_a_program_give_the_same_projection(rows: int, cap: int) -> None:
    """A config's sixth field caps a tensor-core program's rows: the rows split over more programs, each row's
    sums over the same K steps, so the normed projection with SiLU(gate) * up and the residual projection equal
    the uncapped ones to float32 rounding (the interpreter's matmul may order a tile's sums by its shape)."""
    m, _ = model_and_fast()
    layer = m.code_predictor.layers[0]
    _, _, w_gu = fuse_layer(layer)
    norm, n, wd = layer.post_attention_layernorm, w_gu.shape[0] // 2, layer.mlp.down_proj.weight
    torch.manual_seed(11)
    x, a = torch.randn(rows, w_gu.shape[1]), torch.randn(rows, wd.shape[1])
    for cfg in ((16, 16, 2, 4, False), (32, 32, 2, 4, False)):
        res = x[:, :wd.shape[0]].contiguous()
        for got, want in ((proj_kernels.projection(x, w_gu, n=n, norm=norm, glu=True, cfg=(*cfg, cap)),
                           proj_kernels.projection(x, w_gu, n=n, norm=norm, glu=True, cfg=cfg)),
                          (proj_kernels.projection(a, wd, n=wd.shape[0], res=res, cfg=(*cfg, cap)),
                           proj_kernels.projection(a, wd, n=wd.shape[0], res=res, cfg=cfg))):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fold_rows", [None, 17])  # the table's, and a kernel sweep JSON's "fold_rows"
def test_normed_projection_folds_from_fold_rows_given_the_folded_weight(monkeypatch, fold_rows: int | None) -> None:
    """Below FOLD_ROWS rows, or without a folded copy, the norm stays in the prologue; from FOLD_ROWS rows the
    folded copy is what is read (a copy that is not the folded weight shows it)."""
    if fold_rows is not None:
        monkeypatch.setattr(kernel_configs, "FOLD_ROWS", fold_rows)
    m, _ = model_and_fast()
    layer = m.code_predictor.layers[0]
    _, _, w_gu = fuse_layer(layer)
    norm, n = layer.post_attention_layernorm, w_gu.shape[0] // 2
    torch.manual_seed(5)
    x = torch.randn(kernel_configs.FOLD_ROWS, w_gu.shape[1])
    wrong = torch.randn_like(w_gu)
    for rows in (kernel_configs.FOLD_ROWS - 1, kernel_configs.FOLD_ROWS):
        prologue = proj_kernels.projection(x[:rows], w_gu, n=n, norm=norm, glu=True)
        assert torch.equal(proj_kernels.normed_projection(x[:rows], w_gu, norm, n=n, glu=True, pdl=False), prologue)
        got = proj_kernels.normed_projection(x[:rows], w_gu, norm, n=n, glu=True, pdl=False, w_folded=wrong)
        if rows < kernel_configs.FOLD_ROWS:
            assert torch.equal(got, prologue)
        else:
            assert torch.equal(got, proj_kernels.projection(x[:rows], wrong, n=n, norm=norm, glu=True, folded=True))
            assert not torch.allclose(got, prologue)


def test_supports_only_small_steps_of_silu_layers() -> None:
    m, _ = model_and_fast()
    layer = m.code_predictor.layers[0]
    assert kernels.supports(layer, 1) and kernels.supports(layer, kernels.MAX_ROWS)
    assert not kernels.supports(layer, kernels.MAX_ROWS + 1)


def _mixed_rows(n: int, cap: int, device: str = "cpu") -> sampling.SlotParams:
    """Greedy and sampled rows with top-k, top-p and temperature settings that fit a top-`cap` selection."""
    rows = [sampling.RowSettings(greedy=True),
            sampling.RowSettings(greedy=False, temperature=0.9, top_k=cap - 2, top_p=1.0),
            sampling.RowSettings(greedy=False, temperature=0.7, top_k=5, top_p=0.8),
            sampling.RowSettings(greedy=False, temperature=1.3, top_k=1),
            sampling.RowSettings(greedy=False, temperature=1.0, top_k=cap, top_p=0.5)]
    sp = sampling.SlotParams.from_settings([rows[i % len(rows)] for i in range(n)], device)
    return sp.rows(n, topk_cap=cap)


@pytest.mark.parametrize("greedy_only", [False, True])
def test_predict_frame_with_kernels_equals_without(greedy_only: bool) -> None:
    m, _ = model_and_fast()
    fast = FastPath(m, None)
    torch.manual_seed(3)
    B = 3  # greedy, top-k, top-k + top-p rows (the choice test below covers more settings, cheaper)
    hidden = torch.randn(B, m.hidden_size)
    code0 = torch.randint(0, 64, (B,))
    sp = _mixed_rows(B, 8)  # a small cap: the interpreter's top-k costs seconds per row at 64
    sp.all_greedy = greedy_only
    seed, frame = torch.arange(B) * 7919 + 5, torch.full((B,), 3)
    ref_codes, ref_sum = fast.predict_frame(hidden, code0, sp, seed, frame)
    fast.kernel_rows = fast.head_kernel_rows = kernels.MAX_ROWS
    codes, emb_sum = fast.predict_frame(hidden, code0, sp, seed, frame)
    assert torch.equal(codes, ref_codes)  # greedy rows, and sampled rows drawing the same noise
    torch.testing.assert_close(emb_sum, ref_sum, rtol=1e-5, atol=1e-5)
    if not greedy_only:  # the draws are not all the argmax (the sampled rows really sample)
        fast.kernel_rows = fast.head_kernel_rows = 0
        sp.all_greedy = True
        assert not torch.equal(fast.predict_frame(hidden, code0, sp, seed, frame)[0], codes)


@pytest.mark.parametrize("B", [10, kernel_configs.FOLD_ROWS + 7])  # the norm in the prologue; folded into the head
def test_head_kernels_choose_like_the_sampling_module_for_many_draws(B: int) -> None:
    """The choice kernel against omni_tts.models.sampling.choose on random logits: many rows and frames."""
    from omni_tts.kernels import heads as head_kernels

    torch.manual_seed(0)
    V, D = 256, 8
    sp = _mixed_rows(B, 16)
    head = torch.nn.Linear(D, V, bias=False)
    norm = type("N", (), {"weight": torch.linspace(0.5, 1.5, D), "eps": 1e-6})()
    table = torch.randn(V, 4)
    for f in range(4):
        x = torch.randn(B, 1, D) * 3
        seed, frame = torch.arange(B) + 100 * f, torch.full((B,), f)
        esum = torch.zeros(B, 4)
        got, nothing = head_kernels.head_choose(norm, head, x, sp, seed, frame, 2, table, esum,
                                                w_folded=fold_norm(head.weight, norm))
        assert nothing is None
        h = x[:, -1].float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
        want = sampling.choose(head(h).float(), sp, seed, frame, 2)
        assert torch.equal(got, want)
        torch.testing.assert_close(esum, table[want])


def test_head_and_feed_kernels_equal_the_units_they_implement() -> None:
    """omni_tts.kernels.heads.head_choose (with the codebook's fed table) against
    omni_tts.models.compiled.fast_path.predictor_head / predictor_feed (run uncompiled) on the tiny
    checkpoint's real predictor head, embedding and projection: the same codes, embedding sum and next
    input."""
    from omni_tts.kernels import heads as head_kernels
    from omni_tts.models.compiled.fast_path import predictor_feed, predictor_head

    m, _ = model_and_fast()
    cp = m.code_predictor
    B, j = 5, 3
    sp = _mixed_rows(B, 8)
    torch.manual_seed(6)
    bias = cp.small_to_mtp_projection.bias
    kept = bias.detach().clone()
    x = torch.randn(B, 2, cp.hidden_size) * 2
    seed, frame = torch.arange(B) * 13 + 1, torch.full((B,), 9)
    table = cp.codec_embedding[j].weight
    esum = torch.zeros(B, table.shape[1])
    try:
        bias.data.copy_(torch.randn_like(bias))  # the fixture's bias is zero: a real one must reach the next input
        fed = head_kernels.fed_table(table, cp.small_to_mtp_projection)
        got, got_next = head_kernels.head_choose(cp.norm, cp.lm_head[j], x, sp, seed, frame, j + 1, table, esum,
                                                 fed=fed)
        want = predictor_head(cp.norm, cp.lm_head[j], x, sp, seed, frame, j + 1)
        e, nxt = predictor_feed(cp.codec_embedding[j], cp.small_to_mtp_projection, want)
    finally:
        bias.data.copy_(kept)
    assert torch.equal(got, want) and len(set(want.tolist())) > 1
    torch.testing.assert_close(esum, e.float())
    assert got_next.shape == nxt.shape == (B, 1, cp.hidden_size)
    torch.testing.assert_close(got_next, nxt, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cut", ["sort", "counts"])
def test_choice_kernel_top_k_cut_keeps_tied_values_like_the_sampling_module(cut: str, monkeypatch) -> None:
    """Top-k alone (top-p 1: the kernel's sort-free path, finding the cut from the key bytes' histograms, or
    its top-CAP sort when told to) on logits full of ties and zeros: the k-th largest counted with repeats,
    every value equal to it kept, as sampling.warp_topk does."""
    from omni_tts.kernels import configs as kernel_configs
    from omni_tts.kernels import heads as head_kernels

    monkeypatch.setattr(kernel_configs, "CHOOSE_SORT_FREE", cut != "sort")

    torch.manual_seed(1)
    V, B = 128, 12
    rows = [sampling.RowSettings(greedy=False, temperature=1.0, top_k=k) for k in (1, 2, 3, 5, 7, 9, 13, 16)]
    sp = sampling.SlotParams.from_settings([rows[i % len(rows)] for i in range(B)]).rows(B, topk_cap=16)
    eye = torch.nn.Linear(V, V, bias=False)
    eye.weight.data = torch.eye(V)
    norm = type("N", (), {"weight": torch.ones(V), "eps": 0.0})()
    table = torch.randn(V, 4)
    for f in range(3):
        logits = torch.round(torch.randn(B, V) * 1.5) / 4  # few distinct values: ties at every cut
        logits[:, ::7] = 0.0
        scale = torch.rsqrt(logits.pow(2).mean(-1, keepdim=True))  # the kernel RMS-normalises its input
        x = (logits / scale)[:, None]
        seed, frame = torch.arange(B) * 31 + f, torch.full((B,), f)
        got = head_kernels.head_choose(norm, eye, x, sp, seed, frame, 5, table, torch.zeros(B, 4))[0]
        h = x[:, -1] * torch.rsqrt(x[:, -1].pow(2).mean(-1, keepdim=True))
        want = sampling.choose(h @ eye.weight.T, sp, seed, frame, 5)
        assert torch.equal(got, want)
        assert len(set(want.tolist())) > 1


def test_choice_kernel_cuts_bfloat16_logits_on_their_16_bit_keys(monkeypatch) -> None:
    """bfloat16 logits take the top-k cut over 16-bit keys (two byte passes, not four): the k-th largest of the
    logits divided by each row's temperature, ties and zeros (of both signs) kept as sampling.choose keeps
    them, drawing what it draws from the same logits in float32."""
    from omni_tts.kernels import heads as head_kernels

    monkeypatch.setattr(kernel_configs, "CHOOSE_SORT_FREE", True)
    assert head_kernels.key_bits(torch.bfloat16) == 16 and head_kernels.key_bits(torch.float32) == 32

    torch.manual_seed(2)
    V, B = 256, 12
    rows = [sampling.RowSettings(greedy=False, temperature=t, top_k=k)
            for t, k in ((0.7, 1), (1.3, 2), (0.9, 3), (1.0, 5), (0.55, 9), (1.7, 16), (0.3, 13), (1.1, 7))]
    sp = sampling.SlotParams.from_settings([rows[i % len(rows)] for i in range(B)]).rows(B, topk_cap=16)
    table = torch.randn(V, 4)
    drawn = set()
    for f in range(3):
        logits = (torch.round(torch.randn(B, V) * 3) / 8).to(torch.bfloat16)  # few distinct values: ties
        logits[:, ::7] = 0.0
        logits[:, 3::11] = -0.0
        logits[:, 5::13] = torch.randn(B, len(range(5, V, 13))).to(torch.bfloat16) * 5  # and all bf16 bits in use
        seed, frame = torch.arange(B) * 17 + f, torch.full((B,), f)
        got = head_kernels.choose(logits, sp, seed, frame, 4, table, torch.zeros(B, 4))[0]
        want = sampling.choose(logits.float(), sp, seed, frame, 4)
        assert torch.equal(got, want)
        drawn |= set(want.tolist())
    assert len(drawn) > B


@pytest.mark.parametrize("talker", ["sdpa", "fused", "alone"])
@pytest.mark.parametrize("case", golden_cases("custom_voice")[:1])
def test_kernel_layers_reproduce_the_golden_greedy_codes(case: dict, talker: str) -> None:
    """The predictor's kernels with the talker's Triton layers around SDPA ("sdpa"), with its attention in
    their rope kernel ("fused"), or its compiled units around the Triton attention alone ("alone")."""
    m, _ = model_and_fast()
    fast = FastPath(m, None)
    fast.kernel_rows = fast.head_kernel_rows = kernels.MAX_ROWS
    fast.talker_kernel_rows = 0 if talker == "alone" else kernels.MAX_ROWS
    fast.talker_attend_len = 0 if talker == "sdpa" else 1 << 20
    fast.talker_attend_rows = kernels.MAX_ROWS if talker == "alone" else 0
    gold = np.load(FIXTURES / "custom_voice" / "golden" / f"case{case['case']}_codes.npy")
    p = params_of(case)
    p.max_new_tokens = 3  # the interpreter runs every one of a frame's layer calls in Python: few frames
    codes, _ = run_loop(m, fast, p)
    assert len(codes) >= 2
    np.testing.assert_array_equal(codes.numpy(), gold[:len(codes)])


def test_probe_builds_every_variant_or_says_why_not() -> None:
    m, _ = model_and_fast()
    cp = m.code_predictor
    layer = cp.layers[0]
    w = fuse_layer(layer)
    cos, sin = cp.rope(torch.arange(cp.num_groups)[None], torch.float32)  # [1, 16, hd]
    assert kernels.probe(layer, w, cos, sin, [1, 2, 3], max_rows=4) == ""
    from omni_tts.kernels import heads as head_kernels

    assert head_kernels.probe(cp, [1, 2, 3], max_rows=2, cap=8) == ""
    gelu = copy.deepcopy(layer)
    gelu.mlp.act = torch.nn.functional.gelu
    assert "activation" in kernels.probe(gelu, w, cos, sin, [1], max_rows=4)
    err = kernels.probe(layer, w, cos[:, :3, :5], sin[:, :3, :5], [1], max_rows=4)  # a rope table that cannot be
    # one row per position (15 values for head_dim 16): the launch fails, the probe says so in one line
    assert err.startswith(("RuntimeError", "ValueError", "IndexError")) and "\n" not in err


def test_a_configs_json_moves_the_talkers_kernel_rows(monkeypatch) -> None:
    """kernel_configs.TALKER_KERNEL_ROWS (the JSON's talker_kernel_rows) is what use_kernels takes and reports."""
    from omni_tts.kernels import configs as kernel_configs

    monkeypatch.setattr(kernel_configs, "TALKER_KERNEL_ROWS", 16)
    m, _ = model_and_fast()
    fast = FastPath(m, None)
    assert fast.use_kernels(True, [1, 16], [8], torch.float32) == ""
    assert fast.talker_kernel_rows == 16 and "/ 16 talker rows" in fast.kernels_report()


@pytest.mark.parametrize("widest", [16, 17, 33])
def test_the_folded_copies_are_made_only_for_steps_that_wide(widest: int) -> None:
    """use_kernels makes the predictor's weight copies with the norms folded in only where a capture's step
    reaches FOLD_ROWS rows: the layers' from a frame's first step (two positions a row), the heads' from the
    batch itself; a smaller engine holds no copies."""
    from omni_tts.models.compiled import kernel_choice

    m, _ = model_and_fast()
    fast = FastPath(m, None)
    cp = m.code_predictor
    assert fast.use_kernels(True, [1, widest], [8], torch.float32) == ""
    assert (cp in kernel_choice._FOLDED) == (2 * widest >= kernel_configs.FOLD_ROWS)
    assert (cp in kernel_choice._FOLDED_HEADS) == (widest >= kernel_configs.FOLD_ROWS)


def test_fastpath_chooses_the_kernels_it_can_build_and_says_so() -> None:
    """FastPath.use_kernels (what the runner calls for default+cudagraph): builds each group for the given
    batches; a group that cannot run falls back with a notice; the panel line says what runs."""
    from omni_tts.kernels.configs import TALKER_KERNEL_ROWS
    from omni_tts.models.compiled.kernel_choice import TALKER_ATTEND_LEN, TALKER_ATTEND_ROWS

    m, _ = model_and_fast()
    fast = FastPath(m, None)
    assert fast.use_kernels(False, [1, 2], [8], torch.float32) == ""
    assert fast.kernels_report() == "Inductor kernels" and fast.kernel_rows == fast.head_kernel_rows == 0
    assert fast.use_kernels(True, [1, 2], [8], torch.float32) == ""
    rows = kernels.MAX_ROWS
    assert (fast.kernel_rows, fast.head_kernel_rows, fast.talker_kernel_rows) == (rows, rows, TALKER_KERNEL_ROWS)
    assert not fast.kernel_pdl  # no programmatic dependent launch off Hopper
    assert f"{rows} predictor rows (+ heads and sampling) / {TALKER_KERNEL_ROWS} talker rows" in fast.kernels_report()
    assert f"(attention: {TALKER_ATTEND_ROWS} rows, {TALKER_ATTEND_LEN} positions)" in fast.kernels_report()
    layer = m.talker.layers[0]
    act = layer.mlp.act
    layer.mlp.act = torch.nn.functional.gelu  # a talker the kernels do not implement: that group falls back
    try:
        notice = fast.use_kernels(True, [1], [8], torch.float32)
    finally:
        layer.mlp.act = act
    assert notice.startswith("Triton talker kernels unavailable") and "activation" in notice
    assert fast.talker_kernel_rows == 0 and fast.kernel_rows == rows


@pytest.mark.gpu
@torch.no_grad()
def test_a_64_row_frame_on_the_gpu_gives_the_codes_of_the_loop_without_kernels() -> None:
    """On CUDA (float32, the tiny checkpoint): 64 rows, whose first step is 128 rows in two columns of
    programs, through the Triton layers and heads draw the codes the loop without kernels draws."""
    from _fixtures import fixture_dir

    from omni_tts.models.checkpoint import load_checkpoint
    from omni_tts.models.qwen3_tts import TTSModel

    m = TTSModel.from_checkpoint(load_checkpoint(fixture_dir("custom_voice")), device="cuda")
    fast = FastPath(m, None)
    B = 64
    g = torch.Generator().manual_seed(11)
    hidden = torch.randn(B, m.hidden_size, generator=g).cuda()
    code0 = torch.randint(0, 64, (B,), generator=g).cuda()
    sp = _mixed_rows(B, sampling.TOPK_CAP, "cuda")
    seed, frame = (torch.arange(B) * 7919 + 5).cuda(), torch.full((B,), 3).cuda()
    ref_codes, ref_sum = fast.predict_frame(hidden, code0, sp, seed, frame)
    fast.kernel_rows = fast.head_kernel_rows = kernels.MAX_ROWS
    codes, emb_sum = fast.predict_frame(hidden, code0, sp, seed, frame)
    assert torch.equal(codes, ref_codes)
    torch.testing.assert_close(emb_sum, ref_sum, rtol=1e-4, atol=1e-4)
