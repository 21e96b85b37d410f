"""Several modes in one engine, and a scheduler's failure isolation, on the tiny custom_voice checkpoint
(CPU, float32, real components): rows of two modes served at the same time equal their solo runs, an
eager request is served while a compiled mode still warms, enforce_eager leaves only eager, one bad
request admitted with seven good ones fails alone, and a cancelled request's partial result holds
codes and audio that agree.

The two tests with the 'default' mode compile it with Inductor on the CPU (about a minute): `slow`.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from contextlib import nullcontext
from typing import Any

import numpy as np
import pytest
import torch
from _fixtures import fixture_dir

from omni_tts.config import CompileMode, EngineConfig, SynthesisParams
from omni_tts.engine import offline
from omni_tts.engine.audio_stage import AudioStage
from omni_tts.engine.engine import Engine
from omni_tts.engine.metrics import EngineStats, RequestMetrics, now
from omni_tts.engine.mode_scheduler import ModeScheduler
from omni_tts.engine.model_runner import Runner
from omni_tts.engine.request import Request, RequestHandle
from omni_tts.engine.warmup import WarmupCoordinator
from omni_tts.errors import Cancelled, EngineError, InputError
from omni_tts.models.loading import load_model

SPF = 1920  # samples per frame at 24 kHz
TIMEOUT = 120.0
MODEL = str(fixture_dir("custom_voice"))


def config(**kw) -> EngineConfig:
    base = dict(model=MODEL, device="cpu", mode="eager", max_num_seqs=2, max_seq_len=128, initial_chunk_frames=1,
                chunk_frames=4)
    base.update(kw)
    return EngineConfig(**base)


def greedy(text: str, **kw) -> SynthesisParams:
    return SynthesisParams(text=text, speaker="ryan", language="English", greedy=True, **kw)


def sampled(text: str, seed: int, **kw) -> SynthesisParams:
    return SynthesisParams(text=text, speaker="vivian", language="English", do_sample=True, temperature=0.9,
                           top_k=20, seed=seed, **kw)


def same(a, b) -> None:
    """Two results (SynthesisResult or offline's (wav, codes)) hold the same codes and audio."""
    wa, ca = (a.wav, a.codes) if hasattr(a, "wav") else (a[0], np.asarray(a[1]))
    wb, cb = (b.wav, b.codes) if hasattr(b, "wav") else (b[0], np.asarray(b[1]))
    np.testing.assert_array_equal(ca, cb)
    assert wa.shape == wb.shape and float(np.abs(wa - wb).max(initial=0.0)) <= 1e-4


# ------------------------------------------------------------------------------------------ two modes
@pytest.fixture(scope="module")
def two_modes(_one_thread):
    """eager (the default, warm on return) and default (compiling in the background), one slot each."""
    eng = Engine.from_config(config(modes=["eager", "default"], max_num_seqs=1))
    yield eng
    eng.shutdown()


def _default_or_skip(eng: Engine) -> None:
    assert eng.wait_ready("default", timeout=600), "the default mode did not warm within 10 minutes"
    state = eng.modes()["default"]
    if state.state == "failed":
        pytest.skip(f"Inductor cannot compile on this CPU: {state.reason}")


@pytest.mark.slow
def test_an_eager_request_is_served_while_the_compiled_mode_still_warms(two_modes):
    eng = two_modes
    assert eng.modes()["eager"].state == "ready"
    assert eng.modes()["default"].state in ("queued", "warming")
    r = eng.synthesize(greedy("served at once", fixed_frames=3, mode="eager"), timeout=TIMEOUT)
    warming = eng.modes()["default"].state
    assert r.metrics.status == "done" and r.metrics.mode == "eager" and r.codes.shape == (3, 16)
    assert warming in ("queued", "warming"), "the eager result must arrive before the default mode is ready"
    assert eng.available_modes()["default"] is None  # usable: requests to it wait for the warm-up
    same(r, offline.synthesize(eng.model, greedy("served at once", fixed_frames=3)))


@pytest.mark.slow
def test_rows_of_two_modes_served_at_the_same_time_equal_their_solo_runs(two_modes):
    eng = two_modes
    _default_or_skip(eng)
    ps = {"eager": sampled("the eager row", 7, fixed_frames=10, mode="eager"),
          "default": sampled("the compiled row", 8, fixed_frames=10, mode="default")}
    solo = {m: eng.synthesize(p, timeout=TIMEOUT) for m, p in ps.items()}  # one at a time
    assert solo["default"].metrics.mode == "default" and solo["eager"].metrics.mode == "eager"
    same(solo["eager"], offline.synthesize(eng.model, dataclasses.replace(ps["eager"], mode=None)))
    barrier = threading.Barrier(2)
    out: dict = {}

    def client(m: str) -> None:
        barrier.wait(TIMEOUT)
        out[m] = eng.submit(ps[m]).result(TIMEOUT)

    threads = [threading.Thread(target=client, args=(m,)) for m in ps]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    e, d = out["eager"].metrics, out["default"].metrics
    assert e.accepted_at < d.finished_at and d.accepted_at < e.finished_at  # really served at the same time
    for m in ps:
        assert out[m].metrics.mode == m
        same(out[m], solo[m])


# ------------------------------------------------------------------------------------------ enforce_eager
def test_enforce_eager_leaves_only_eager_and_serves_what_a_normal_engine_serves(_one_thread):
    ps = [greedy("all eager", max_new_tokens=8), sampled("all eager sampled", 3, max_new_tokens=9)]
    normal = Engine.from_config(config())
    try:
        want = [normal.synthesize(p, timeout=TIMEOUT) for p in ps]
    finally:
        normal.shutdown()
    eng = Engine.from_config(config(enforce_eager=True, mode="auto", modes=["eager", "default"]))
    try:
        modes = eng.modes()
        assert modes["eager"].state == "ready" and eng.default_mode is CompileMode.EAGER
        for m in ("default", "reduce-overhead", "default+cudagraph"):
            assert modes[m].state == "unavailable" and "enforce_eager" in modes[m].reason, m
            assert "enforce_eager" in eng.available_modes()[m]
            with pytest.raises(InputError, match=f"mode {re.escape(m)} is not available: .*enforce_eager"):
                eng.submit(dataclasses.replace(ps[0], mode=m))
        assert eng.snapshot().enforce_eager is True
        for p, w in zip(ps, want):
            same(eng.synthesize(p, timeout=TIMEOUT), w)
    finally:
        eng.shutdown()


def lone_scheduler(cfg: EngineConfig, runner_cls: type[Runner] = Runner, warmup: WarmupCoordinator | None = None
              ) -> tuple[Any, ModeScheduler, AudioStage]:
    """One eager scheduler outside an engine: (its model, its scheduler, the audio stage it feeds)."""
    model = load_model(cfg)
    stats = EngineStats()
    audio = AudioStage(model.device, stats)
    sched = ModeScheduler(runner_cls(model, cfg, CompileMode.EAGER), cfg, audio, stats, nullcontext,
                      lambda prep: model.streaming_decoder(cfg.initial_chunk_frames, cfg.chunk_frames,
                                                           prefix_codes=prep.decoder_prefix), warmup)
    return model, sched, audio


def queue_request(sched: ModeScheduler, model: Any, rid: int, p: SynthesisParams, prep: Any = None) -> RequestHandle:
    """Put `p` (prepared as `prep`, default: as the engine would) straight into the scheduler's queue."""
    h = RequestHandle(rid, p, RequestMetrics(rid, "eager", now(), sample_rate=model.sample_rate))
    sched.put(Request(h, prep if prep is not None else model.prepare(p, sched.runner.max_len)))
    return h


# ------------------------------------------------------------------------------------------ poisoned batch
def test_one_bad_request_admitted_with_seven_good_ones_fails_alone(_one_thread):
    """Eight prepared requests wait before the scheduler is warm, so one admission pass takes them all;
    one has prefill embeddings of the wrong width (no door check sees it). The batched prefill fails,
    the retry one by one fails only that request, with its own message; the seven get their solo output."""
    cfg = config(max_num_seqs=8)
    model, sched, audio = lone_scheduler(cfg)
    try:
        good = [greedy(f"good request {i}", max_new_tokens=6 + i) if i % 2 else
                sampled(f"good sampled {i}", 20 + i, max_new_tokens=6 + i) for i in range(7)]
        bad = greedy("the poisoned one", max_new_tokens=8)
        prep_bad = model.prepare(bad, cfg.max_seq_len)
        wide = torch.zeros(prep_bad.prompt_len, model.hidden_size + 3)
        prep_bad = dataclasses.replace(prep_bad, prefill=prep_bad.prefill._replace(embeds=wide))
        items = [(p, model.prepare(p, cfg.max_seq_len)) for p in good[:3]] + [(bad, prep_bad)]
        items += [(p, model.prepare(p, cfg.max_seq_len)) for p in good[3:]]
        handles = [queue_request(sched, model, rid, p, prep) for rid, (p, prep) in enumerate(items, 1)]
        assert sched.waiting.qsize() == 8 and not sched.active  # nothing admitted before the warm-up
        sched.warm(lambda s: None)
        h_bad = handles.pop(3)
        with pytest.raises(EngineError, match="could not start the request") as e:
            h_bad.result(TIMEOUT)
        assert "\n" not in str(e.value) and h_bad.metrics.status == "error"
        for p, h in zip(good, handles):
            r = h.result(TIMEOUT)
            assert r.metrics.status == "done" and r.metrics.error is None
            same(r, offline.synthesize(model, p))
    finally:
        sched.stop()
        audio.stop()


# ------------------------------------------------------------------------------------------ cancel
def test_cancel_mid_stream_raises_cancelled_whose_partial_codes_and_audio_agree(_one_thread):
    eng = Engine.from_config(config(max_seq_len=512, chunk_frames=2))
    try:
        p = greedy("a long request that gets cancelled", fixed_frames=300)
        h = eng.submit(p)
        stream = h.stream(timeout=TIMEOUT)
        seen = [next(stream), next(stream)]
        h.cancel()
        with pytest.raises(Cancelled):
            for chunk in stream:
                seen.append(chunk)
        with pytest.raises(Cancelled) as e:
            h.result(TIMEOUT)
        part = e.value.partial
        frames = part.codes.shape[0]
        assert 3 <= frames < 300 and part.codes.shape == (frames, 16)  # the two chunks seen hold 1 + 2 frames
        assert part.wav.size == frames * SPF == sum(c.samples.size for c in seen)
        assert part.metrics.status == "cancelled" and part.metrics.frames == frames
        np.testing.assert_array_equal(h.partial().codes, part.codes)
        full = offline.synthesize(eng.model, dataclasses.replace(p, fixed_frames=frames))
        same(part, full)  # the frames it kept are the request's first frames, their audio too
    finally:
        eng.shutdown()
