"""The audio stage's decode tick (`experimental.decode_tick_frames`) on the real tiny codec (CPU, float32), no
mocks: full-length chunks that continue their streams wait for the tick and streams whose chunks fell due
at different frames decode in one call, while first chunks and growing chunks never wait; a flush decodes a
stream's held chunks first and a cancel drops them; the joined chunks still equal the one-shot decode; an
engine with the tick gives each concurrent request exactly its solo audio; a tick out of range is refused."""

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


@pytest.fixture
def stage():
    s = AudioStage(torch.device("cpu"), EngineStats(), tick_frames=4)
    yield s
    s.stop()


def test_continuing_chunks_wait_for_the_tick_and_decode_in_one_call(stage):
    """Four streams one frame apart, 4-frame chunks, a tick every 4 frames: each first chunk decodes at once,
    each continuing chunk waits for the next tick and the four then decode in one call; without the tick
    the same chunks take a call each, and the audio is the same."""
    starts = [0, 1, 2, 3]
    rows = [_request(i) for i in range(4)]
    passes = _feed(stage, rows, starts, 12)
    for f, (heard, held, _) in enumerate(passes):
        assert all(heard[j] >= 1 for j, s in enumerate(starts) if s <= f)  # the first chunk: never held
        assert held == 0 or (f + 1) % 4  # nothing stays held past a tick (after frames 4, 8, 12)
    assert passes[6][0] == [1, 1, 1, 1] and passes[6][1] == 3  # rows 0-2's chunks wait (due at frames 5-7)
    assert passes[7][0] == [5, 5, 5, 5] and passes[7][2] == passes[6][2] + 1  # with row 3's, one call
    assert passes[10][0] == [5, 5, 5, 5] and passes[11][0] == [9, 9, 9, 9]
    assert passes[11][2] == passes[10][2] + 1

    alone = AudioStage(torch.device("cpu"), EngineStats(), tick_frames=1)
    try:
        rows1 = [_request(i) for i in range(4)]
        passes1 = _feed(alone, rows1, starts, 12)
        assert passes1[-1][0] == passes[-1][0] and passes1[7][2] == passes1[6][2] + 1  # one chunk due: one call
        assert passes[-1][2] < passes1[-1][2]
        for r, r1 in zip(rows, rows1):
            joined, joined1 = np.concatenate(r.handle._chunks), np.concatenate(r1.handle._chunks)
            assert joined.shape == joined1.shape and float(np.abs(joined - joined1).max()) <= STREAM_TOL
    finally:
        alone.stop()


def test_growing_chunks_never_wait(stage):
    """With chunk growth (1, 2, 4, 8 frames) only the full 8-frame chunk waits; the growing ones come out
    as soon as they are due."""
    r = _request(0, chunk=8, grow=True)
    passes = _feed(stage, [r], [0], 16)
    assert [p[0][0] for p in passes[:7]] == [1, 1, 3, 3, 3, 3, 7]  # 1, then 2, then 4 frames, when due
    assert passes[14][0] == [7] and passes[14][1] == 1  # the 8-frame chunk (due at frame 15) waits
    assert passes[15][0] == [15] and _frames_heard(r) == [1, 2, 4, 8]


def test_a_flush_decodes_held_chunks_first_and_a_cancel_drops_them(stage):
    """A stream that ends with a held chunk hears it before its last chunk, and the joined audio equals
    the one-shot decode; a cancelled one's held chunk is never decoded and its state is dropped."""
    done, gone = _request(0), _request(1)
    codes = random_codes(7, seed=3)
    _feed(stage, [done, gone], [0, 0], 5)
    assert len(stage._held) == 2 and stage.live_states() == 2
    stage._run([("push", done, codes[5:7].numpy())], tick=False)  # two more frames: no chunk due
    calls = stage.stats.decode_calls
    stage._run([("flush", done), ("finish", done, "done", None), ("finish", gone, "cancelled", None)], tick=False)
    assert _frames_heard(done) == [1, 4, 2] and _frames_heard(gone) == [1]
    assert stage.stats.decode_calls == calls + 2  # done's held chunk, then its last one: nothing of gone's
    assert not stage._held and stage.live_states() == 0
    assert gone.handle.metrics.status == "cancelled" and done.handle.metrics.status == "done"
    one_shot = decoder().decode(torch.cat([random_codes(5, seed=0), codes[5:7]])).numpy()
    assert float(np.abs(np.concatenate(done.handle._chunks) - one_shot).max()) <= STREAM_TOL


def test_drain_decodes_every_held_chunk():
    """The thread's path: pushes queued one item a frame, then `drain` (before a capture) decodes the held
    chunk, though its tick is far off."""
    stage = AudioStage(torch.device("cpu"), EngineStats(), tick_frames=100)
    try:
        r = _request(0)
        codes = random_codes(6, seed=4)
        for f in range(6):
            stage.put([("push", r, codes[f:f + 1].numpy())])
        stage.drain()
        assert _frames_heard(r) == [1, 4] and not stage._held
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
