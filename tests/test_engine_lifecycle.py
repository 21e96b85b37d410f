"""The engine's requests from submit to end, and the engine's own life, on the real tiny checkpoints (CPU,
float32), no mocks: cancellation (mid-stream and queued), slots taken in the order of request ids, input
errors that leave the engine serving, bad checkpoints, fixed-length benchmark requests, shutdown, an
engine built without warming, priming, warm-up threads, and cuDNN attention kept off CUDA requests.
"""

from __future__ import annotations

import shutil
import sys
import threading

import numpy as np
import pytest
import torch
from _engine import (
    SPF,
    TIMEOUT,
    assert_same_as_plain,
    good,
    greedy,
    make_engine,
    plain,
)
from _fixtures import fixture_dir

from omni_tts.config import EngineConfig, SynthesisParams, build_config
from omni_tts.engine import offline
from omni_tts.engine.engine import Engine
from omni_tts.errors import Cancelled, CheckpointError, InputError, OmniTTSError, Overloaded


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

def test_slots_being_admitted_are_not_counted_free_by_the_waiting_bound():
    """max_num_seqs + max_waiting requests at most: while the scheduler starts a request it has taken from the
    queue (its decoder is made before it joins the slots), that slot is not free to a new submit."""
    eng = make_engine(fixture_dir("custom_voice"), max_num_seqs=2, max_seq_len=512, max_waiting=2)
    sched = eng.schedulers[eng.default_mode]
    entered, release, make = threading.Event(), threading.Event(), sched._make_decoder

    def held(prep):  # the first request's start holds here until the test has submitted the others
        entered.set()
        release.wait(TIMEOUT)
        return make(prep)

    sched._make_decoder = held
    try:
        handles = [eng.submit(greedy("taken into a slot", max_new_tokens=3))]
        assert entered.wait(TIMEOUT)
        handles += [eng.submit(greedy(f"waits {i}", max_new_tokens=3)) for i in range(3)]  # 1 slot + 2 places
        with pytest.raises(Overloaded):
            eng.submit(greedy("one too many", max_new_tokens=3))
        release.set()
        assert [h.result(TIMEOUT).metrics.status for h in handles] == ["done"] * 4
    finally:
        release.set()
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


def test_shutdown_right_after_priming_leaves_no_thread_that_still_reports(_one_thread):
    """A server that cannot listen shuts its engine down and prints its error as the last line: once
    shutdown returns, the priming thread has ended and every line it reports came before."""
    said: list[str] = []
    cfg = build_config({"model": str(fixture_dir("custom_voice")), "mode": "eager", "device": "cpu",
                        "max_num_seqs": 1, "max_seq_len": 256})
    eng = Engine.from_config(cfg, progress=said.append, wait=False, warm=False)
    eng.prime()
    eng.shutdown()
    count = len(said)
    assert eng.wait_primed(0), said  # joined by shutdown, no timeout needed
    assert len(said) == count


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
