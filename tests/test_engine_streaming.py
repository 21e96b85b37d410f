"""Streaming and admission on the real tiny checkpoint (CPU, float32), no mocks: streamed chunks join to
the one-shot decode for every chunk schedule, chunks of requests started together are decoded in shared
calls, a burst of requests waits only while it prepares and within the admission hold, a submit
refused while preparing holds nobody afterwards, and `max_preparing` bounds the submits preparing at once.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from _engine import (
    SPF,
    SR,
    TIMEOUT,
    assert_same_as_plain,
    collect,
    make_engine,
    plain,
    scheduler,
)
from _fixtures import fixture_dir
from test_warmup import until

from omni_tts.config import SynthesisParams
from omni_tts.errors import InputError


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
    sched = scheduler(eng)
    held: list[bool] = []  # each admission pass's verdict, spied, not replaced
    holds = sched._holds
    sched._holds = lambda: held.append(holds()) or held[-1]
    try:
        with pytest.raises(InputError, match="unknown speaker"):
            eng.submit(SynthesisParams(text="no such voice", speaker="nobody"))
        r = eng.synthesize(SynthesisParams(text="not held", speaker="ryan", fixed_frames=2), timeout=TIMEOUT)
        assert r.metrics.status == "done" and held and not any(held)
    finally:
        eng.shutdown()


def test_max_preparing_holds_a_submit_at_the_gate_until_a_preparation_ends():
    """experimental.max_preparing 1: while one submit prepares (the gate taken here, as its preparation
    would), the next has arrived (admission sees it) but waits at the gate, unprepared and not queued;
    once the gate is free it prepares, queues and is served."""
    eng = make_engine(fixture_dir("custom_voice"), max_num_seqs=2, max_preparing=1)
    sched, handles = scheduler(eng), []
    try:
        with eng._preparing:
            t = threading.Thread(target=lambda: handles.append(eng.submit(
                SynthesisParams(text="after the gate", speaker="ryan", fixed_frames=2))))
            t.start()
            # the semaphore's condition lists the threads blocked in acquire
            until(lambda: len(eng._preparing._cond._waiters) == 1, "the submit to wait at the gate")
            assert sched._arriving == 1 and sched.waiting.empty() and not handles
        t.join(TIMEOUT)
        assert handles and handles[0].result(TIMEOUT).metrics.status == "done"
    finally:
        eng.shutdown()
