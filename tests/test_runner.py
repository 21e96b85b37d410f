"""The batched runner (omni_tts.engine.model_runner) on the tiny checkpoint, CPU float32: batched prefill of prompts of
different lengths equals prefilling each alone (hidden state, first code, KV cache of the prompt)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _fixtures import fixture_dir

from omni_tts.config import EngineConfig, SynthesisParams
from omni_tts.engine.testing import warmed_runner


def three_prompts() -> tuple:
    """A four-slot CPU runner and three prepared prompts of different lengths (two greedy, one sampled)
    -> (runner, params, prepared, prompt lengths)."""
    runner = warmed_runner(EngineConfig(model=str(fixture_dir("custom_voice")), mode="eager", device="cpu",
                                        max_num_seqs=4, max_seq_len=128))
    texts = ["Hi.", "A somewhat longer sentence for the second slot.", "Third, with sampling on."]
    ps = [SynthesisParams(text=t, speaker=sp, language="English", greedy=i != 2, seed=5 + i)
          for i, (t, sp) in enumerate(zip(texts, ["ryan", "vivian", "eric"]))]
    items = [runner.model.prepare(p, runner.max_len) for p in ps]
    T = [a.prompt_len for a in items]
    assert len(set(T)) == 3  # really different lengths (right padding exercised)
    return runner, ps, items, T


def test_batched_prefill_equals_one_prompt_at_a_time(_one_thread):
    runner, ps, items, T = three_prompts()

    def state(i: int) -> tuple:
        return (runner.h[i].clone(), int(runner.code0[i]), int(runner.pos[i]), runner.trail[i].clone(),
                runner.cache.k[:, i, :, :T[i]].clone(), runner.seen[i].clone())

    runner.prefill_batch(0, items)
    batched = [state(i) for i in range(3)]
    runner.cache.k.zero_()
    for i, p in enumerate(ps):  # the same prompts, one prefill each, into the same slots
        runner.prefill(i, p)
    for i in range(3):
        alone = state(i)
        torch.testing.assert_close(batched[i][0], alone[0], rtol=1e-5, atol=1e-5)
        assert batched[i][1:3] == alone[1:3] and alone[2] == T[i]
        assert torch.equal(batched[i][3], alone[3]) and torch.equal(batched[i][5], alone[5])
        torch.testing.assert_close(batched[i][4], alone[4], rtol=1e-5, atol=1e-5)


def test_a_prefill_chooses_each_first_code_with_its_own_settings_and_seed(_one_thread):
    """Prompts admitted together, each with its own talker settings, seed and fixed-length flag: each first
    code 0 is the one sampling.sample_talker picks for that prompt alone from its hidden state, and the
    slot keeps those settings (sampling params, seed, allow_eos, position) for its decode steps."""
    from omni_tts.models import sampling

    runner = warmed_runner(EngineConfig(model=str(fixture_dir("custom_voice")), mode="eager", device="cpu",
                                        max_num_seqs=4, max_seq_len=128))
    rows = [dict(temperature=0.7, top_k=5, top_p=1.0, repetition_penalty=1.0, seed=11, fixed_frames=None),
            dict(temperature=1.3, top_k=0, top_p=0.8, repetition_penalty=1.2, seed=12, fixed_frames=9),
            dict(greedy=True, seed=13, fixed_frames=None)]
    ps = [SynthesisParams(text=f"Prompt number {i}, with its own settings.", speaker="ryan", language="English",
                          do_sample="greedy" not in r, greedy=r.pop("greedy", False), **r) for i, r in enumerate(rows)]
    items = [runner.model.prepare(p, runner.max_len) for p in ps]
    runner.prefill_batch(1, items)
    m = runner.model
    for i, a in enumerate(items):
        slot = i + 1
        sp = sampling.SlotParams.from_settings([a.settings.talker])
        sp.all_greedy = False
        alone = sampling.sample_talker(m.talker.logits(runner.h[slot:slot + 1]), sp,
                                       torch.zeros(1, m.vocab_size, dtype=torch.bool), torch.zeros(1, dtype=torch.long),
                                       torch.tensor([not a.settings.fixed]), torch.tensor([a.settings.seed]),
                                       m.sampling_constants)
        assert int(runner.code0[slot]) == int(alone[0])
        for got, want in zip(runner.talker_sp.span(slot, 1)._fields(), sp._fields()):
            assert torch.equal(got, want)
        assert int(runner.seed[slot]) == a.settings.seed and bool(runner.allow_eos[slot]) == (not a.settings.fixed)
        assert int(runner.pos[slot]) == a.prompt_len and runner.seen[slot].sum() == 1
    assert len({int(runner.seed[s]) for s in (1, 2, 3)}) == 3 and not bool(runner.allow_eos[2])


def test_the_prefill_graph_body_on_the_fast_path_equals_the_reference_prefill(_one_thread):
    """The prefill graphs' body runs the fast path's prefill unit (`talker_impl`): prompts of three lengths
    admitted together into slots 1..3 get the hidden state, first code, K/V and positions of the reference
    prefill (float32), and slot 0's cache is untouched. On a CPU the graph set has no captures, so its
    run() calls the same body ungraphed."""
    from omni_tts.engine.cuda_graphs import BucketedGraph
    from omni_tts.models.compiled.fast_path import FastPath

    runner, _, items, T = three_prompts()
    g = torch.Generator().manual_seed(1)
    runner.cache.k.copy_(torch.randn(runner.cache.k.shape, generator=g))

    def state() -> list[tuple]:
        return [(runner.h[i].clone(), int(runner.code0[i]), int(runner.pos[i]),
                 runner.cache.k[:, i, :, :T[i - 1]].clone(), runner.cache.v[:, i, :, :T[i - 1]].clone())
                for i in (1, 2, 3)]

    slot0 = runner.cache.k[:, 0].clone()
    runner.prefill_batch(1, items)
    reference = state()
    runner.talker_impl = fast = FastPath(runner.model, None)
    calls: list[int] = []  # prefill unit calls (spied, not replaced)
    fast.talker_prefill = lambda *a, f=fast.talker_prefill: calls.append(1) or f(*a)
    runner.prefill_graphs = {nb: BucketedGraph(f"prefill x{nb}", runner._make_prefill_fn(nb), runner.prefill_buckets,
                                               runner.pool) for nb in runner.prefill_batches}
    runner.cache.k[:, 1:4].zero_()
    runner.cache.v[:, 1:4].zero_()
    runner.prefill_batch(1, items)
    assert calls == [1]
    for ref, got in zip(reference, state()):
        torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)
        assert got[1:3] == ref[1:3]
        torch.testing.assert_close(got[3], ref[3], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got[4], ref[4], rtol=1e-5, atol=1e-5)
    assert torch.equal(runner.cache.k[:, 0], slot0)


def test_two_frames_in_flight_give_the_codes_of_two_waited_steps(_one_thread):
    """launch(t), launch(t+1), then collect both (the engine's lookahead) == step, step: the two pinned
    result buffers never overwrite a frame that is not read yet, and each ticket reads its own frame, its
    codes alone (collect_codes) as well as with the next frame's EOS flags."""
    cfg = EngineConfig(model=str(fixture_dir("custom_voice")), mode="eager", device="cpu", max_num_seqs=2,
                       max_seq_len=128)
    ps = [SynthesisParams(text=t, speaker="ryan", language="English", do_sample=True, seed=s, fixed_frames=6)
          for t, s in (("One.", 1), ("Two, a little longer.", 2))]
    runs = []
    for overlapped in (False, True):
        runner = warmed_runner(cfg)
        runner.prefill_batch(0, [runner.model.prepare(p, runner.max_len) for p in ps])
        frames = []
        if overlapped:
            pending = runner.launch(2)
            for _ in range(3):
                nxt = runner.launch(2)
                codes = runner.collect_codes(pending)  # the CodePredictor's half, read before the rest
                frames.append(runner.collect(pending))
                assert (codes == frames[-1][0]).all()
                pending = nxt
            frames.append(runner.collect(pending))
        else:
            frames = [runner.step(2) for _ in range(4)]
        runs.append(frames)
    for (c0, e0), (c1, e1) in zip(*runs):
        assert c0.shape == (2, 16) and (c0 == c1).all() and (e0 == e1).all()
    assert len({c.tobytes() for c, _ in runs[0]}) == 4  # four different frames


def test_a_request_begun_on_the_reference_talker_goes_on_on_the_fast_path_with_its_plain_codes(_one_thread):
    """Eager serves before its talker graphs exist on the reference talker, then switches to the fast-path
    talker between two frames: both read and write the one KV cache alike, so requests that cross the
    switch (greedy and sampled, float32) get the codes of a plain run, and the fast path really ran after it."""
    from omni_tts.engine import offline
    from omni_tts.models.compiled.fast_path import FastPath

    cfg = EngineConfig(model=str(fixture_dir("custom_voice")), mode="eager", device="cpu", max_num_seqs=2,
                       max_seq_len=128)
    runner = warmed_runner(cfg)
    fast = FastPath(runner.model, None)
    calls: list[int] = []  # talker_step calls (spied, not replaced)
    fast.talker_step = lambda *a, f=fast.talker_step: calls.append(1) or f(*a)
    runner.talker_impl, runner.reference_talker = fast, True
    ps = [SynthesisParams(text="Across the switch.", speaker="ryan", language="English", greedy=True, fixed_frames=10),
          SynthesisParams(text="Sampled across it.", speaker="vivian", language="English", do_sample=True, top_k=20,
                          seed=9, fixed_frames=10)]
    runner.prefill_batch(0, [runner.model.prepare(p, runner.max_len) for p in ps])
    frames = [runner.step(2)[0] for _ in range(4)]
    assert not calls
    runner.reference_talker = False
    frames += [runner.step(2)[0] for _ in range(6)]
    assert len(calls) == 6
    for i, p in enumerate(ps):
        _, plain = offline.synthesize(runner.model, p)
        assert torch.equal(torch.as_tensor([f[i] for f in frames]), torch.as_tensor(plain))


def test_a_sampling_variant_not_yet_warm_runs_the_reference_code_predictor_with_the_plain_codes(_one_thread):
    """A compiled mode serves before its full-sort variant is warm: a step whose rows need the full sort runs the
    reference CodePredictor until that variant is warm, a top-k step runs the fast path throughout, and both
    requests (float32) get the codes of a plain run across the switch."""
    from omni_tts.engine import offline
    from omni_tts.models.compiled.fast_path import FastPath

    cfg = EngineConfig(model=str(fixture_dir("custom_voice")), mode="eager", device="cpu", max_num_seqs=2,
                       max_seq_len=128)
    runner = warmed_runner(cfg)
    fast = FastPath(runner.model, None)
    calls: list[int] = []  # fast-path CodePredictor frames (spied, not replaced)
    runner.cp_impl, runner.cp_predict = fast, lambda *a: calls.append(1) or fast.predict_frame(*a)
    runner.cp_pending = {True}
    ps = [SynthesisParams(text="Top-k rows.", speaker="ryan", language="English", do_sample=True, top_k=20, seed=4,
                          fixed_frames=10),
          SynthesisParams(text="A full-sort row.", speaker="vivian", language="English", do_sample=True, top_k=0,
                          top_p=0.8, seed=9, fixed_frames=7)]
    runner.prefill_batch(0, [runner.model.prepare(p, runner.max_len) for p in ps])
    assert not runner.variant(1) and runner.variant(2)
    frames = [[], []]
    for n, steps in ((1, 3), (2, 3)):
        for _ in range(steps):
            codes, _ = runner.step(n)
            for i in range(n):
                frames[i].append(codes[i])
    assert len(calls) == 3  # the top-k steps only
    runner.cp_pending = set()
    for _ in range(4):
        codes, _ = runner.step(2)
        for i in range(2):
            frames[i].append(codes[i])
    assert len(calls) == 7
    for i, p in enumerate(ps):
        _, plain = offline.synthesize(runner.model, p)
        assert torch.equal(torch.as_tensor(np.stack(frames[i])), torch.as_tensor(plain))


@pytest.mark.gpu
@torch.no_grad()
def test_default_cudagraph_serves_on_its_top_k_graphs_before_it_captures_the_rest():
    """default+cudagraph's first warm steps capture the top-k variant's CodePredictor and talker graphs and the
    one-prompt prefill; requests run meanwhile (a full-sort batch on the reference modules, a batched prefill
    ungraphed); the remaining steps capture the full-sort variant and the batched prefills."""
    from omni_tts.config import CompileMode
    from omni_tts.engine.model_runner import Runner
    from omni_tts.models.loading import load_model

    cfg = EngineConfig(model=str(fixture_dir("custom_voice")), mode="default+cudagraph", device="cuda",
                       max_num_seqs=4, max_seq_len=128)
    runner = Runner(load_model(cfg), cfg, CompileMode.DEFAULT_CUDAGRAPH)
    runner.impls.compile_settings()
    steps = runner.warm_steps()
    first = runner.steps_before_serving(len(steps))
    assert first == 2 + len(runner.kv_buckets) and len(steps) == 2 + 2 * len(runner.kv_buckets) + len(
        runner.prefill_batches)
    for step in steps[:first]:
        step()
    assert set(runner.cp_graphs) == {False} and {s for _, s in runner.talker_graphs} == {False}
    assert set(runner.prefill_graphs) == {1} and runner.cp_pending == {True} and runner.reference_talker
    ps = [SynthesisParams(text="Top-k.", speaker="ryan", language="English", do_sample=True, top_k=20, seed=1),
          SynthesisParams(text="Full sort.", speaker="vivian", language="English", do_sample=True, top_k=0,
                          top_p=0.8, seed=2)]
    runner.prefill_batch(0, [runner.model.prepare(p, runner.max_len) for p in ps])  # x2: ungraphed
    for n in (1, 2, 1, 2):
        codes, _ = runner.step(n)
        assert codes.shape == (n, 16) and ((codes >= 0) & (codes < runner.model.vocab_size)).all()
    for step in steps[first:]:
        step()
    runner.warmed(0.0)
    assert set(runner.cp_graphs) == {False, True} and len(runner.talker_graphs) == 2 * len(runner.kv_buckets)
    assert set(runner.prefill_graphs) == set(runner.prefill_batches) and not runner.cp_pending
    assert not runner.reference_talker and len(runner.graphs) == len(steps)


def test_rows_moved_to_a_position_step_there_and_go_back(_one_thread):
    """testing.rows_at: inside the block the rows' talker step runs at the given position (its bucket picked
    from it, its K/V written there); after it the rows are back at their own positions and step there."""
    from omni_tts.engine.testing import rows_at

    runner, ps, items, T = three_prompts()
    runner.prefill_batch(0, items)
    pos0, bucket0 = runner.pos[:3].clone(), runner.kv_len(3)
    far = 100
    assert bucket0 <= far < runner.kv_buckets[-1] and max(T) < far
    with rows_at(runner, 3, far):
        assert runner.kv_len(3) == runner.kv_buckets[-1] and runner.pos[:3].tolist() == [far] * 3
        runner.step_fns(3)[1]()
        assert bool((runner.cache.k[:, :3, :, far] != 0).all(dim=-1).any())  # written at the far position
    assert torch.equal(runner.pos[:3], pos0) and runner.kv_len(3) == bucket0
    runner.cache.k[:, :3, :, far].zero_()
    for i in range(3):
        runner.cache.k[:, i, :, T[i]].zero_()
    runner.step_fns(3)[1]()
    assert not bool(runner.cache.k[:, :3, :, far].any())  # back home: nothing written far away
    assert all(bool(runner.cache.k[:, i, :, T[i]].any()) for i in range(3))  # but at each row's own position


def test_microbench_times_a_step_at_each_buckets_end_and_leaves_the_rows_home(_one_thread):
    from omni_tts.tools.microbench import talker_at_kv_end

    runner, ps, items, T = three_prompts()
    runner.prefill_batch(0, items)
    pos0 = runner.pos[:3].clone()
    runner.cache.k.zero_()
    out = talker_at_kv_end(runner, 3)
    assert list(out) == runner.kv_buckets and all(ms > 0 for ms in out.values())
    assert torch.equal(runner.pos[:3], pos0)
    written = [int(p) for p in runner.cache.k[:, :3].abs().sum((0, 1, 2, 4)).nonzero()]
    assert written == [min(L, runner.scratch_pos) - 1 for L in runner.kv_buckets]  # each bucket's last position
