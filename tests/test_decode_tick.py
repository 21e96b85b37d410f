"""The audio stage's decode tick (`experimental.decode_tick_frames`) on the real tiny codec (CPU, float32), no
mocks: full-length chunks that continue streams out of step wait until every stream holds one, or for the
tick, and then decode in one call; first chunks, growing chunks and a lone stream's never wait; a flush
decodes a stream's held chunks first, a cancel drops them and `drain` decodes them; the joined chunks still
equal the one-shot decode; an engine with the tick gives each concurrent request exactly its solo audio; a
tick out of range is refused."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from _engine import TIMEOUT, assert_same_as_plain, collect, make_engine, plain
from _fixtures import fixture_dir
from test_codec_streaming import STREAM_TOL, decoder, random_codes

from omni_tts.config import SynthesisParams, build_config
from omni_tts.engine.audio_stage import AudioStage
from omni_tts.engine.metrics import EngineStats, RequestMetrics
from omni_tts.engine.request import Request, RequestHandle
from omni_tts.errors import OmniTTSError
from omni_tts.models.codec.streaming import StreamingDecoder

SPF = 1920  # samples per frame


def _request(i: int, chunk: int = 4, grow: bool = False) -> Request:
    params = SynthesisParams(text="tick", speaker="ryan")
    handle = RequestHandle(i, params, RequestMetrics(request_id=i, mode="eager", accepted_at=0.0))
    return Request(handle, None, StreamingDecoder(decoder(), 1, chunk, grow=grow))


def _frames_heard(r: Request) -> list[int]:
    return [len(c) // SPF for c in r.handle._chunks]


def _feed(stage: AudioStage, rows: list[Request], starts: list[int], frames: int) -> list[tuple[list[int], int, int]]:
    """Push one frame a pass to every started row (row i from frame starts[i]), as the scheduler does;
    -> after each pass: (the frames each row has heard, the chunks held, the decode calls made so far)."""
    codes = {id(r): random_codes(frames, seed=i) for i, r in enumerate(rows)}
    out = []
    for f in range(frames):
        jobs = [("push", r, codes[id(r)][f - s: f - s + 1].numpy()) for r, s in zip(rows, starts) if s <= f]
        stage._run(jobs, frames=1, tick=False)
        out.append(([sum(_frames_heard(r)) for r in rows], len(stage._held), stage.stats.decode_calls))
    return out


def _stage(tick: int) -> AudioStage:
    return AudioStage(torch.device("cpu"), EngineStats(), tick_frames=tick)


def _joined(r: Request) -> np.ndarray:
    return np.concatenate(r.handle._chunks)


def test_streams_out_of_step_decode_their_chunks_together():
    """Four streams one frame apart, 4-frame chunks, the tick far off: each first chunk decodes at once; each
    continuing chunk waits until every stream holds one, then the four decode in one call. Without the tick
    the same chunks take a call each, and the audio is the same."""
    starts = [0, 1, 2, 3]
    held, alone = _stage(16), _stage(1)
    try:
        rows, rows1 = [_request(i) for i in range(4)], [_request(i) for i in range(4)]
        passes, passes1 = _feed(held, rows, starts, 12), _feed(alone, rows1, starts, 12)
        for f, (heard, _, _) in enumerate(passes):
            assert all(heard[j] >= 1 for j, s in enumerate(starts) if s <= f)  # the first chunk: never held
        assert passes[6][0] == [1, 1, 1, 1] and passes[6][1] == 3  # rows 0-2's chunks wait (due at frames 5-7)
        assert passes[7][0] == [5, 5, 5, 5] and passes[7][1] == 0 and passes[7][2] == passes[6][2] + 1
        assert passes[10][0] == [5, 5, 5, 5] and passes[11][0] == [9, 9, 9, 9]
        assert passes[11][2] == passes[10][2] + 1
        assert passes1[6][0] == [5, 5, 5, 1] and passes1[-1][0] == passes[-1][0]  # without: each when due
        assert passes[-1][2] < passes1[-1][2]
        for r, r1 in zip(rows, rows1):
            assert float(np.abs(_joined(r) - _joined(r1)).max()) <= STREAM_TOL
    finally:
        held.stop()
        alone.stop()


def test_a_held_chunk_waits_no_longer_than_the_tick():
    """A stream whose chunk is due while another stream's is not waits for the next tick (every 4 frames),
    not for the other stream."""
    stage = _stage(4)
    try:
        early, late = _request(0), _request(1, chunk=8)  # late's next chunk is due after frame 10
        passes = _feed(stage, [early, late], [0, 1], 10)
        assert passes[4][1] == passes[6][1] == 1 and passes[6][0] == [1, 1]  # due after frame 5: held
        assert passes[7][0] == [5, 1] and passes[7][1] == 0  # the tick after frame 8 decodes it alone
    finally:
        stage.stop()


def test_growing_chunks_and_lone_streams_never_wait():
    """With chunk growth (1, 2, 4, 8 frames) the growing chunks come out when due though another stream
    runs; the 8-frame ones wait for each other. A lone stream's chunks never wait (c = 1 pays nothing)."""
    stage = _stage(100)
    try:
        a, b = _request(0, chunk=8, grow=True), _request(1, chunk=8, grow=True)
        passes = _feed(stage, [a, b], [0, 1], 16)
        assert [p[0] for p in passes[:8]] == [[1, 0], [1, 1], [3, 1], [3, 3], [3, 3], [3, 3], [7, 3], [7, 7]]
        assert passes[14][0] == [7, 7] and passes[14][1] == 1  # a's 8-frame chunk waits for b's
        assert passes[15][0] == [15, 15] and _frames_heard(a) == [1, 2, 4, 8]
    finally:
        stage.stop()
    stage = _stage(100)
    try:
        assert [p[0][0] for p in _feed(stage, [_request(2)], [0], 9)] == [1, 1, 1, 1, 5, 5, 5, 5, 9]
    finally:
        stage.stop()


def test_a_flush_decodes_held_chunks_first_and_a_cancel_drops_them():
    """A stream that ends with a held chunk hears it before its last chunk, and the joined audio equals
    the one-shot decode; a cancelled one's held chunk is never decoded and its state is dropped."""
    stage = _stage(100)
    try:
        done, gone, other = _request(0), _request(1), _request(2)
        codes = random_codes(7, seed=3)
        _feed(stage, [done, gone, other], [0, 0, 2], 5)  # other's chunk is not due yet: theirs wait
        assert len(stage._held) == 2 and stage.live_states() == 3
        stage._run([("push", done, codes[5:7].numpy())], tick=False)  # two more frames: no chunk due
        calls = stage.stats.decode_calls
        stage._run([("flush", done), ("finish", done, "done", None), ("finish", gone, "cancelled", None)],
                   tick=False)
        assert _frames_heard(done) == [1, 4, 2] and _frames_heard(gone) == [1]
        assert stage.stats.decode_calls == calls + 2  # done's held chunk, then its last one: nothing of gone's
        assert not stage._held and stage.live_states() == 1
        assert gone.handle.metrics.status == "cancelled" and done.handle.metrics.status == "done"
        one_shot = decoder().decode(torch.cat([random_codes(5, seed=0), codes[5:7]])).numpy()
        assert float(np.abs(_joined(done) - one_shot).max()) <= STREAM_TOL
    finally:
        stage.stop()


def test_drain_decodes_every_held_chunk():
    """The thread's path: pushes queued one item a frame, then `drain` (before a capture) decodes the held
    chunk, though its tick is far off and the other stream's chunk is not due."""
    stage = _stage(100)
    try:
        r, s = _request(0), _request(1)
        codes = [random_codes(6, seed=4), random_codes(6, seed=5)]
        for f in range(6):
            stage.put([("push", x, c[f - s0:f - s0 + 1].numpy()) for x, c, s0 in zip((r, s), codes, (0, 3)) if f >= s0])
        stage.drain()
        assert _frames_heard(r) == [1, 4] and _frames_heard(s) == [1] and not stage._held
    finally:
        stage.stop()


def test_an_engine_with_the_tick_gives_concurrent_requests_their_solo_audio():
    """Requests that start at different frames, chunks held for the tick: each gets exactly the plain path's
    codes and audio, its chunks in order."""
    eng = make_engine(fixture_dir("custom_voice"), max_num_seqs=3, decode_tick_frames=3)
    try:
        assert eng._audio.tick_frames == 3
        ps = [SynthesisParams(text="tick tock", speaker="ryan", seed=40 + i, temperature=1.0, fixed_frames=14 + 3 * i)
              for i in range(3)]
        refs = [plain(eng, p) for p in ps]
        out: list = [None] * 3

        def client(i: int) -> None:
            h = eng.submit(ps[i])
            out[i] = (collect(h), h.result(TIMEOUT))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        for p, (chunks, res), ref in zip(ps, out, refs):
            assert_same_as_plain(eng, p, res.codes, res.wav)
            joined = np.concatenate([c.samples for c in chunks])
            assert joined.shape == ref[0].shape and float(np.abs(joined - ref[0]).max()) <= STREAM_TOL
            assert [c.index for c in chunks] == list(range(len(chunks))) and chunks[0].frames == 1
        assert eng.snapshot().active == 0
    finally:
        eng.shutdown()


@pytest.mark.parametrize("n", [0, 1001])
def test_a_tick_out_of_range_is_refused(n):
    with pytest.raises(OmniTTSError, match="decode_tick_frames must be 1..1000"):
        build_config({"experimental": {"decode_tick_frames": n}})
