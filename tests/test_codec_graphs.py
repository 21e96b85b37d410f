"""The codec's chunk graphs: the carried-chunk buffers' logic run eagerly on the CPU (states gathered into
padded row buckets and written back, a last chunk padded at its end, stale rows that never leak), the same
through `decode_plans` and the real engine, and on CUDA the captured graphs against the eager decode."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _fixtures import fixture_dir

from omni_tts.config import SynthesisParams, build_config
from omni_tts.engine.codec_graphs import CarriedChunkGraphs, ChunkGraphs, codec_buckets
from omni_tts.engine.engine import Engine
from omni_tts.models.checkpoint import load_checkpoint
from omni_tts.models.codec.decoder import CodecDecoder
from omni_tts.models.codec.streaming import (
    StreamingDecoder,
    StreamingDecoderState,
    chunk_lengths,
    decode_chunk,
    decode_plans,
)

STREAM_TOL = 1e-4  # streamed vs one-shot, float32 (as tests/test_codec_streaming.py)
TIMEOUT = 120.0
_CODEC: list[CodecDecoder] = []


def codec() -> CodecDecoder:
    if not _CODEC:
        _CODEC.append(CodecDecoder.from_checkpoint(load_checkpoint(fixture_dir("custom_voice"))))
    return _CODEC[0]


def codes_of(rows: int, frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (rows, frames, 16), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("max_rows,want", [(1, [1]), (3, [1, 2, 3]), (8, list(range(1, 9))),
                                           (13, [*range(1, 9), 10, 12, 13]),
                                           (64, [*range(1, 9), *range(10, 65, 2)])])
def test_codec_buckets_are_fine_at_many_rows(max_rows: int, want: list[int]) -> None:
    assert codec_buckets(max_rows) == want


@pytest.mark.parametrize("initial,chunk,grow,want", [(1, 25, False, [1, 25]), (1, 25, True, [1, 2, 4, 8, 16, 25]),
                                                     (3, 3, True, [3]), (2, 12, True, [2, 4, 8, 12])])
def test_chunk_lengths_are_every_length_the_schedule_takes(initial: int, chunk: int, grow: bool,
                                                           want: list[int]) -> None:
    assert chunk_lengths(initial, chunk, grow) == want


def test_carried_chunks_through_the_buffers_equal_the_one_shot_decode() -> None:
    """Streams continue through padded row buckets (3 rows in a 4-row bucket, then 2 rows over the stale
    third and fourth), each with its own history; every row's audio equals its one-shot decode."""
    dec = codec()
    graphs = CarriedChunkGraphs(dec, [2, 5], codec_buckets(4))
    streams = codes_of(3, 18, seed=1)
    states = [StreamingDecoderState() for _ in range(3)]
    decode_chunk(dec, streams[:, :1], states)  # first chunks, eagerly
    fast = ChunkGraphs(None, graphs)
    at, got = 1, [[] for _ in range(3)]
    for n, rows in ((5, 3), (2, 3), (5, 2), (5, 2)):
        wav = decode_chunk(dec, streams[:rows, at:at + n], states[:rows], fast)
        for i in range(rows):
            got[i].append(wav[i])
        at += n
    full = dec.decode(streams)
    upf = dec.decode_upsample_rate
    for i in range(3):
        end = at if i < 2 else 8
        stream = torch.cat(got[i]).numpy()
        assert float(np.abs(stream - full[i, upf:end * upf].numpy()).max()) <= STREAM_TOL
    assert all(len(s.carry) == len(graphs.keys) for s in states)
    assert graphs.replays == {(5, 5): 3, (2, 2): 1}  # every continuing chunk went through the buffers


def test_a_last_chunk_pads_to_a_graphed_length_and_drops_its_state() -> None:
    dec = codec()
    graphs = CarriedChunkGraphs(dec, [5], codec_buckets(2))
    streams = codes_of(2, 9, seed=2)
    states = [StreamingDecoderState() for _ in range(2)]
    decode_chunk(dec, streams[:, :5], states)
    assert graphs(dec, streams[:, 5:9], states, final=False) is None  # a 4-frame chunk that is not the last
    assert graphs(dec, codes_of(2, 6, seed=3), states, final=True) is None  # longer than every length
    wav, carry = graphs(dec, streams[:, 5:9], states, final=True)
    upf = dec.decode_upsample_rate
    assert carry == {} and wav.shape == (2, 4 * upf)
    assert float((wav - dec.decode(streams)[:, 5 * upf:]).abs().max()) <= STREAM_TOL
    assert graphs(dec, codes_of(3, 5, seed=4), [*states, states[0]], final=False) is None  # above the bucket
    assert graphs.replays == {(5, 4): 1}


def test_plans_decode_through_the_graphs_as_eagerly_and_a_final_flush_ends_the_stream() -> None:
    dec = codec()
    graphs = CarriedChunkGraphs(dec, chunk_lengths(1, 4, False), codec_buckets(4))
    codes = codes_of(2, 11, seed=5)
    out = []
    for fast in (None, ChunkGraphs(None, graphs)):
        decoders = [StreamingDecoder(dec, 1, 4) for _ in range(2)]
        audio: list[list[np.ndarray]] = [[], []]
        for t in range(11):
            plans = [p for p in (d.plan_push(codes[i, t:t + 1]) for i, d in enumerate(decoders)) if p is not None]
            for plan, wav in zip(plans, decode_plans(plans, fast)[0]):
                audio[decoders.index(plan.decoder)].append(plan.decoder.account(plan, wav))
        plans = [d.plan_flush(final=True) for d in decoders]
        assert all(p.pieces[-1].last for p in plans)
        for plan, wav in zip(plans, decode_plans(plans, fast)[0]):
            audio[decoders.index(plan.decoder)].append(plan.decoder.account(plan, wav))
        out.append([np.concatenate(a) for a in audio])
        with pytest.raises(ValueError, match="the stream has ended"):
            decoders[0].plan_push(codes[0, :1])
    assert graphs.replays == {(4, 4): 2, (4, 2): 1}  # both streams: chunks of 4, 4, then the last 2 padded
    full = dec.decode(codes).numpy()
    for eager, graphed, want in zip(out[0], out[1], full):
        assert float(np.abs(eager - want).max()) <= STREAM_TOL and float(np.abs(graphed - want).max()) <= STREAM_TOL


def test_the_engine_decodes_through_carried_chunk_graphs_as_eagerly(_one_thread) -> None:
    """The audio stage with the carried-chunk buffers installed (run eagerly: a CPU): concurrent requests'
    audio equals the audio without them, and the buffers were used."""
    cfg = {"model": str(fixture_dir("custom_voice")), "mode": "eager", "device": "cpu", "max_num_seqs": 3,
           "max_seq_len": 512, "initial_chunk_frames": 1, "chunk_frames": 4, "chunk_growth": False}
    eng = Engine.from_config(build_config(cfg))
    try:
        stage = eng._audio
        graphs = CarriedChunkGraphs(eng.model.codec, [1, 4], codec_buckets(3))
        params = [SynthesisParams(text=f"request {i}", speaker="ryan", greedy=True, fixed_frames=6 + 3 * i)
                  for i in range(3)]
        want = [eng.submit(p).result(TIMEOUT).wav for p in params]
        stage.carried = graphs
        got = [h.result(TIMEOUT).wav for h in [eng.submit(p) for p in params]]
        # chunks of 4; last chunks of 1 (6 frames: 1 + 4 + 1) and 3, padded (12 frames: 1 + 4 + 4 + 3)
        assert set(graphs.replays) == {(4, 4), (1, 1), (4, 3)}
        for g, w in zip(got, want):
            assert g.shape == w.shape and float(np.abs(g - w).max()) <= STREAM_TOL
        assert eng.snapshot().carried_chunk_graphs == "on" and stage.live_states() == 0
    finally:
        eng.shutdown()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_carried_chunk_graphs_equal_the_one_shot_decode_on_cuda() -> None:
    """Captured graphs: streams continue through two replays in a row (each row's state a copy the next
    replay does not overwrite), then a padded last chunk; the audio equals the one-shot decode (TF32)."""
    dec = CodecDecoder.from_checkpoint(load_checkpoint(fixture_dir("custom_voice"))).cuda().set_precision("tf32")
    graphs = CarriedChunkGraphs.captured(dec, [3], codec_buckets(4))
    assert sorted(graphs.graphs) == [3] and graphs.pool_bytes >= 0
    streams = codes_of(3, 11, seed=6)
    fast = ChunkGraphs(None, graphs)
    for rows in (3, 1):
        states = [StreamingDecoderState() for _ in range(rows)]
        parts = [decode_chunk(dec, streams[:rows, :3], states)]
        for at in (3, 6):
            parts.append(decode_chunk(dec, streams[:rows, at:at + 3], states, fast).clone())
        parts.append(decode_chunk(dec, streams[:rows, 9:11], states, fast, final=True).clone())
        want = dec.decode(streams[:rows]).cuda()
        assert float((torch.cat(parts, dim=1) - want).abs().max()) <= 1e-3
        assert not any(states)  # the padded last chunk dropped the states
    assert graphs.replays == {(3, 3): 4, (3, 2): 2}
