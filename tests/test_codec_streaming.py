"""Codec streaming with carried state: every frame decoded once, the chunks equal to the one-shot decode
(and the official goldens) for any chunk schedule and any mix of streams in a batch; the audio stage drops
a request's state when it completes or is cancelled."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _fixtures import FIXTURES, fixture_dir

from omni_tts.config import SynthesisParams, build_config
from omni_tts.engine.engine import Engine
from omni_tts.errors import Cancelled, InputError
from omni_tts.models.checkpoint import load_checkpoint
from omni_tts.models.codec.costs import chunk_costs
from omni_tts.models.codec.decoder import CodecDecoder
from omni_tts.models.codec.layers import CausalConv1d, CausalUpConv1d
from omni_tts.models.codec.streaming import StreamingDecoder, StreamingDecoderState, decode_chunk, decode_plans
from omni_tts.models.codec.transformer import WindowAttention, WindowTransformer

STREAM_TOL = 1e-4  # streamed vs one-shot, float32 (as tests/test_codec.py)
GOLDEN_TOL = 1e-3  # vs the official decode's waveforms (as tests/test_codec.py)
SCHEDULES = {"1": [1], "2": [2], "4": [4], "8": [8], "16": [16], "25": [25],
             "growth": [1, 2, 4, 8, 16, 25]}  # the last size repeats
TIMEOUT = 120.0

_DECODERS: dict[str, CodecDecoder] = {}


def decoder(model: str = "custom_voice") -> CodecDecoder:
    if model not in _DECODERS:
        _DECODERS[model] = CodecDecoder.from_checkpoint(load_checkpoint(fixture_dir(model)))
    return _DECODERS[model]


def random_codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (frames, 16), generator=torch.Generator().manual_seed(seed))


def sizes(schedule: list[int], frames: int) -> list[int]:
    """Chunk sizes of `schedule` (its last size repeated) covering `frames`."""
    out: list[int] = []
    while sum(out) < frames:
        out.append(min(schedule[min(len(out), len(schedule) - 1)], frames - sum(out)))
    return out


def stream_chunks(dec: CodecDecoder, codes: torch.Tensor, schedule: list[int]) -> list[torch.Tensor]:
    """codes [T, Q] decoded chunk by chunk through one carried state."""
    state, out, at = StreamingDecoderState(), [], 0
    for n in sizes(schedule, codes.shape[0]):
        out.append(decode_chunk(dec, codes[None, at: at + n], [state])[0])
        at += n
    return out


def _golden_cases() -> list[tuple[str, str]]:
    out = [(m, "codec") for m in ("custom_voice", "voice_design", "base")]
    for m in ("custom_voice", "voice_design"):  # base: its ICL wav has the reference part cut
        cases = json.loads((FIXTURES / m / "golden" / "cases.json").read_text())["cases"]
        out += [(m, f"case{c['case']}") for c in cases]
    return out


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("model,case", _golden_cases())
def test_streamed_golden_codes_equal_the_official_waveform(model: str, case: str, schedule: str) -> None:
    dec = decoder(model)
    golden = FIXTURES / model / "golden"
    codes = torch.from_numpy(np.load(golden / f"{case}_codes.npy"))
    chunks = stream_chunks(dec, codes, SCHEDULES[schedule])
    assert [c.shape[0] for c in chunks] == [n * dec.decode_upsample_rate for n in sizes(SCHEDULES[schedule],
                                                                                         codes.shape[0])]
    joined = torch.cat(chunks)
    assert joined.dtype == torch.float32
    assert float((joined - dec.decode(codes)).abs().max()) <= STREAM_TOL
    assert float(np.abs(joined.numpy() - np.load(golden / f"{case}_wav.npy")).max()) <= GOLDEN_TOL


_LONG: dict[str, torch.Tensor] = {}


def long_case() -> tuple[torch.Tensor, torch.Tensor]:
    """200 random frames: past the attention window (72) and the receptive field (154 here)."""
    if not _LONG:
        _LONG["codes"] = random_codes(200, seed=200)
        _LONG["wav"] = decoder().decode(_LONG["codes"])
    return _LONG["codes"], _LONG["wav"]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_long_stream_equals_the_one_shot_decode_for_every_schedule(schedule: str) -> None:
    codes, one_shot = long_case()
    joined = torch.cat(stream_chunks(decoder(), codes, SCHEDULES[schedule]))
    assert joined.shape == one_shot.shape and float((joined - one_shot).abs().max()) <= STREAM_TOL


def test_the_carry_holds_every_layer_that_reads_the_past_and_nothing_else() -> None:
    """One entry per conv with a reach, per transposed conv whose kernel overlaps, per attention layer
    (its last window - 1 keys and values) and the transformer's position; pointwise layers carry nothing."""
    dec = decoder()
    state = StreamingDecoderState()
    decode_chunk(dec, random_codes(5, seed=1)[None], [state])
    want = {m for m in dec.modules() if isinstance(m, (CausalConv1d, CausalUpConv1d)) and m.reach}
    want |= {m for m in dec.modules() if isinstance(m, (WindowAttention, WindowTransformer))}
    assert set(state.carry) == want
    window = dec.sliding_window - 1
    for m, t in state.carry.items():
        if isinstance(m, WindowAttention):
            assert t.shape == (1, 2 * m.kv_heads, window, m.head_dim)
        elif isinstance(m, WindowTransformer):
            assert t.tolist() == [5]
        else:
            assert t.shape[0] == 1 and t.shape[-1] == m.reach


@pytest.mark.parametrize("stride", [3, 8])
def test_the_gemm_form_of_a_transposed_conv_equals_the_conv(stride: int) -> None:
    """A K = 2s transposed conv as one GEMM + overlap-add equals F.conv_transpose1d's causal samples, in
    one pass and in pieces through one carry, with and without its bias (pending leaves it out)."""
    torch.manual_seed(stride)
    conv = CausalUpConv1d(6, 5, 2 * stride, stride).double()
    x = torch.randn(2, 6, 11, dtype=torch.float64)
    want = F.conv_transpose1d(x, conv.conv.weight, conv.conv.bias, stride)[..., : 11 * stride]
    conv.gemm = True
    assert float((conv(x) - want).abs().max()) < 1e-12
    bias = conv.conv.bias[:, None]
    carry: dict = {}
    pieces = [conv.pending(x[..., a:b], carry).raw + bias for a, b in ((0, 1), (1, 5), (5, 11))]
    assert float((torch.cat(pieces, dim=-1) - want).abs().max()) < 1e-12


def test_a_batch_of_streams_at_different_offsets_equals_each_alone() -> None:
    """Rows with different histories (one starting now) decode in one call; each row equals its stream's
    one-shot decode, and the states go on to further shared calls."""
    dec = decoder()
    upf = dec.decode_upsample_rate
    streams = [random_codes(140, seed=60 + i) for i in range(4)]
    offsets = [0, 3, 77, 101]  # frames each has decoded before the shared calls
    states = [StreamingDecoderState() for _ in streams]
    for codes, off, state in zip(streams, offsets, states):
        if off:
            decode_chunk(dec, codes[None, :off], [state])
    for step, n in enumerate([1, 7, 25]):
        at = [off + sum([1, 7, 25][:step]) for off in offsets]
        wav = decode_chunk(dec, torch.stack([c[a: a + n] for c, a in zip(streams, at)]), states)
        assert wav.shape == (4, n * upf)
        for i, (codes, a) in enumerate(zip(streams, at)):
            want = dec.decode(codes[: a + n])[a * upf:]
            assert float((wav[i] - want).abs().max()) <= STREAM_TOL, (i, step)


def test_a_failing_batch_leaves_every_state_as_it_was() -> None:
    dec = decoder()
    states = [StreamingDecoderState() for _ in range(2)]
    decode_chunk(dec, torch.stack([random_codes(4, seed=s) for s in (1, 2)]), states)
    before = [dict(s.carry) for s in states]
    bad = torch.stack([random_codes(3, seed=3), random_codes(3, seed=4)])
    bad[1, 0, 0] = 4096
    with pytest.raises(InputError, match="outside the codebook"):
        decode_chunk(dec, bad, states)
    assert all(s.carry == b for s, b in zip(states, before))


def test_several_chunks_of_one_stream_in_one_call_decode_in_order() -> None:
    """A stage that fell behind plans two chunks of a request before decoding either: they share the
    call, in order, with other streams' chunks."""
    dec = decoder()
    a, b = StreamingDecoder(dec, 2, 5), StreamingDecoder(dec, 2, 5, prefix_codes=random_codes(9, seed=9))
    ca, cb = random_codes(12, seed=10), random_codes(7, seed=11)
    plans = [a.plan_push(ca[:2]), a.plan_push(ca[2:7]), b.plan_push(cb[:2]), a.plan_push(ca[7:12]),
             b.plan_push(cb[2:7])]
    wavs, calls = decode_plans(plans)
    assert calls < sum(len(p.pieces) for p in plans)  # rounds shared calls across the two streams
    out = {id(a): [], id(b): []}
    for plan, wav in zip(plans, wavs):
        out[id(plan.decoder)].append(plan.decoder.account(plan, wav))
    upf = dec.decode_upsample_rate
    assert float(np.abs(np.concatenate(out[id(a)]) - dec.decode(ca).numpy()).max()) <= STREAM_TOL
    full_b = torch.cat([random_codes(9, seed=9), cb])
    assert float(np.abs(np.concatenate(out[id(b)]) - dec.decode(full_b)[9 * upf:].numpy()).max()) <= STREAM_TOL


@pytest.mark.parametrize("prefix", [0, 20, 130])
def test_chunks_across_official_segments_restart_where_the_one_shot_does(prefix: int) -> None:
    """Segments shrunk to 40 frames with 5 of context: a chunk crossing a boundary restarts the state
    there and primes it with the context frames; a voice-clone prefix primes the first chunk."""
    dec = CodecDecoder.from_checkpoint(load_checkpoint(fixture_dir("base")))
    dec.segment_frames, dec.segment_context = 40, 5
    pre = random_codes(prefix, seed=5) if prefix else None
    codes = random_codes(110, seed=6)
    full = codes if pre is None else torch.cat([pre, codes])
    want = dec.decode(full)[prefix * dec.decode_upsample_rate:].numpy()
    for schedule in (SCHEDULES["growth"], [7]):
        sd = StreamingDecoder(dec, schedule[0], schedule[-1], prefix_codes=pre, grow=len(schedule) > 1)
        chunks = [w for w in [*(sd.push(codes[t: t + 1]) for t in range(110)), sd.flush()] if w is not None]
        assert float(np.abs(np.concatenate(chunks) - want).max()) <= STREAM_TOL


def test_a_cancelled_request_frees_its_decoder_state(_one_thread) -> None:
    """The real engine on the tiny fixture: a streaming request holds its decoder state in the audio
    stage until it is cancelled mid-stream; then none is held, as after a request that finished."""
    cfg = {"model": str(fixture_dir("custom_voice")), "mode": "eager", "device": "cpu", "max_num_seqs": 2,
           "max_seq_len": 512, "initial_chunk_frames": 1, "chunk_frames": 3}
    eng = Engine.from_config(build_config(cfg))
    try:
        stage = eng._audio
        done = eng.submit(SynthesisParams(text="short one", speaker="ryan", greedy=True, max_new_tokens=5))
        done.result(TIMEOUT)
        assert stage.live_states() == 0
        h = eng.submit(SynthesisParams(text="this one gets cancelled", speaker="eric", greedy=True,
                                       fixed_frames=300))
        chunks = h.stream(timeout=TIMEOUT)
        first = next(chunks)  # decoded: its state is held until the request ends
        assert first.index == 0 and stage.live_states() == 1
        h.cancel()
        with pytest.raises(Cancelled):
            for _ in chunks:
                pass
        assert h.metrics.status == "cancelled" and h.metrics.frames < 300
        assert stage.live_states() == 0  # dropped before the handle completed
    finally:
        eng.shutdown()



def test_chunk_costs_scale_with_rows_and_count_at_least_the_transformer_matmuls() -> None:
    cfg = load_checkpoint(fixture_dir("custom_voice")).codec_config
    dec = decoder()
    one, two = chunk_costs(cfg, 1, 8, torch.float32), chunk_costs(cfg, 2, 8, torch.float32)
    assert two.flops == 2 * one.flops
    assert one.weight_bytes == two.weight_bytes == sum(4 * p.numel() for p in dec.parameters())
    linear = sum(m.weight.numel() for m in dec.pre_transformer.modules() if isinstance(m, torch.nn.Linear))
    assert one.flops > 2 * linear * 8  # 2 FLOPs per weight per frame in the transformer alone
    assert two.bytes_moved > one.bytes_moved > one.weight_bytes
    assert one.per_frame()["flops"] == one.flops / 8
