"""The engine on the real tiny checkpoints (CPU, float32), no mocks: exactness against the plain
single-request path and the goldens, no cross-talk between concurrent sampled requests while slots are
reused and compacted, per-request modes, metrics arithmetic. Streaming and burst admission:
test_engine_streaming.py. Cancellation, queue order, bad input, fixed-length requests and the engine's
life (shutdown, warming, priming): test_engine_lifecycle.py. Several resident modes served at once:
test_modes.py.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
from _engine import (
    SPF,
    SR,
    TIMEOUT,
    assert_same_as_plain,
    case_params,
    collect,
    golden_case,
    good,
    greedy,
    make_engine,
    plain,
    scheduler,
)
from _fixtures import FIXTURES, fixture_dir

from omni_tts.config import CompileMode, SynthesisParams
from omni_tts.errors import InputError, OmniTTSError
from omni_tts.models import sampling


# ------------------------------------------------------------------------------------------ exactness
def test_one_request_equals_the_plain_path_and_the_golden_codes(engine):
    case = golden_case("custom_voice", 0)
    p = case_params(case)
    plain(engine, p)
    res = engine.synthesize(p, timeout=TIMEOUT)
    gold = np.load(FIXTURES / "custom_voice" / "golden" / "case0_codes.npy")
    assert res.codes.shape == gold.shape == (case["frames"], 16)
    np.testing.assert_array_equal(res.codes, gold)
    assert_same_as_plain(engine, p, res.codes, res.wav)
    gold_wav = np.load(FIXTURES / "custom_voice" / "golden" / "case0_wav.npy")
    assert res.wav.shape == (case["samples"],) and float(np.abs(res.wav - gold_wav).max()) < 1e-3
    assert res.sample_rate == SR and res.metrics.status == "done"


def test_a_frame_launched_ahead_gives_the_plain_paths_audio_and_codes(_one_thread):
    """The scheduler launches a frame while the one before it is still unread, and still gives the plain
    path's codes and audio for requests that end at different frames."""
    eng = make_engine(fixture_dir("custom_voice"))
    overlapped: list[bool] = []  # per launch: was a launched frame still unread?
    sched = scheduler(eng)
    launch = sched.runner.launch
    sched.runner.launch = lambda n: overlapped.append(sched._pending is not None) or launch(n)
    try:
        ps = [greedy("Short.", max_new_tokens=6), greedy("A longer request here.", fixed_frames=9)]
        for p, h in zip(ps, [eng.submit(p) for p in ps]):
            r = h.result(TIMEOUT)
            assert_same_as_plain(eng, p, r.codes, r.wav)
        assert len(overlapped) >= 9 and any(overlapped)
    finally:
        eng.shutdown()


def test_a_frames_codes_reach_the_audio_stage_before_its_eos_is_waited_for(_one_thread):
    """Each frame's codes go to the audio stage as soon as its CodePredictor half is read back, before the
    scheduler waits for the talker half (the next code 0, EOS); the audio still equals the plain path's."""
    eng = make_engine(fixture_dir("custom_voice"))
    events: list[str] = []
    sched = scheduler(eng)
    collect, put = sched.runner.collect_eos, sched.audio.put
    sched.runner.collect_eos = lambda ticket: events.append("eos") or collect(ticket)
    sched.audio.put = lambda jobs: events.extend(j[0] for j in jobs) or put(jobs)
    try:
        p = greedy("Short.", fixed_frames=5)
        r = eng.submit(p).result(TIMEOUT)
        assert_same_as_plain(eng, p, r.codes, r.wav)
        frames = [i for i, e in enumerate(events) if e == "eos"][:5]  # a sixth may be launched ahead
        assert events.count("push") == 5 and all(events[i - 1] == "push" for i in frames)
        assert events.index("flush") > frames[-1]
    finally:
        eng.shutdown()


def test_voice_design_checkpoint_matches_its_golden_and_needs_an_instruct():
    eng = make_engine(fixture_dir("voice_design"), max_num_seqs=1)
    try:
        case = golden_case("voice_design", 0)
        p = case_params(case)
        res = eng.synthesize(p, timeout=TIMEOUT)
        np.testing.assert_array_equal(res.codes, np.load(FIXTURES / "voice_design" / "golden" / "case0_codes.npy"))
        for instruct in (None, "   "):
            with pytest.raises(InputError, match="instruct"):
                eng.submit(SynthesisParams(text="hello", task="voice_design", instruct=instruct, max_new_tokens=4))
        with pytest.raises(InputError, match="cannot do task 'custom_voice'"):
            eng.submit(SynthesisParams(text="hello", speaker="ryan", max_new_tokens=4))
        r = eng.synthesize(SynthesisParams(text="ok", task="voice_design", instruct="a calm voice", greedy=True,
                                           max_new_tokens=4), timeout=TIMEOUT)
        assert r.codes.shape == (3, 16)
    finally:
        eng.shutdown()


def test_embedded_checkpoint_engine_equals_the_plain_path(tmp_path_factory):
    from omni_tts.models.checkpoint_maker import embedded_checkpoint_dir

    d = embedded_checkpoint_dir(tmp_path_factory.mktemp("omni_cache"))
    eng = make_engine(d, max_num_seqs=2)
    try:
        spk = eng.model.speakers()
        assert spk, "the embedded checkpoint is a CustomVoice model with speakers"
        ps = [greedy("embedded demo", speaker=spk[0], max_new_tokens=12),
              SynthesisParams(text="sampled embedded", speaker=spk[-1], seed=11, temperature=1.1, top_k=30,
                              max_new_tokens=10)]
        for p in ps:
            plain(eng, p)
        hs = [eng.submit(p) for p in ps]
        for p, h in zip(ps, hs):
            r = h.result(TIMEOUT)
            assert_same_as_plain(eng, p, r.codes, r.wav)
    finally:
        eng.shutdown()


# ------------------------------------------------------------------------------------------ concurrency
def _sampled_batch(speakers: list[str]) -> list[SynthesisParams]:
    texts = ["the quick brown fox", "jumps over the lazy dog", "a third request here", "four score and seven",
             "hello world again", "numbers one two three", "fresh bread in the morning", "the last one"]
    temps = [0.6, 0.8, 1.0, 1.2, 0.7, 0.9, 1.4, 0.5]
    top_k = [5, 10, 20, 50, 0, 3, 100, 8]
    top_p = [1.0, 0.9, 1.0, 0.8, 0.95, 1.0, 0.7, 1.0]
    max_new = [5, 18, 14, 8, 16, 6, 12, 10]  # uneven: early finishers leave holes that get compacted
    return [SynthesisParams(text=texts[i], speaker=speakers[i % len(speakers)], language="Auto", do_sample=True,
                            temperature=temps[i], top_k=top_k[i], top_p=top_p[i], seed=1000 + 7 * i,
                            subtalker_temperature=temps[-1 - i], subtalker_top_k=top_k[-1 - i],
                            repetition_penalty=1.0 + 0.05 * (i % 3), max_new_tokens=max_new[i])
            for i in range(8)]


def test_eight_concurrent_sampled_requests_with_three_slots_get_exactly_their_solo_output(engine):
    ps = _sampled_batch(engine.model.speakers())
    refs = [plain(engine, p) for p in ps]
    assert len({r[1].tobytes() for r in refs}) == 8, "distinct requests must make distinct codes"
    steps0, busy0 = engine.stats.steps, engine.stats.busy_slots_sum
    out: list = [None] * 8
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)
    max_rows = [0]
    on_step = engine.stats.on_step

    def watch(batch: int) -> None:  # every frame's rows, as the scheduler counts them
        max_rows[0] = max(max_rows[0], batch)
        on_step(batch)

    def client(i: int) -> None:
        try:
            barrier.wait(TIMEOUT)
            h = engine.submit(ps[i])
            chunks = collect(h)
            out[i] = (chunks, h.result(TIMEOUT))
        except BaseException as e:  # reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    engine.stats.on_step = watch
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
    finally:
        del engine.stats.on_step
    assert not errors, errors[0]
    for p, (chunks, res), _ref in zip(ps, out, refs):
        assert_same_as_plain(engine, p, res.codes, res.wav)
        np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), res.wav)
        assert res.codes.shape[0] == p.max_new_tokens - 1 and res.metrics.status == "done"
    frames = sum(res.codes.shape[0] for _, res in out)
    assert engine.stats.busy_slots_sum - busy0 == frames  # one frame per active slot per step
    assert engine.stats.steps - steps0 < frames  # requests really shared steps (batched)
    assert 0 < max_rows[0] <= 3  # never more than max_num_seqs in slots
    assert engine.snapshot().active == 0 and engine.snapshot().waiting == 0


def test_fast_path_engine_with_kv_length_buckets_equals_the_plain_path(_one_thread, monkeypatch):
    """The engine's fast path (uncompiled here: the compiled one is the same functions) reads only the first
    kv_len cache positions per step; requests of different lengths crossing the 64-position bucket, moved
    between slots as others finish, still get the plain path's greedy codes."""
    from omni_tts.models.compiled.fast_path import FastPath

    eng = make_engine(fixture_dir("custom_voice"), max_num_seqs=2)
    try:
        runner = scheduler(eng).runner  # idle (nothing submitted yet): its step implementations can be swapped
        fast = FastPath(eng.model, None)
        runner.talker_impl, runner.cp_impl, runner.cp_predict = fast, fast, fast.predict_frame
        assert runner.kv_buckets == [64, 128, 257]
        ps = [greedy(t, fixed_frames=n) for t, n in (("One.", 70), ("Second request here.", 30),
                                                       ("A third, a bit longer, text.", 50))]
        handles = [eng.submit(p) for p in ps]
        for p, h in zip(ps, handles):
            r = h.result(TIMEOUT)
            assert r.codes.shape[0] == p.fixed_frames
            assert_same_as_plain(eng, p, r.codes, r.wav)
        # sampled: top-k rows run the top-k-selection warp, a top-p-only row switches its steps to the full sort
        sampled = [SynthesisParams(text=t, speaker="ryan", language="English", do_sample=True, temperature=0.9,
                                   top_k=k, top_p=tp, subtalker_top_k=sk, seed=s, fixed_frames=12)
                   for t, k, tp, sk, s in (("Sampled one.", 50, 0.8, 50, 3), ("Sampled two.", 5, 1.0, 20, 4),
                                           ("Top-p only.", 0, 0.9, 50, 5))]
        sampled[2].fixed_frames = 20  # outlives sampled[0] (submitted after it): every step has a full-sort row
        picks: list[int] = []  # warp_topk calls (spied, not replaced): the fast path really took that variant
        monkeypatch.setattr(sampling, "warp_topk", lambda *a, f=sampling.warp_topk: picks.append(1) or f(*a))
        for batch, selection in ((sampled[:2], True), ([sampled[2], sampled[0]], False)):
            picks.clear()
            handles = [eng.submit(p) for p in batch]
            for p, h in zip(batch, handles):
                r = h.result(TIMEOUT)
                assert_same_as_plain(eng, p, r.codes, r.wav)  # the plain path warps with the full sort
            assert bool(picks) == selection
    finally:
        eng.shutdown()


def test_predictor_buckets_of_their_own_run_two_rows_at_four_and_keep_the_codes(_one_thread, monkeypatch):
    """predictor_buckets [1, 4] beside the talker's [1, 2, 4]: on the fast path (uncompiled) a two-row frame's
    CodePredictor runs at four rows, its talker step at two, and both requests still get the plain path's codes
    (the rows past the live ones compute on spare slots and are dropped)."""
    from omni_tts.models.compiled.fast_path import FastPath

    eng = make_engine(fixture_dir("custom_voice"), max_num_seqs=4, predictor_buckets=[1, 4])
    try:
        runner = scheduler(eng).runner
        assert (runner.buckets, runner.cp_buckets) == ([1, 2, 4], [1, 4])
        fast = FastPath(eng.model, None)
        runner.talker_impl, runner.cp_impl, runner.cp_predict = fast, fast, fast.predict_frame
        sizes: dict[str, list[int]] = {"cp": [], "talker": []}

        def spy(part: str, f):  # records the size each step's callable is made at, then makes it
            def made(*a):
                make = f(*a)
                return lambda b: sizes[part].append(b) or make(b)
            return made
        monkeypatch.setattr(runner, "_make_cp_fn", spy("cp", runner._make_cp_fn))
        monkeypatch.setattr(runner, "_make_talker_fn", spy("talker", runner._make_talker_fn))
        ps = [greedy(t, fixed_frames=n) for t, n in (("One row here.", 24), ("And a second one.", 8))]
        handles = [eng.submit(p) for p in ps]
        for p, h in zip(ps, handles):
            r = h.result(TIMEOUT)
            assert_same_as_plain(eng, p, r.codes, r.wav)
        assert 4 in sizes["cp"] and 2 not in sizes["cp"] and 2 in sizes["talker"]
    finally:
        eng.shutdown()


# ------------------------------------------------------------------------------------------ modes
def test_a_request_names_its_mode_and_an_absent_or_unknown_one_is_refused_at_submit(engine):
    """mode=None and mode='eager' both run in the eager scheduler; a mode that is not resident here (CPU: only
    the default) or unknown is one InputError at submit, nothing is queued, and the engine keeps serving."""
    p = greedy("per request mode", max_new_tokens=6)
    r_none = engine.synthesize(p, timeout=TIMEOUT)
    r_eager = engine.synthesize(dataclasses.replace(p, mode="eager"), timeout=TIMEOUT)
    assert r_none.metrics.mode == r_eager.metrics.mode == "eager"
    np.testing.assert_array_equal(r_none.codes, r_eager.codes)
    waiting = engine.snapshot().waiting
    for mode, match in (("default", "mode default is not available: not resident"),
                        ("default+cudagraph", "mode default\\+cudagraph is not available: needs a CUDA GPU"),
                        ("turbo", "unknown compile mode 'turbo'")):
        with pytest.raises(InputError, match=match) as e:
            engine.submit(dataclasses.replace(p, mode=mode))
        assert "\n" not in str(e.value)
    assert engine.snapshot().waiting == waiting
    good(engine)


def test_mode_notes_say_what_each_mode_runs_and_the_cpu_engine_says_why_the_graph_modes_are_out(engine):
    from omni_tts.config import MODES

    notes = engine.mode_notes()
    assert list(notes) == list(engine.available_modes()) == list(engine.modes()) == [m.value for m in CompileMode]
    assert all(n.strip() and "\n" not in n for n in notes.values())
    assert "no compile" in notes["eager"] and "guard" in notes["default"]
    assert "private pool" in notes["reduce-overhead"] and "shared pool" in notes["default+cudagraph"]
    modes = engine.modes()
    assert modes["eager"].state == "ready" and modes["eager"].is_default
    assert engine.available_modes()["eager"] is None
    for mode in ("reduce-overhead", "default+cudagraph"):  # this engine is on CPU
        assert modes[mode].state == "unavailable" and not modes[mode].is_default
        assert "needs a CUDA GPU" in engine.available_modes()[mode] == modes[mode].reason
    assert "not resident" in engine.available_modes()["default"]  # CPU: only the default mode unless listed
    # what decides it: the graph modes need CUDA, default and eager do not
    assert [m.value for m in CompileMode if MODES[m].needs_cuda] == ["reduce-overhead", "default+cudagraph"]
    assert MODES[CompileMode.DEFAULT_CUDAGRAPH].graphs and not MODES[CompileMode.REDUCE_OVERHEAD].graphs
    assert [m.value for m in CompileMode if MODES[m].whole_frame] == ["reduce-overhead"]
    # the table answers the engine's other questions: the warm order, the pools, 'auto', the reference
    assert sorted(CompileMode, key=lambda m: MODES[m].warm_rank)[0] is CompileMode.reference() is CompileMode.EAGER
    assert max(CompileMode, key=lambda m: MODES[m].warm_rank) is CompileMode.REDUCE_OVERHEAD
    assert [m for m in CompileMode if MODES[m].vllm_pool] == [CompileMode.DEFAULT_CUDAGRAPH]
    assert CompileMode.auto(cuda=True) is CompileMode.DEFAULT_CUDAGRAPH and CompileMode.auto(False) is CompileMode.EAGER
    assert [m for m in CompileMode if MODES[m].serves_while_warming] == [CompileMode.EAGER]


def test_first_chunk_graphs_are_skipped_while_paused(engine):
    """The audio stage asks its first-chunk graphs (CUDA only; a recording stand-in here that declines, so
    the chunk decodes eagerly) only while graphs_on; off, every first chunk decodes eagerly."""
    calls: list[int] = []

    def first(codec, rows):
        calls.append(rows.shape[0])
        return None

    c2w = engine._audio
    assert c2w.graphs_on and engine.snapshot().first_chunk_graphs == "off"  # CPU: never built
    old = c2w.first
    c2w.first = first
    try:
        p = SynthesisParams(text="hello there", speaker="ryan", language="English", greedy=True, fixed_frames=3)
        engine.submit(p).result(TIMEOUT)
        assert calls and calls[0] == 1  # the first chunk: one row, starting its stream
        calls.clear()
        c2w.graphs_on = False
        r = engine.submit(p).result(TIMEOUT)
        assert calls == [] and r.wav.size == 3 * SPF  # still decoded, eagerly
    finally:
        c2w.first, c2w.graphs_on = old, True


def test_an_unknown_default_mode_is_refused_and_the_engine_keeps_its_mode(engine):
    for mode, match in (("turbo", "unknown compile mode 'turbo'"), ("default", "not available")):
        with pytest.raises(OmniTTSError, match=match):
            engine.set_default_mode(mode)
        assert engine.mode is engine.default_mode is CompileMode.EAGER
    assert engine.set_default_mode("eager") is CompileMode.EAGER
    good(engine)


# ------------------------------------------------------------------------------------------ metrics
def test_metrics_are_present_and_consistent(engine):
    ps = [greedy("metrics one", max_new_tokens=9), SynthesisParams(text="metrics two", speaker="eric", seed=9,
                                                                   max_new_tokens=14)]
    hs = [engine.submit(p) for p in ps]
    for h in hs:
        r = h.result(TIMEOUT)
        m = r.metrics
        assert m is h.metrics and m.request_id == h.id and m.mode == "eager" and m.status == "done"
        assert m.error is None and m.sample_rate == SR
        assert m.frames == r.codes.shape[0] == h.params.max_new_tokens - 1
        assert m.audio_samples == r.wav.size == m.frames * SPF
        assert m.audio_s == pytest.approx(r.wav.size / SR) == pytest.approx(m.frames * 0.08)
        assert m.accepted_at <= m.first_audio_at <= m.finished_at
        assert 0 <= m.ttfp_ms <= m.e2e_ms
        assert m.rtf == pytest.approx((m.e2e_ms / 1000.0) / m.audio_s)
        d = m.as_dict()
        assert d["ttfp_ms"] == m.ttfp_ms and d["rtf"] == m.rtf and d["audio_s"] == m.audio_s
        assert m in engine.stats.recent_requests(50)
    snap = engine.snapshot()
    assert snap.mode == "eager" and snap.device == "cpu" and snap.dtype == "float32"
    assert snap.max_num_seqs == 3 and snap.active == 0 and snap.memory == {}
    assert snap.mean_occupancy >= 1.0
