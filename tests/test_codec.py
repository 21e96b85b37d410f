"""Codec decoder: parity with the official goldens, exact streaming, strict weight loading."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from _fixtures import FIXTURES, fixture_dir  # noqa: E402

from omni_tts.errors import CheckpointError, InputError
from omni_tts.models.checkpoint import load_checkpoint, load_weights
from omni_tts.models.codec.decoder import CodecDecoder
from omni_tts.models.codec.streaming import StreamingDecoder, decode_plans

MODELS = ("custom_voice", "voice_design", "base")
STREAM_TOL = 1e-4


def _need_fixtures() -> None:
    fixture_dir("custom_voice")  # in the repo: a missing one fails, never skips


def _golden_cases() -> list[tuple[str, int]]:
    cases = []
    for model in ("custom_voice", "voice_design"):  # base: its ICL wav has the reference part cut
        file = FIXTURES / model / "golden" / "cases.json"
        cases += [(model, c["case"]) for c in json.loads(file.read_text())["cases"]]
    return cases


_DECODERS: dict[str, CodecDecoder] = {}


def decoder(model: str) -> CodecDecoder:
    _need_fixtures()
    if model not in _DECODERS:
        _DECODERS[model] = CodecDecoder.from_checkpoint(load_checkpoint(FIXTURES / model))
    return _DECODERS[model]


def random_codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (frames, 16), generator=torch.Generator().manual_seed(seed))


_LONG: dict[str, torch.Tensor] = {}


def long_case() -> tuple[torch.Tensor, torch.Tensor]:
    """200 random frames (> receptive field + chunk) and their one-shot decode, shared by several tests."""
    if not _LONG:
        _LONG["codes"] = random_codes(200, seed=200)
        _LONG["wav"] = decoder("custom_voice").decode(_LONG["codes"])
    return _LONG["codes"], _LONG["wav"]


def stream(dec: CodecDecoder, codes: torch.Tensor, initial: int, chunk: int, sizes: list[int] | None = None,
           grow: bool = False):
    """Push `codes` in pieces of `sizes` (default one frame at a time); return the emitted chunks."""
    sd = StreamingDecoder(dec, initial_chunk_frames=initial, chunk_frames=chunk, grow=grow)
    chunks, at = [], 0
    for n in sizes or [1] * codes.shape[0]:
        out = sd.push(codes[at: at + n])
        at += n
        if out is not None:
            chunks.append(out)
    tail = sd.flush()
    if tail is not None:
        chunks.append(tail)
    assert sd.flush() is None and sd.emitted_frames == codes.shape[0]
    return chunks


# ----------------------------------------------------------------------------- parity with goldens
@pytest.mark.parametrize("model", MODELS)
def test_codec_only_golden(model: str) -> None:
    dec = decoder(model)
    codes = torch.from_numpy(np.load(FIXTURES / model / "golden" / "codec_codes.npy"))
    want = np.load(FIXTURES / model / "golden" / "codec_wav.npy")
    got = dec.decode(codes)
    assert got.dtype == torch.float32 and got.shape == (codes.shape[0] * dec.decode_upsample_rate,)
    diff = float(np.abs(got.numpy() - want).max())
    print(f"{model} codec_codes -> codec_wav: max abs diff {diff:.3g}")
    assert diff < 1e-3


@pytest.mark.parametrize("model,case", _golden_cases())
def test_generated_codes_golden(model: str, case: int) -> None:
    dec = decoder(model) if case >= 0 else _need_fixtures()
    codes = torch.from_numpy(np.load(FIXTURES / model / "golden" / f"case{case}_codes.npy"))
    want = np.load(FIXTURES / model / "golden" / f"case{case}_wav.npy")
    got = dec.decode(codes).numpy()
    assert got.shape == want.shape
    diff = float(np.abs(got - want).max())
    print(f"{model} case{case}: max abs diff {diff:.3g}")
    assert diff < 1e-3


# ----------------------------------------------------------------------------- streaming
@pytest.mark.parametrize("frames,initial,chunk", [
    (200, 1, 25), (200, 2, 7), (61, 1, 7), (10, 2, 25), (1, 1, 25), (2, 2, 7), (24, 1, 25)])
def test_streaming_equals_one_shot(frames: int, initial: int, chunk: int) -> None:
    dec = decoder("custom_voice")
    codes, one_shot = long_case() if frames == 200 else (random_codes(frames, seed=frames), None)
    one_shot = dec.decode(codes) if one_shot is None else one_shot
    chunks = stream(dec, codes, initial, chunk)
    upf = dec.decode_upsample_rate
    want_sizes = [min(initial, frames)] + [chunk] * max(0, (frames - initial) // chunk)
    if sum(want_sizes) < frames:
        want_sizes.append(frames - sum(want_sizes))
    assert [len(c) // upf for c in chunks] == want_sizes
    assert all(c.dtype == np.float32 and len(c) % upf == 0 for c in chunks)
    diff = float(np.abs(np.concatenate(chunks) - one_shot.numpy()).max())
    assert diff <= STREAM_TOL, diff


@pytest.mark.parametrize("frames,initial,chunk,sizes", [
    (200, 1, 25, [1, 2, 4, 8, 16] + [25] * 6 + [19]), (61, 1, 7, [1, 2, 4, 7, 7, 7, 7, 7, 7, 7, 5]),
    (12, 3, 25, [3, 6, 3])])
def test_growing_chunks_double_up_to_chunk_frames_and_join_to_the_one_shot(frames: int, initial: int, chunk: int,
                                                                            sizes: list[int]) -> None:
    dec = decoder("custom_voice")
    codes, one_shot = long_case() if frames == 200 else (random_codes(frames, seed=frames), None)
    one_shot = dec.decode(codes) if one_shot is None else one_shot
    chunks = stream(dec, codes, initial, chunk, grow=True)
    assert [len(c) // dec.decode_upsample_rate for c in chunks] == sizes
    assert float(np.abs(np.concatenate(chunks) - one_shot.numpy()).max()) <= STREAM_TOL


def test_streaming_irregular_pushes() -> None:
    dec = decoder("voice_design")
    codes = random_codes(70, seed=7)
    sizes = [0, 3, 1, 30, 0, 2, 9, 24, 1]
    chunks = stream(dec, codes, initial=2, chunk=7, sizes=sizes)
    assert len(chunks[0]) == 3 * dec.decode_upsample_rate  # 3 frames were in when the first chunk was due
    diff = float(np.abs(np.concatenate(chunks) - dec.decode(codes).numpy()).max())
    assert diff <= STREAM_TOL, diff


def test_streaming_across_official_segments() -> None:
    """Long inputs: the official decode restarts every segment with a short context; streaming follows it."""
    _need_fixtures()
    dec = CodecDecoder.from_checkpoint(load_checkpoint(FIXTURES / "base"))
    dec.segment_frames, dec.segment_context = 40, 5  # the official 300/25 scheme, shrunk to stay fast
    codes = random_codes(100, seed=3)
    official = [dec.decode_window(codes[None, max(0, s - 5): s + 40], min(5, s))[0] for s in range(0, 100, 40)]
    one_shot = dec.decode(codes)
    assert float((torch.cat(official) - one_shot).abs().max()) <= 1e-6
    dec.segment_frames = None
    assert float((dec.decode(codes) - one_shot).abs().max()) > 1e-3  # 5 frames of context is not exact
    dec.segment_frames = 40
    for initial, chunk in ((1, 25), (2, 7)):
        diff = float(np.abs(np.concatenate(stream(dec, codes, initial, chunk)) - one_shot.numpy()).max())
        assert diff <= STREAM_TOL, diff


def test_no_right_edge_dependency() -> None:
    """Every sample of frame t is final once frame t is in: decoding a prefix gives the same samples."""
    dec = decoder("custom_voice")
    codes = random_codes(30, seed=11)
    full = dec.decode(codes)
    upf = dec.decode_upsample_rate
    for n in (1, 2, 13, 29):
        assert float((dec.decode(codes[:n]) - full[: n * upf]).abs().max()) <= 1e-6


def test_left_context_is_the_receptive_field() -> None:
    dec = decoder("custom_voice")
    dcfg = load_checkpoint(FIXTURES / "custom_voice").codec_config["decoder_config"]
    front = 2 + dcfg["num_hidden_layers"] * (dcfg["sliding_window"] - 1)  # pre-conv + stacked windows
    assert dec.receptive_field_frames == front + dec.vocoder_context_frames
    codes, full = long_case()
    codes = codes[None]  # codes: [1, 200, 16]
    upf, worst_72 = dec.decode_upsample_rate, 0.0
    for a in range(dec.receptive_field_frames, 200, 15):
        exact = dec.decode_window(codes[:, a - dec.receptive_field_frames: a + 9], dec.receptive_field_frames)[0]
        assert float((exact - full[a * upf: (a + 9) * upf]).abs().max()) <= 1e-6
        short = dec.decode_window(codes[:, a - 72: a + 9], 72)[0]
        worst_72 = max(worst_72, float((short - full[a * upf: (a + 9) * upf]).abs().max()))
    assert worst_72 > STREAM_TOL  # the attention window alone is not enough context for exact chunks

    d64 = CodecDecoder.from_checkpoint(load_checkpoint(FIXTURES / "custom_voice")).double()
    d64.segment_frames = None
    lat = d64._front(codes)  # float64 perturbations: bitwise-zero influence outside the computed reach
    for back, reaches in ((front, True), (front + 1, False)):
        moved = codes.clone()
        moved[0, 180 - back] = (moved[0, 180 - back] + 777) % 2048
        assert bool((d64._front(moved)[..., 180] != lat[..., 180]).any()) == reaches
    lat = lat[..., 150:185]  # frame 180 is now latent frame 30
    bumped = lat.clone()
    bumped[..., 30 - dec.vocoder_context_frames - 1] += 1.0
    assert torch.equal(d64._vocode(bumped)[:, 30 * upf:], d64._vocode(lat)[:, 30 * upf:])


def test_batched_window_rows_equal_their_single_decodes() -> None:
    """The codec is row-independent: rows with different histories, decoded together, equal each alone."""
    dec = decoder("custom_voice")
    ctx, n = dec.receptive_field_frames, 9
    rows = torch.stack([random_codes(ctx + n, seed=40 + i) for i in range(4)])  # rows: [4, C+N, 16]
    batched = dec.decode_window(rows, ctx)  # [4, N*upsample]
    assert batched.shape == (4, n * dec.decode_upsample_rate)
    for i in range(4):
        assert float((batched[i] - dec.decode_window(rows[i: i + 1], ctx)[0]).abs().max()) <= 1e-5


def _lockstep(decs: list[StreamingDecoder], codes: list[torch.Tensor]) -> tuple[list[list[np.ndarray]], int, int]:
    """Push one frame per decoder per step, decode each step's due plans (and the flushes) together."""
    chunks: list[list[np.ndarray]] = [[] for _ in decs]
    windows = calls = 0

    def run(plans: list) -> None:
        nonlocal windows, calls
        wavs, n = decode_plans([p for _, p in plans])
        windows, calls = windows + sum(len(p.pieces) for _, p in plans), calls + n
        for (i, plan), wav in zip(plans, wavs):
            chunks[i].append(plan.decoder.account(plan, wav))

    for t in range(max(c.shape[0] for c in codes)):
        run([(i, p) for i, (d, c) in enumerate(zip(decs, codes)) if t < c.shape[0]
             for p in [d.plan_push(c[t: t + 1])] if p is not None])
    run([(i, p) for i, d in enumerate(decs) for p in [d.plan_flush()] if p is not None])
    return chunks, windows, calls


@pytest.mark.parametrize("segments", [False, True])
def test_batched_chunks_of_several_decoders_equal_their_unbatched_chunks(segments: bool) -> None:
    """Different lengths, histories and voice-clone prefixes; with `segments`, chunks cross the official
    segment boundaries (shrunk to 40 frames / 5 of context) so plans have several windows."""
    dec = decoder("custom_voice")
    if segments:
        dec = CodecDecoder.from_checkpoint(load_checkpoint(FIXTURES / "custom_voice"))
        dec.segment_frames, dec.segment_context = 40, 5
    prefixes = [None, random_codes(10, seed=90), None, random_codes(150, seed=91), None]  # 150: capped context
    lengths = [60, 45, 60, 30, 12]
    codes = [random_codes(n, seed=80 + i) for i, n in enumerate(lengths)]

    def make(i: int) -> StreamingDecoder:
        return StreamingDecoder(dec, initial_chunk_frames=2, chunk_frames=7, prefix_codes=prefixes[i])

    batched, windows, calls = _lockstep([make(i) for i in range(5)], codes)
    assert calls < windows  # chunks of several decoders really shared decode calls
    upf = dec.decode_upsample_rate
    for i, c in enumerate(codes):
        alone = make(i)
        solo = [w for w in [*(alone.push(c[t: t + 1]) for t in range(c.shape[0])), alone.flush()] if w is not None]
        assert [len(w) for w in batched[i]] == [len(w) for w in solo]
        assert max(float(np.abs(b - s).max()) for b, s in zip(batched[i], solo)) <= 1e-5
        full = c if prefixes[i] is None else torch.cat([prefixes[i], c])
        one_shot = dec.decode(full)[(full.shape[0] - c.shape[0]) * upf:].numpy()
        assert float(np.abs(np.concatenate(batched[i]) - one_shot).max()) <= STREAM_TOL


def test_a_bad_row_fails_only_its_own_plan() -> None:
    dec = decoder("custom_voice")
    bad = random_codes(5, seed=5)
    bad[1, 3] = 4096  # outside the codebook
    decs = [StreamingDecoder(dec, 2, 7), StreamingDecoder(dec, 2, 7, prefix_codes=bad), StreamingDecoder(dec, 2, 7)]
    plans = [d.plan_push(random_codes(2, seed=i)) for i, d in enumerate(decs)]
    wavs, calls = decode_plans(plans)
    assert isinstance(wavs[1], InputError) and "outside the codebook" in str(wavs[1])
    for i in (0, 2):
        assert torch.is_tensor(wavs[i]) and wavs[i].shape == (2 * dec.decode_upsample_rate,)
        decs[i].account(plans[i], wavs[i])
    with pytest.raises(ValueError, match="out of order"):
        decs[0].account(plans[0], wavs[0])
    alone = StreamingDecoder(dec, 2, 7, prefix_codes=bad)
    with pytest.raises(InputError):  # the standalone path raises, and the frames stay owed
        alone.push(random_codes(2, seed=1))
    assert alone.emitted_frames == alone.planned_frames == alone.prefix_frames == 5 and alone.total_frames == 7


def test_batch_padding_and_dtype() -> None:
    dec = decoder("custom_voice")
    a, b = random_codes(30, seed=1), random_codes(18, seed=2)
    batch = torch.full((2, 30, 16), -1, dtype=torch.long)
    batch[0], batch[1, :18] = a, b
    upf = dec.decode_upsample_rate
    out = dec.decode(batch)
    assert out.shape == (2, 30 * upf)
    assert float((out[0] - dec.decode(a)).abs().max()) <= 1e-6
    assert float((out[1, : 18 * upf] - dec.decode(b)).abs().max()) <= 1e-6
    assert float(out[1, 18 * upf:].abs().max()) == 0.0
    with pytest.raises(InputError, match="outside the codebook"):
        dec.decode(torch.full((3, 16), 2048))
    with pytest.raises(ValueError, match="codes must be"):
        dec.decode(torch.zeros(3, 15, dtype=torch.long))
    half = CodecDecoder.from_checkpoint(load_checkpoint(FIXTURES / "custom_voice")).to(torch.bfloat16)
    got = half.decode(a[:4])
    assert got.dtype == torch.float32 and float((got - dec.decode(a[:4])).abs().max()) < 0.05


# ----------------------------------------------------------------------------- strict loading
def test_weight_errors_name_the_key(tmp_path: Path) -> None:
    _need_fixtures()
    ckpt = load_checkpoint(FIXTURES / "custom_voice")
    cfg, good = ckpt.codec_config, ckpt.codec_weights
    key = "decoder.pre_transformer.layers.1.mlp.up_proj.weight"
    with pytest.raises(CheckpointError, match=f"missing tensor '{key}'"):
        CodecDecoder.from_config(cfg, {k: v for k, v in good.items() if k != key})
    with pytest.raises(CheckpointError, match=f"tensor '{key}' has shape"):
        CodecDecoder.from_config(cfg, {**good, key: good[key][:, :-1]})
    with pytest.raises(CheckpointError, match="unexpected tensor 'decoder.decoder.9.conv.weight'"):
        CodecDecoder.from_config(cfg, {**good, "decoder.decoder.9.conv.weight": torch.zeros(1)})
    wider = {**cfg, "decoder_config": {**cfg["decoder_config"], "decoder_dim": 128}}
    with pytest.raises(CheckpointError, match=r"'decoder\.decoder\.0\.conv\.bias' has shape \(64,\), expected \(128"):
        CodecDecoder.from_config(wider, good)
    bad_rate = {**cfg, "decode_upsample_rate": 960}
    with pytest.raises(CheckpointError, match="decode_upsample_rate"):
        CodecDecoder.from_config(bad_rate, good)
    with pytest.raises(CheckpointError, match="model_type 'qwen3_tts_tokenizer_25hz'"):
        CodecDecoder.from_config({**cfg, "model_type": "qwen3_tts_tokenizer_25hz"}, good)
    no_dec = {k: v for k, v in cfg.items() if k != "decoder_config"}
    with pytest.raises(CheckpointError, match="decoder_config"):
        CodecDecoder.from_config(no_dec, good)

    corrupt = tmp_path / "speech_tokenizer"
    shutil.copytree(FIXTURES / "custom_voice" / "speech_tokenizer", corrupt)
    data = (corrupt / "model.safetensors").read_bytes()
    (corrupt / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        CodecDecoder.from_config(cfg, load_weights(corrupt))


def test_precisions() -> None:
    """tf32 is float32 off CUDA (same audio); bfloat16 decodes close to float32 and is one way; an unknown
    precision is refused."""
    _need_fixtures()
    dec = CodecDecoder.from_checkpoint(load_checkpoint(FIXTURES / "custom_voice"))
    codes = random_codes(30, seed=7)[None]  # [1, 30, 16]
    ref = dec.decode_window(codes, 5)
    assert torch.equal(dec.set_precision("tf32").decode_window(codes, 5), ref)
    low = dec.set_precision("bfloat16").decode_window(codes, 5)
    assert low.dtype == torch.float32 and low.shape == ref.shape
    assert 0 < float((low - ref).abs().max()) < 0.1 * float(ref.abs().max()) + 1e-3
    with pytest.raises(ValueError, match="cannot go back"):
        dec.set_precision("float32")
    with pytest.raises(ValueError, match="codec precision"):
        dec.set_precision("fp8")


@pytest.mark.skipif(not torch.cuda.is_available() and __import__("os").environ.get("OMNI_TTS_TEST_COMPILE") != "1",
                    reason="compiles the activation (slow on a CPU: a C++ build); set OMNI_TTS_TEST_COMPILE=1")
def test_fused_activations_decode_as_the_eager_ops() -> None:
    """set_fused(True) runs each SnakeBeta through one compiled function for any window and batch size;
    the audio equals the eager ops' to float rounding, and set_fused(False) is the eager path again."""
    from omni_tts.engine.audio_stage import fuse_codec

    _need_fixtures()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dec = CodecDecoder.from_checkpoint(load_checkpoint(FIXTURES / "custom_voice")).to(dev)
    windows = [(random_codes(30, seed=9)[None], 5), (torch.stack([random_codes(12, seed=s) for s in (1, 2, 3)]), 0)]
    refs = [dec.decode_window(c, ctx) for c, ctx in windows]
    assert fuse_codec(dec) == "" and dec.fused
    for (codes, ctx), ref in zip(windows, refs):
        got = dec.decode_window(codes, ctx)
        assert got.shape == ref.shape and float((got - ref).abs().max()) <= 1e-5
    # past dynamo's recompile limit a new size class runs as eager ops: same audio, no error
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=1):
        for (codes, ctx), ref in zip(windows, refs):  # 1 row (compiles), then 3 rows (over the limit)
            assert float((dec.decode_window(codes, ctx) - ref).abs().max()) <= 1e-5
    assert not dec.set_fused(False).fused
    assert torch.equal(dec.decode_window(*windows[0]), refs[0])
