"""The fast path's fused projections (omni_tts.models.compiled.fast_path, uncompiled: FastPath(model, None)) against the
reference modules on the tiny checkpoints (CPU, float32): packed q|k|v and gate|up weights shared with
the modules, equal greedy golden codes, equal sampled codes and hidden states within float32 tolerance."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _fixtures import FIXTURES, fixture_dir

from omni_tts.config import MODES, CompileMode, SynthesisParams
from omni_tts.models import sampling
from omni_tts.models.checkpoint import load_checkpoint
from omni_tts.models.compiled.fast_path import FastPath, fuse_layer, mlp_fused, qkv_fused
from omni_tts.models.qwen3_tts import TTSModel

_CACHE: dict[str, tuple[TTSModel, FastPath]] = {}



def model_and_fast(name: str = "custom_voice") -> tuple[TTSModel, FastPath]:
    if name not in _CACHE:
        m = TTSModel.from_checkpoint(load_checkpoint(fixture_dir(name)))
        _CACHE[name] = (m, FastPath(m, None))
    return _CACHE[name]



def golden_cases(name: str) -> list[dict]:
    return json.loads((FIXTURES / name / "golden" / "cases.json").read_text())["cases"]


def params_of(case: dict) -> SynthesisParams:
    return SynthesisParams(text=case["text"], task=case["task"], speaker=case.get("speaker"),
                           language=case["language"], instruct=case.get("instruct"),
                           non_streaming_mode=case.get("non_streaming_mode"), do_sample=False,
                           subtalker_do_sample=False, max_new_tokens=40)


@torch.no_grad()
def run_loop(m: TTSModel, fast: FastPath | None, params: SynthesisParams
             ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """TTSModel.generate_codes' loop with the per-frame steps of `fast` (None: the reference modules).
    -> (codes [frames, 16], talker hidden [1, D] after each frame)."""
    st = m.resolve_settings(params)
    pre = m.build_prefill(params)
    T = pre.embeds.shape[0]
    cache = m.talker.new_cache(1, T + st.max_frames + 1)
    if fast:
        h = fast.talker_prefill(pre.embeds[None], cache, torch.zeros(1, dtype=torch.long))[:, -1]  # [1, D]
    else:
        h = m.talker(pre.embeds[None], torch.arange(T)[None], cache, None)[:, -1]  # [1, D]
    seed, seen = torch.tensor([st.seed]), torch.zeros(1, m.vocab_size, dtype=torch.bool)
    allow_eos = torch.tensor([not st.fixed])
    tsp = sampling.SlotParams.from_settings([st.talker])
    ssp = sampling.SlotParams.from_settings([st.subtalker])
    code0 = sampling.sample_talker(m.talker.logits(h), tsp, seen, torch.zeros(1, dtype=torch.long), allow_eos,
                                   seed, m.sampling_constants)
    sampling.mark_seen(seen, code0)
    predict = fast.predict_frame if fast else m.code_predictor.predict_frame
    frames, hiddens = [], []
    for t in range(st.max_frames):
        if not st.fixed and int(code0[0]) == m.eos_id:
            break
        frame, pos = torch.tensor([t]), torch.tensor([T + t])
        rest, fb = predict(h, code0, ssp, seed, frame)  # [1, 15], [1, D]
        x = fb + (pre.trailing[t] if t < pre.trailing.shape[0] else pre.pad)[None]  # [1, D]
        if fast:
            h = fast.talker_step(x, pos, cache, 1)
        else:
            h = m.talker(x[:, None], pos[:, None], cache, None)[:, 0]
        frames.append(torch.cat([code0, rest[0]]))
        hiddens.append(h)
        code0 = sampling.sample_talker(m.talker.logits(h), tsp, seen, frame + 1, allow_eos, seed,
                                       m.sampling_constants)
        sampling.mark_seen(seen, code0)
    return torch.stack(frames), hiddens


def test_modules_share_the_packed_weights_and_keep_their_names() -> None:
    m, fast = model_and_fast()
    layers = list(m.talker.layers) + list(m.code_predictor.layers)
    for layer, (w_qkv, b_qkv, w_gu) in zip(layers, fast.talker_w + fast.predictor_w):
        a, mlp = layer.self_attn, layer.mlp
        rows = [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]
        assert w_qkv.shape == (sum(r.shape[0] for r in rows), a.q_proj.in_features) and b_qkv is None
        assert w_gu.shape == (2 * mlp.gate_proj.out_features, mlp.gate_proj.in_features)
        off = 0
        for r in rows:  # views: same storage, back to back
            assert r.data_ptr() == w_qkv.data_ptr() + off * r.element_size() * r.shape[1]
            off += r.shape[0]
        assert mlp.gate_proj.weight.data_ptr() == w_gu.data_ptr()
        assert torch.equal(mlp.up_proj.weight, w_gu[mlp.gate_proj.out_features:])
    keys = set(m.talker.state_dict())
    assert "layers.0.self_attn.q_proj.weight" in keys and not any("qkv" in k or "gate_up" in k for k in keys)
    # a second FastPath (another compile mode) reuses the same storage instead of packing again
    again = FastPath(m, None)
    assert all(a[0].data_ptr() == b[0].data_ptr() and a[2].data_ptr() == b[2].data_ptr()
               for a, b in zip(fast.talker_w, again.talker_w))


def test_fused_units_equal_the_modules() -> None:
    m, fast = model_and_fast()
    torch.manual_seed(0)
    layer = m.talker.layers[1]
    w_qkv, b_qkv, w_gu = fuse_layer(layer)
    x = torch.randn(3, 2, m.hidden_size)
    cos, sin = m.talker.rope(torch.tensor([[4, 5]] * 3), x.dtype)  # [3, 2, hd]
    for got, ref in zip(qkv_fused(layer.self_attn, w_qkv, b_qkv, x, cos, sin), layer.self_attn.qkv(x, cos, sin)):
        assert got.shape == ref.shape
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(mlp_fused(layer.mlp, w_gu, x), layer.mlp(x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", golden_cases("custom_voice"))
def test_fast_path_equals_golden_greedy_codes(case: dict) -> None:
    m, fast = model_and_fast()
    gold = np.load(FIXTURES / "custom_voice" / "golden" / f"case{case['case']}_codes.npy")
    codes, hid = run_loop(m, fast, params_of(case))
    np.testing.assert_array_equal(codes.numpy(), gold)
    ref_codes, ref_hid = run_loop(m, None, params_of(case))  # the reference on the shared (re-pointed) weights
    np.testing.assert_array_equal(ref_codes.numpy(), gold)
    torch.testing.assert_close(torch.cat(hid), torch.cat(ref_hid), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [1, 7, 1234])
def test_fast_path_equals_reference_when_sampling(seed: int) -> None:
    m, fast = model_and_fast()
    p = SynthesisParams(text="the weather is nice today", speaker="ryan", language="English", max_new_tokens=24,
                        seed=seed, temperature=0.9, top_k=50, top_p=0.9, subtalker_temperature=1.1,
                        subtalker_top_p=0.8)
    codes, hid = run_loop(m, fast, p)
    ref_codes, ref_hid = run_loop(m, None, p)
    assert torch.equal(codes, ref_codes) and len(hid) > 3
    torch.testing.assert_close(torch.cat(hid), torch.cat(ref_hid), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_talker_step_reading_a_kv_prefix_equals_reading_the_whole_cache() -> None:
    """The talker attention over the first kv_len cache positions (kv_len > every row's position) gives the
    same hidden states as over the whole cache, and the K/V it writes are the same."""
    m, fast = model_and_fast()
    g = torch.Generator().manual_seed(3)
    caches = [m.talker.new_cache(3, 200) for _ in range(2)]
    for c in caches:  # the same random history in both
        c.k.copy_(torch.randn(c.k.shape, generator=g) if c is caches[0] else caches[0].k)
        c.v.copy_(torch.randn(c.v.shape, generator=g) if c is caches[0] else caches[0].v)
    pos = torch.tensor([5, 40, 17])
    for _ in range(3):
        x = torch.randn(3, m.hidden_size, generator=g)
        full = fast.talker_step(x, pos, caches[0], 3)
        short = fast.talker_step(x, pos, caches[1], 3, kv_len=64)
        torch.testing.assert_close(short, full, rtol=1e-5, atol=1e-5)
        pos = pos + 1
    assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)


def test_prefill_unit_equals_the_reference_talker_for_padded_prompts_in_any_slots() -> None:
    """Prompts of different lengths, right-padded to one length, prefilled together into scattered slots:
    each prompt's hidden states and the K/V its slot holds equal the reference talker's; other slots untouched."""
    m, fast = model_and_fast()
    g = torch.Generator().manual_seed(5)
    lengths, L, slots = [7, 12, 3], 12, torch.tensor([4, 0, 2])
    x = torch.randn(3, L, m.hidden_size, generator=g)
    caches = [m.talker.new_cache(5, 40) for _ in range(2)]
    for c in caches:  # the same stale contents in both
        c.k.copy_(torch.randn(c.k.shape, generator=g) if c is caches[0] else caches[0].k)
        c.v.copy_(torch.randn(c.v.shape, generator=g) if c is caches[0] else caches[0].v)
    pos = torch.arange(L)[None].expand(3, L)
    ref = m.talker(x, pos, caches[0], slots, kv_len=L)  # [3, L, D]
    got = fast.talker_prefill(x, caches[1], slots)
    for i, n in enumerate(lengths):
        torch.testing.assert_close(got[i, :n], ref[i, :n], rtol=1e-5, atol=1e-5)
        s = int(slots[i])
        torch.testing.assert_close(caches[1].k[:, s, :, :n], caches[0].k[:, s, :, :n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(caches[1].v[:, s, :, :n], caches[0].v[:, s, :, :n], rtol=1e-5, atol=1e-5)
    for s in (1, 3):
        assert torch.equal(caches[1].k[:, s], caches[0].k[:, s]) and torch.equal(caches[1].v[:, s], caches[0].v[:, s])


def test_reduce_overhead_outputs_are_copied_out_single_or_tuple() -> None:
    """reduce-overhead's units hand back copies (the next replay overwrites Inductor's outputs); units that
    return a tuple (the predictor feed) get each tensor copied (a tuple has no .clone)."""
    from omni_tts.models.compiled.fast_path import _cloned

    a, b = torch.arange(3.0), torch.ones(2)
    one = _cloned(lambda x: x)(a)
    pair = _cloned(lambda x, y: (x, y))(a, b)
    assert torch.equal(one, a) and one.data_ptr() != a.data_ptr()
    assert isinstance(pair, tuple) and [torch.equal(p, q) for p, q in zip(pair, (a, b))] == [True, True]
    assert pair[0].data_ptr() != a.data_ptr() and pair[1].data_ptr() != b.data_ptr()


def test_reduce_overhead_compiles_the_whole_frame_as_one_function() -> None:
    """reduce-overhead's units stay plain functions inside one compiled frame function (one graph-tree
    replay per frame); default compiles each unit (and has the whole frame for its A/B switch)."""
    from omni_tts.models.compiled import fast_path as fp

    m, _ = model_and_fast()
    ro, default = FastPath(m, MODES[CompileMode.REDUCE_OVERHEAD]), FastPath(m, MODES[CompileMode.DEFAULT])
    plain = FastPath(m, None)
    assert ro.predictor_layer is fp.predictor_layer and ro.predictor_head is fp.predictor_head
    assert default.predictor_layer is not fp.predictor_layer  # a torch.compile wrapper
    assert ro.whole_frame is not None and default.whole_frame is not None and plain.whole_frame is None
    assert ro.records_graph_trees and not default.records_graph_trees


def test_only_reduce_overhead_runs_the_whole_frame() -> None:
    """default keeps its per-unit path; reduce-overhead runs the whole frame; the panel says which."""
    from omni_tts.config import CompileMode, EngineConfig
    from omni_tts.engine.step_impl import StepImpls

    m, _ = model_and_fast()
    impls = StepImpls(m, EngineConfig())
    fast = impls.predictor(CompileMode.DEFAULT)
    assert impls.predict_fn(CompileMode.DEFAULT) == fast.predict_frame
    assert "whole frame" not in impls.kernels_report(CompileMode.DEFAULT)
    assert impls.whole_frame(CompileMode.REDUCE_OVERHEAD) and not impls.whole_frame(CompileMode.DEFAULT)


@pytest.mark.parametrize("case", golden_cases("custom_voice"))
def test_the_whole_frame_body_equals_golden_codes(case: dict) -> None:
    """The body the whole-frame compile traces (plain functions, no hand-written kernels) is exact."""
    m, _ = model_and_fast()
    fast = FastPath(m, None)
    fast.predict_frame = fast._predict_plain
    gold = np.load(FIXTURES / "custom_voice" / "golden" / f"case{case['case']}_codes.npy")
    codes, _ = run_loop(m, fast, params_of(case))
    np.testing.assert_array_equal(codes.numpy(), gold)


@torch.no_grad()
def test_the_whole_frame_traces_through_reused_regions_and_keeps_the_codes() -> None:
    """The whole-frame function traced as one graph (fullgraph, batch dynamic after two shapes) through
    the layer, head and feed regions gives the uncompiled loop's codes, and tracing it records a
    fraction of the calls that inlining every layer and head does."""
    from torch._dynamo.utils import counters

    m, _ = model_and_fast()
    captured = {}
    for regions in (True, False):  # inlined: batch 1 only (its dynamic retrace is the slowest trace here)
        fast = FastPath(m, None, regions=regions)
        fn = torch.compile(fast._predict_plain, backend="aot_eager", fullgraph=True, dynamic=None)
        torch._dynamo.reset()
        counters.clear()
        for B in (1, 2, 3) if regions else (1,):
            g = torch.Generator().manual_seed(B)
            h = torch.randn(B, m.hidden_size, generator=g)
            code0 = torch.randint(0, 100, (B,), generator=g)
            sp = sampling.SlotParams.from_settings([sampling.RowSettings(greedy=True, temperature=1.0, top_k=50,
                                                                         top_p=1.0)] * B, "cpu")
            seed, frame = torch.zeros(B, dtype=torch.long), torch.full((B,), 4, dtype=torch.long)
            codes, embeds = fn(h, code0, sp, seed, frame)
            ref = FastPath(m, None).predict_frame(h, code0, sp, seed, frame)
            assert torch.equal(codes, ref[0])
            torch.testing.assert_close(embeds, ref[1], rtol=1e-5, atol=1e-5)
            if B == 1:
                captured[regions] = counters["stats"]["calls_captured"]  # the batch-1 graph's
        if regions:
            assert counters["stats"]["unique_graphs"] == 2  # batch 1, then one dynamic graph for 2 and 3
    assert captured[True] * 3 < captured[False], captured


@torch.no_grad()
def test_a_predictor_as_wide_as_its_talker_traces_the_whole_frame_through_regions(tmp_path, monkeypatch) -> None:
    """0.6B's layout, the predictor as wide as the talker (its input projection an Identity, so the next
    input is a view of the code's embedding): the frame still traces as one graph through the regions
    (no region output aliasing another) and gives the uncompiled loop's codes."""
    from omni_tts.models import checkpoint_maker

    monkeypatch.setitem(checkpoint_maker.SIZES, "tiny", {**checkpoint_maker.SIZES["tiny"], "cp_hidden": 64,
                                                         "cp_inter": 128})
    m = TTSModel.from_checkpoint(load_checkpoint(checkpoint_maker.make_checkpoint(tmp_path / "ck")), device="cpu")
    assert isinstance(m.code_predictor.small_to_mtp_projection, torch.nn.Identity)
    fast = FastPath(m, None)
    fn = torch.compile(fast._predict_plain, backend="aot_eager", fullgraph=True)
    torch._dynamo.reset()
    B = 2
    g = torch.Generator().manual_seed(5)
    h, code0 = torch.randn(B, m.hidden_size, generator=g), torch.randint(0, 100, (B,), generator=g)
    sp = sampling.SlotParams.from_settings([sampling.RowSettings(greedy=True, temperature=1.0, top_k=50,
                                                                 top_p=1.0)] * B, "cpu")
    seed, frame = torch.zeros(B, dtype=torch.long), torch.full((B,), 4, dtype=torch.long)
    codes, embeds = fn(h, code0, sp, seed, frame)
    ref = fast.predict_frame(h, code0, sp, seed, frame)
    assert torch.equal(codes, ref[0])
    torch.testing.assert_close(embeds, ref[1], rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_a_frame_whose_regions_cannot_compile_falls_back_to_inlined_layers(monkeypatch) -> None:
    """Where this torch cannot compile the frame through its regions (here a region that breaks the
    graph), the whole frame compiles once more with every layer inlined, gives the same codes, and says
    why (the panel shows it)."""
    from omni_tts.models.compiled import fast_path as fp

    def breaks(*args):
        torch._dynamo.graph_break()
        return fp.predictor_layer_pure(*args)

    monkeypatch.setattr(fp, "LAYER_REGION", torch.compiler.nested_compile_region(breaks))
    m, _ = model_and_fast()
    fast = FastPath(m, MODES[CompileMode.DEFAULT])
    fast._compile = lambda f, dynamic=None: torch.compile(f, backend="aot_eager", fullgraph=True, dynamic=dynamic)
    torch._dynamo.reset()
    B = 2
    h = torch.randn(B, m.hidden_size, generator=torch.Generator().manual_seed(5))
    code0 = torch.tensor([3, 9])
    sp = sampling.SlotParams.from_settings([sampling.RowSettings(greedy=True, temperature=1.0, top_k=50,
                                                                 top_p=1.0)] * B, "cpu")
    seed, frame = torch.zeros(B, dtype=torch.long), torch.zeros(B, dtype=torch.long)
    codes, _ = fast.whole_frame(h, code0, sp, seed, frame)
    assert not fast.regions and "HigherOrderOp" in fast.region_error, fast.region_error
    assert torch.equal(codes, FastPath(m, None).predict_frame(h, code0, sp, seed, frame)[0])
    assert torch.equal(fast.whole_frame(h, code0, sp, seed, frame)[0], codes)  # the fallback stays
    from omni_tts.config import EngineConfig
    from omni_tts.engine.step_impl import StepImpls

    impls = StepImpls(m, EngineConfig())  # what the panel and the warm-up's last line read
    impls._fast[MODES[CompileMode.REDUCE_OVERHEAD].inductor] = fast
    assert impls.inlined_why(CompileMode.REDUCE_OVERHEAD) == fast.region_error
    assert f"layers inlined: {fast.region_error}" in impls.kernels_report(CompileMode.REDUCE_OVERHEAD)
    assert impls.inlined_why(CompileMode.DEFAULT) == ""  # compiled per unit: no whole frame to inline


@pytest.mark.gpu
@torch.no_grad()
def test_reduce_overhead_records_its_graph_trees_without_skipping() -> None:
    """Inductor's CUDA graph trees record the reduce-overhead predictor: no 'skipping cudagraphs'."""
    from torch._dynamo.utils import counters

    m = TTSModel.from_checkpoint(load_checkpoint(fixture_dir("custom_voice")), device="cuda")
    fast = FastPath(m, MODES[CompileMode.REDUCE_OVERHEAD])
    B = 2
    h = torch.randn(B, m.hidden_size, device="cuda")
    code0 = torch.randint(0, 2000, (B,), device="cuda")
    sp = sampling.SlotParams.from_settings([sampling.RowSettings(greedy=True, temperature=1.0, top_k=50,
                                                                 top_p=1.0)] * B, "cuda")
    seed, frame = torch.zeros(B, dtype=torch.long, device="cuda"), torch.zeros(B, dtype=torch.long, device="cuda")
    counters.clear()
    outs = [fast.whole_frame(h, code0, sp, seed, frame) for _ in range(4)]  # warm-up, record, replay
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    from torch._inductor import cudagraph_trees

    from omni_tts.engine.cuda_graphs import graph_tree_pool_bytes

    manager = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    assert manager is not None and manager.roots, "no graph tree was recorded"
    assert graph_tree_pool_bytes() > 0  # its private pool, as the panel and the bench report it
    ref = FastPath(m, None).predict_frame(h, code0, sp, seed, frame)  # the same loop, uncompiled
    for codes, embeds in outs:  # the recorded run and its replays give the uncompiled loop's codes
        assert torch.equal(codes, ref[0])
        torch.testing.assert_close(embeds, ref[1], rtol=1e-4, atol=1e-4)


def test_fed_tables_hold_each_codebooks_next_input_and_are_shared() -> None:
    """The head kernels' fed tables: for every codebook but the last, row c is what the feed unit makes of
    code c (its embedding through small_to_mtp_projection); made once per code predictor, so every mode's
    path reads the same tensors."""
    from omni_tts.kernels.heads import fed_table
    from omni_tts.models.compiled.fast_path import predictor_feed
    from omni_tts.models.compiled.kernel_choice import fed_tables

    m = TTSModel.from_checkpoint(load_checkpoint(fixture_dir("custom_voice")))  # its own: its tables are new
    cp = m.code_predictor
    torch.manual_seed(2)
    cp.small_to_mtp_projection.bias.data.copy_(torch.randn_like(cp.small_to_mtp_projection.bias))  # zero in the fixture
    tables = fed_tables(cp)
    assert fed_tables(cp) is tables and len(tables) == len(cp.codec_embedding) - 1
    codes = torch.tensor([0, 7, cp.codec_embedding[0].weight.shape[0] - 1])
    for j in (0, len(tables) - 1):
        _, nxt = predictor_feed(cp.codec_embedding[j], cp.small_to_mtp_projection, codes)
        torch.testing.assert_close(tables[j][codes], nxt[:, 0])
    assert fed_table(cp.codec_embedding[0].weight, torch.nn.Identity()) is cp.codec_embedding[0].weight
