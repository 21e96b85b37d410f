"""The engine on the real tiny checkpoints (CPU, float32), no mocks: exactness against the plain
single-request path and the goldens, no cross-talk between concurrent sampled requests while slots are
reused and compacted, cancellation, per-request modes, streaming == one-shot decode, input
errors that leave the engine serving, metrics arithmetic and fixed-length benchmark requests. Several
resident modes served at once are tested in test_modes.py.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from _fixtures import FIXTURES, fixture_dir
from test_warmup import until

from omni_tts.config import CompileMode, EngineConfig, SynthesisParams, build_config
from omni_tts.engine import offline
from omni_tts.engine.engine import Engine, RequestHandle
from omni_tts.engine.mode_scheduler import ModeScheduler
from omni_tts.errors import Cancelled, CheckpointError, InputError, OmniTTSError
from omni_tts.models import sampling

SR = 24000
SPF = 1920  # samples per 12.5 Hz frame at 24 kHz (0.08 s)
TIMEOUT = 120.0  # a hang fails the test instead of the suite


def make_engine(model: Path | str, **kw) -> Engine:
    """An eager CPU engine; experimental keys may be given bare, as in a preset."""
    cfg = dict(mode="eager", device="cpu", max_num_seqs=3, max_seq_len=256, initial_chunk_frames=1,
               chunk_frames=4, chunk_growth=False)
    cfg.update(kw)
    return Engine.from_config(build_config({"model": str(model), **cfg}))


def scheduler(eng: Engine, mode: CompileMode = CompileMode.EAGER) -> ModeScheduler:
    """The scheduler (thread, runner, slots) serving `mode` in `eng`."""
    return eng.schedulers[mode]



@pytest.fixture(scope="module")
def engine(_one_thread):
    """custom_voice, eager, 3 slots, first chunk after 1 frame then every 4."""
    eng = make_engine(fixture_dir("custom_voice"))
    yield eng
    eng.shutdown()


_PLAIN: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def plain(eng: Engine, p: SynthesisParams) -> tuple[np.ndarray, np.ndarray]:
    """The plain single-request reference path (TTSModel.synthesize): (wav, codes). Call while idle."""
    key = (str(eng.model.ckpt.path), repr(p))
    if key not in _PLAIN:
        wav, codes = offline.synthesize(eng.model, p)
        _PLAIN[key] = (wav, codes.numpy())
    return _PLAIN[key]


def golden_case(name: str, i: int) -> dict:
    cases = json.loads((fixture_dir(name) / "golden" / "cases.json").read_text())["cases"]
    return next(c for c in cases if c["case"] == i)


def case_params(case: dict, **kw) -> SynthesisParams:
    """A golden case as a request: greedy talker and predictor, max_new_tokens 40 (cases.json)."""
    args = dict(text=case["text"], task=case["task"], speaker=case.get("speaker"), language=case["language"],
                instruct=case.get("instruct"), non_streaming_mode=case.get("non_streaming_mode"),
                do_sample=False, subtalker_do_sample=False, max_new_tokens=40)
    args.update(kw)
    return SynthesisParams(**args)


def greedy(text: str, speaker: str = "ryan", **kw) -> SynthesisParams:
    return SynthesisParams(text=text, speaker=speaker, language="English", greedy=True, **kw)


def good(eng: Engine) -> None:
    """A small valid request succeeds: the engine is still serving."""
    r = eng.synthesize(greedy("still serving", max_new_tokens=4), timeout=TIMEOUT)
    assert r.metrics.status == "done" and r.codes.shape == (3, 16) and r.wav.size == 3 * SPF


def collect(h: RequestHandle) -> list:
    return list(h.stream(timeout=TIMEOUT))


def assert_same_as_plain(eng: Engine, p: SynthesisParams, codes: np.ndarray, wav: np.ndarray) -> None:
    ref_wav, ref_codes = plain(eng, p)
    assert codes.dtype == np.int64 and codes.shape == ref_codes.shape
    np.testing.assert_array_equal(codes, ref_codes)
    assert wav.dtype == np.float32 and wav.shape == ref_wav.shape
    assert float(np.abs(wav - ref_wav).max()) <= 1e-4


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


# ------------------------------------------------------------------------------------------ cancel
def test_cancel_mid_stream_frees_the_slot_and_the_others_finish_unchanged():
    eng = make_engine(fixture_dir("custom_voice"), max_num_seqs=2, initial_chunk_frames=1, chunk_frames=2,
                      max_seq_len=512)
    try:
        long = greedy("this one gets cancelled", speaker="eric", fixed_frames=400)
        b = SynthesisParams(text="second request", speaker="vivian", seed=3, temperature=0.8, max_new_tokens=26)
        c = greedy("the queued third", speaker="dylan", max_new_tokens=20)
        refs = {id(p): plain(eng, p) for p in (b, c)}
        ha, hb, hc = eng.submit(long), eng.submit(b), eng.submit(c)
        first = next(iter(ha.stream(timeout=TIMEOUT)))
        ha.cancel()
        rest: list = []
        with pytest.raises(Cancelled):  # the stream ends with Cancelled once the cancel is seen
            for chunk in ha.stream(timeout=TIMEOUT):
                rest.append(chunk)
        with pytest.raises(Cancelled) as e:
            ha.result(TIMEOUT)
        ra = e.value.partial
        assert first.index == 0 and first.samples.size == SPF
        assert ha.metrics.status == "cancelled" and "cancelled" in ha.metrics.error
        assert 1 <= ra.codes.shape[0] < 400 and ha.metrics.frames == ra.codes.shape[0]
        assert ha.metrics.audio_samples == sum(c.samples.size for c in [first, *rest]) == ra.wav.size
        for p, h in ((b, hb), (c, hc)):
            r = h.result(TIMEOUT)
            assert r.metrics.status == "done"
            wav, codes = refs[id(p)]
            np.testing.assert_array_equal(r.codes, codes)
            assert float(np.abs(r.wav - wav).max()) <= 1e-4
        assert eng.snapshot().active == 0
        good(eng)
    finally:
        eng.shutdown()


def test_cancelling_a_queued_request_never_runs_it():
    eng = make_engine(fixture_dir("custom_voice"), max_num_seqs=1, max_seq_len=512)
    try:
        ha = eng.submit(greedy("occupies the only slot", fixed_frames=400))
        hq = eng.submit(greedy("waits in the queue", max_new_tokens=10))
        hq.cancel()
        next(iter(ha.stream(timeout=TIMEOUT)))
        ha.cancel()
        got: list = []
        with pytest.raises(Cancelled):
            for chunk in hq.stream(timeout=TIMEOUT):
                got.append(chunk)
        assert got == []
        with pytest.raises(Cancelled) as e:
            hq.result(TIMEOUT)
        rq = e.value.partial
        assert hq.metrics.status == "cancelled" and rq.codes.shape == (0, 16) and rq.wav.size == 0
        assert hq.metrics.finished_at is not None and hq.metrics.first_audio_at is None
        with pytest.raises(Cancelled):
            ha.result(TIMEOUT)
        assert ha.metrics.status == "cancelled"
        good(eng)
    finally:
        eng.shutdown()



def test_requests_submitted_at_once_take_the_slot_in_the_order_of_their_ids():
    """Ids are handed out in the queue's order, whatever the submitting threads' interleaving (a thread
    switch after nearly every bytecode makes an interleaving between taking an id and queueing likely)."""
    n, old = 12, sys.getswitchinterval()
    eng = make_engine(fixture_dir("custom_voice"), max_num_seqs=1, max_seq_len=512, max_waiting=n)
    start, handles, errors = threading.Barrier(n + 1), [], []
    try:
        ha = eng.submit(greedy("occupies the only slot", fixed_frames=400))
        next(iter(ha.stream(timeout=TIMEOUT)))  # the others wait in the queue behind it

        def submit() -> None:
            start.wait(TIMEOUT)
            try:
                handles.append(eng.submit(greedy("a short one", max_new_tokens=2)))
            except OmniTTSError as e:
                errors.append(e)

        threads = [threading.Thread(target=submit) for _ in range(n)]
        for t in threads:
            t.start()
        sys.setswitchinterval(1e-6)
        start.wait(TIMEOUT)
        for t in threads:
            t.join(TIMEOUT)
        sys.setswitchinterval(old)
        ha.cancel()
        for h in handles:
            h.result(TIMEOUT)
        by_start = sorted(handles, key=lambda h: h.metrics.started_at)
        assert not errors and len(handles) == n and [h.id for h in by_start] == sorted(h.id for h in handles)
    finally:
        sys.setswitchinterval(old)
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


# ------------------------------------------------------------------------------------------ streaming
@pytest.mark.parametrize("initial,chunk,n", [(1, 25, 29), (2, 25, 29), (1, 3, 11), (2, 1, 6)])
def test_streamed_chunks_join_to_the_one_shot_decode(initial, chunk, n):
    eng = make_engine(fixture_dir("custom_voice"), max_num_seqs=1, initial_chunk_frames=initial, chunk_frames=chunk)
    try:
        h = eng.submit(SynthesisParams(text="streaming check", speaker="ryan", seed=5, fixed_frames=n))
        chunks = collect(h)
        res = h.result(TIMEOUT)
        assert res.codes.shape == (n, 16)
        one_shot = eng.model.decode(torch.from_numpy(res.codes))
        joined = np.concatenate([c.samples for c in chunks])
        assert joined.dtype == np.float32 and joined.shape == one_shot.shape == (n * SPF,)
        assert float(np.abs(joined - one_shot).max()) <= 1e-4
        full, tail = divmod(n - initial, chunk)
        want = [initial] + [chunk] * full + ([tail] if tail else [])  # frames per chunk
        assert [c.samples.size // SPF for c in chunks] == want and all(c.samples.size % SPF == 0 for c in chunks)
        assert [c.index for c in chunks] == list(range(len(chunks)))
        assert all(c.request_id == h.id and c.sample_rate == SR for c in chunks)
        assert [c.frames for c in chunks] == want
        assert [c.first_frame for c in chunks] == [sum(want[:i]) for i in range(len(want))]
    finally:
        eng.shutdown()


def test_chunks_of_requests_started_together_are_decoded_in_shared_calls():
    """4 requests admitted in one step (fixed_frames, same prompt length): every step that makes their
    chunks due decodes all four in one batched codec call, and each still gets exactly its solo audio."""
    eng = make_engine(fixture_dir("custom_voice"), max_num_seqs=4, initial_chunk_frames=1, chunk_frames=4)
    try:
        ps = [SynthesisParams(text="batched audio", speaker="ryan", seed=30 + i, temperature=1.0, fixed_frames=13)
              for i in range(4)]
        refs = [plain(eng, p) for p in ps]
        assert len({r[1].tobytes() for r in refs}) == 4
        entered, gate = threading.Event(), threading.Event()
        sched = scheduler(eng)
        admit = sched._admit

        def held() -> None:  # the scheduler waits before its next admission, then admits as always
            entered.set()
            gate.wait(TIMEOUT)
            sched._admit = admit
            admit()

        sched._admit = held
        assert entered.wait(TIMEOUT)  # so all four are admitted in the same pass
        hs = [eng.submit(p) for p in ps]
        gate.set()
        for p, h in zip(ps, hs):
            chunks = collect(h)
            r = h.result(TIMEOUT)
            assert_same_as_plain(eng, p, r.codes, r.wav)
            assert [c.frames for c in chunks] == [1, 4, 4, 4] and [c.index for c in chunks] == [0, 1, 2, 3]
        snap = eng.snapshot()
        assert snap.chunk_decodes == 16 == eng.stats.chunk_decodes
        assert snap.decode_calls == 4 < snap.chunk_decodes  # one call per step that made chunks due
    finally:
        eng.shutdown()


@pytest.mark.parametrize("hold_ms", [0, 100, 1000])
def test_a_request_waits_for_its_burst_only_while_the_burst_prepares_and_within_the_hold(hold_ms):
    """While another submit to the scheduler still prepares its prompt (`ModeScheduler.arriving`), a waiting
    request is held at most admit_hold_ms, so a burst is admitted in one pass (one prefill, chunks in
    step); with no hold it starts at once, and a hold shorter than the preparation runs out."""
    eng = make_engine(fixture_dir("custom_voice"), max_num_seqs=4, admit_hold_ms=hold_ms)
    try:
        p = lambda i: SynthesisParams(text="held together", speaker="ryan", seed=i, fixed_frames=3)  # noqa: E731
        with scheduler(eng).arriving():  # another client's submit, still preparing
            a = eng.submit(p(1))
            if hold_ms < 1000:  # the hold (if any) runs out while the burst still prepares
                until(lambda: a.metrics.started_at is not None, "the first request to start")
            started_inside = a.metrics.started_at is not None
            b = eng.submit(p(2))
        ra, rb = a.result(TIMEOUT), b.result(TIMEOUT)
        assert ra.metrics.status == rb.metrics.status == "done"
        waited = ra.metrics.started_at - ra.metrics.accepted_at
        if hold_ms == 100:
            assert started_inside and waited >= 0.1
        elif hold_ms:  # held for the whole burst: both admitted in the one pass after it
            assert not started_inside and ra.metrics.started_at >= rb.metrics.accepted_at
            assert abs(ra.metrics.started_at - rb.metrics.started_at) < 0.01
    finally:
        eng.shutdown()


def test_a_submit_refused_while_preparing_holds_nobody_afterwards():
    """A submit whose preparation fails (unknown speaker) ends its part of the burst: the next request,
    alone, is admitted at once even with a long hold."""
    eng = make_engine(fixture_dir("custom_voice"), max_num_seqs=2, admit_hold_ms=1000)
    try:
        with pytest.raises(InputError, match="unknown speaker"):
            eng.submit(SynthesisParams(text="no such voice", speaker="nobody"))
        r = eng.synthesize(SynthesisParams(text="not held", speaker="ryan", fixed_frames=2), timeout=TIMEOUT)
        assert r.metrics.started_at - r.metrics.accepted_at < 0.5
    finally:
        eng.shutdown()


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("kw,match", [
    (dict(text=""), "text is empty"),
    (dict(text="   \n"), "text is empty"),
    (dict(text="x" * 5001), "too long"),
    (dict(speaker="nobody"), "unknown speaker 'nobody'; valid: dylan, eric, ryan, vivian"),
    (dict(language="klingon"), "unknown language 'klingon'; valid: .*english"),
    (dict(max_new_tokens=0), "max_new_tokens must be >= 2"),
    (dict(max_new_tokens=1), "max_new_tokens must be >= 2"),
    (dict(task="voice_design", instruct="calm"), "cannot do task 'voice_design'"),
    (dict(task="voice_clone"), "voice"),
    (dict(task="sing"), "unknown task 'sing'"),
    (dict(temperature=-1.0), "temperature must be >= 0"),
    (dict(top_p=0.0), "top_p must be in"),
    (dict(fixed_frames=0), "fixed_frames must be >= 1"),
])
def test_bad_input_is_one_clear_error_at_submit_and_the_engine_keeps_serving(engine, kw, match):
    args = dict(text="hello", speaker="ryan", language="English", max_new_tokens=4)
    args.update(kw)
    waiting = engine.snapshot().waiting
    with pytest.raises(InputError, match=match) as e:
        engine.submit(SynthesisParams(**args))
    assert "\n" not in str(e.value)
    assert engine.snapshot().waiting == waiting  # nothing was queued
    good(engine)


def test_text_too_long_for_max_seq_len_fails_that_request_only():
    eng = make_engine(fixture_dir("custom_voice"), max_num_seqs=2, max_seq_len=32)
    try:
        ok = greedy("short", max_new_tokens=8)
        plain(eng, ok)
        h_ok = eng.submit(ok)
        with pytest.raises(InputError, match="too long for this engine.*max_seq_len 32") as e:
            eng.submit(greedy("this text is far too long for a 32-position cache", max_new_tokens=8))
        assert "\n" not in str(e.value)  # refused at submit (the prompt is built there), nothing queued
        r = h_ok.result(TIMEOUT)
        assert_same_as_plain(eng, ok, r.codes, r.wav)
        # a request asking for more frames than the cache holds is capped, not failed
        r = eng.synthesize(greedy("short", max_new_tokens=500), timeout=TIMEOUT)
        assert r.metrics.status == "done" and 2 <= r.codes.shape[0] < 32
        good(eng)
    finally:
        eng.shutdown()


def test_missing_or_corrupt_checkpoint_is_a_checkpoint_error(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_TTS_CACHE", str(tmp_path / "cache"))  # loading a given model writes nothing here
    with pytest.raises(CheckpointError, match="no such directory"):
        Engine.from_config(EngineConfig(model=str(tmp_path / "missing"), device="cpu", mode="eager"))
    src = fixture_dir("custom_voice")
    for name, corrupt in (("garbage", lambda b: b"\x00garbage" * 10), ("truncated", lambda b: b[: len(b) // 2])):
        d = tmp_path / name
        shutil.copytree(src, d, ignore=shutil.ignore_patterns("golden"))
        w = d / "model.safetensors"
        data = w.read_bytes()
        w.chmod(0o644)
        w.write_bytes(corrupt(data))
        with pytest.raises(CheckpointError, match="model.safetensors") as e:
            Engine.from_config(EngineConfig(model=str(d), device="cpu", mode="eager"))
        assert "\n" not in str(e.value)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_a_codec_that_cannot_be_built_fails_at_load_or_per_request_never_hangs(tmp_path):
    from safetensors.torch import load_file, save_file

    from omni_tts.models.checkpoint import load_checkpoint
    from omni_tts.models.qwen3_tts import TTSModel

    d = tmp_path / "broken_codec"
    shutil.copytree(fixture_dir("custom_voice"), d, ignore=shutil.ignore_patterns("golden"))
    f = d / "speech_tokenizer" / "model.safetensors"
    w = load_file(str(f))
    gone = sorted(k for k in w if k.startswith("decoder."))[-1]
    del w[gone]
    f.chmod(0o644)
    save_file(w, str(f))
    cfg = EngineConfig(model=str(d), device="cpu", mode="eager", max_num_seqs=1, max_seq_len=64)
    with pytest.raises(CheckpointError, match=f"missing tensor '{gone}'"):
        Engine.from_config(cfg)
    model = TTSModel.from_checkpoint(load_checkpoint(str(d)), device=torch.device("cpu"), dtype=torch.float32)
    eng = Engine(model, cfg)  # the plain constructor builds the codec on first use
    eng.wait_ready()
    try:
        for _ in range(2):  # the scheduler survives the first failure and answers the next request too
            h = eng.submit(greedy("hello", max_new_tokens=4))
            with pytest.raises(CheckpointError, match=f"missing tensor '{gone}'"):
                h.result(TIMEOUT)
            assert h.metrics.status == "error" and h.metrics.finished_at is not None
    finally:
        eng.shutdown()


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


# ------------------------------------------------------------------------------------------ fixed frames
def test_fixed_frames_makes_exactly_n_frames(engine):
    base = dict(text="fixed length", speaker="vivian", seed=21, temperature=1.0)
    free = engine.synthesize(SynthesisParams(**base, max_new_tokens=16), timeout=TIMEOUT)
    for n in (1, 6, 13):
        r = engine.synthesize(SynthesisParams(**base, max_new_tokens=3, fixed_frames=n), timeout=TIMEOUT)
        assert r.codes.shape == (n, 16) and r.metrics.frames == n and r.wav.size == n * SPF
        np.testing.assert_array_equal(r.codes, free.codes[:n])  # same draws: only EOS is blocked


def test_fixed_frames_that_do_not_fit_max_seq_len_are_an_error_not_fewer_frames():
    eng = make_engine(fixture_dir("custom_voice"), max_num_seqs=1, max_seq_len=32)
    try:
        with pytest.raises(InputError, match="fixed_frames 30 does not fit.*max_seq_len 32"):
            eng.synthesize(greedy("short", fixed_frames=30), timeout=TIMEOUT)
        r = eng.synthesize(greedy("short", fixed_frames=8), timeout=TIMEOUT)
        assert r.codes.shape == (8, 16)
    finally:
        eng.shutdown()


def test_shutdown_fails_queued_requests_and_refuses_new_ones():
    eng = make_engine(fixture_dir("custom_voice"), max_num_seqs=1, max_seq_len=512)
    ha = eng.submit(greedy("running", fixed_frames=400))
    hq = eng.submit(greedy("queued", max_new_tokens=10))
    next(iter(ha.stream(timeout=TIMEOUT)))
    eng.shutdown()
    for h in (ha, hq):
        with pytest.raises(OmniTTSError, match="shut down"):
            h.result(TIMEOUT)
        assert h.metrics.status == "cancelled"
    with pytest.raises(OmniTTSError, match="shut down"):
        eng.submit(greedy("too late", max_new_tokens=4))


def test_an_engine_built_not_warming_accepts_requests_and_serves_them_once_started(_one_thread):
    """Engine(warm=False) (the app builds its page first): requests are accepted and wait, nothing is
    compiled or captured until start_warming, then they are served; a second start is a no-op."""
    cfg = build_config({"model": str(fixture_dir("custom_voice")), "mode": "eager", "device": "cpu",
                        "max_num_seqs": 2, "max_seq_len": 256})
    eng = Engine.from_config(cfg, wait=False, warm=False)
    try:
        h = eng.submit(SynthesisParams(text="Waits for the warm-up.", speaker="ryan", language="English",
                                       greedy=True, fixed_frames=3))
        assert eng.modes()["eager"].state == "queued" and eng.snapshot().waiting == 1 and not h.done
        eng.start_warming()
        eng.start_warming()
        r = h.result(TIMEOUT)
        assert r.metrics.status == "done" and r.codes.shape == (3, 16)
        assert eng.modes()["eager"].state == "ready"
    finally:
        eng.shutdown()


def test_priming_runs_the_eager_path_once_before_the_warm_up_and_changes_no_result(_one_thread):
    """Engine.prime (the app calls it, and waits for it, before it builds its page) serves eager at once
    and runs a tiny clip through its scheduler (the path a visitor's request takes), once, before any warm-up
    is asked for, and keeps it out of the recent requests; the warm-up waits for it; a request afterwards
    equals the plain path. A checkpoint whose tasks all need a reference voice (Base) is not primed."""
    said: list[str] = []
    cfg = build_config({"model": str(fixture_dir("custom_voice")), "mode": "eager", "device": "cpu",
                        "max_num_seqs": 2, "max_seq_len": 256})
    eng = Engine.from_config(cfg, progress=said.append, wait=False, warm=False)
    try:
        eng.prime()
        eng.prime()
        assert eng.wait_primed(TIMEOUT) and any("eager path primed" in s for s in said), said
        assert eng.stats.busy_slots_sum == 2 and eng.stats.recent_requests() == []  # its two frames, on the scheduler
        assert eng.modes()["eager"].state == "warming"  # served before its warm-up
        eng.start_warming()
        assert eng.wait_ready("eager", timeout=TIMEOUT)
        primed = [i for i, s in enumerate(said) if "eager path primed" in s]
        ready = [i for i, s in enumerate(said) if s.startswith("eager ready")]
        assert len(primed) == 1 and ready and primed[0] < ready[0], said
        p = SynthesisParams(text="After the priming.", speaker="ryan", language="English", greedy=True,
                            fixed_frames=4)
        r = eng.synthesize(p, timeout=TIMEOUT)
        wav, codes = offline.synthesize(eng.model, p)
        np.testing.assert_array_equal(r.codes, np.asarray(codes))
    finally:
        eng.shutdown()
    said.clear()
    base = Engine.from_config(build_config({"model": str(fixture_dir("base")), "mode": "eager", "device": "cpu",
                                            "max_num_seqs": 1, "max_seq_len": 256}),
                              progress=said.append, wait=False, warm=False)
    try:
        base.prime()
        assert base.wait_primed(0)  # nothing to wait for
        base.start_warming()
        assert base.wait_ready("eager", timeout=TIMEOUT)
        assert not any("prim" in s for s in said), said
    finally:
        base.shutdown()


def test_each_mode_warms_in_the_thread_that_serves_it(_one_thread):
    """Inductor's graph trees and Dynamo's settings are per thread, so a mode's warm-up runs in its own
    serving thread (the engine's warm-up thread only orders the modes)."""
    said: list[tuple[str, str]] = []
    cfg = build_config({"model": str(fixture_dir("custom_voice")), "mode": "eager", "device": "cpu",
                        "max_num_seqs": 1, "max_seq_len": 128})
    eng = Engine.from_config(cfg, progress=lambda s: said.append((threading.current_thread().name, s)))
    try:
        ready = [name for name, s in said if s.startswith("eager ready in")]
        assert ready == ["omni-tts-eager"], said
    finally:
        eng.shutdown()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_attention_on_cuda_runs_no_cudnn_kernel_built_at_run_time():
    """On CUDA a request never runs cuDNN's attention, which compiles a kernel at run time for each new
    shape (prompt length, KV length, batch): seconds on a request's path."""
    from omni_tts.models.loading import load_model

    model = load_model(build_config({"model": str(fixture_dir("custom_voice")), "device": "cuda",
                                     "dtype": "bfloat16"}))
    p = SynthesisParams(text="Attention on the GPU.", speaker="ryan", language="English", greedy=True,
                        fixed_frames=3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        offline.synthesize(model, p)
    names = {e.key for e in prof.key_averages()}
    assert any("scaled_dot_product" in n for n in names), sorted(names)
    assert not any("cudnn_attention" in n for n in names), sorted(n for n in names if "attention" in n)
