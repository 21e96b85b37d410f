"""Base voice clone end to end: golden parity from the reference AUDIO (our encoders), saved voices,
the primed streaming decoder, the engine (streaming == plain, concurrent clones without cross-talk,
clones beside a CustomVoice engine in the same process, too-long ICL prompts); the CLI's clones are in
test_voice_clone_cli.py. Tiny Base (and CustomVoice) fixtures, CPU, float32."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch
from _fixtures import FIXTURES, fixture_dir

from omni_tts.config import EngineConfig, SynthesisParams
from omni_tts.engine import offline
from omni_tts.errors import InputError
from omni_tts.models.checkpoint import load_checkpoint
from omni_tts.models.qwen3_tts import TTSModel
from omni_tts.models.speaker import VoicePrompt
from omni_tts.models.voice_clone import reference_cut

BASE = FIXTURES / "base"
GOLDEN = BASE / "golden"
SR, UP = 24000, 1920  # output rate, samples per codec frame
REF_TEXT_B = "a second speaker talks here"



def golden_cases() -> list:
    f = GOLDEN / "cases.json"
    if not f.is_file():
        return [pytest.param({}, marks=pytest.mark.skip(reason=f"base fixture not found at {BASE}"))]
    return [pytest.param(c, id=f"case{c['case']}") for c in json.loads(f.read_text())["cases"]]



@pytest.fixture(scope="module")
def model() -> TTSModel:
    return TTSModel.from_checkpoint(load_checkpoint(fixture_dir("base")))


@pytest.fixture(scope="module")
def ref_audio() -> np.ndarray:
    return np.load(fixture_dir("base") / "golden_ref_audio.npy")  # [48000] float32 at 24 kHz


@pytest.fixture(scope="module")
def other_audio(ref_audio) -> np.ndarray:
    """A second, different reference clip (2.5 s: 32 reference frames instead of 25)."""
    return np.concatenate([ref_audio[::-1], 0.5 * ref_audio[:12000]]).astype(np.float32)


@pytest.fixture(scope="module")
def engine():
    from omni_tts.engine.engine import Engine

    eng = Engine.from_config(EngineConfig(model=str(fixture_dir("base")), device="cpu", max_num_seqs=4, max_seq_len=256,
                                          mode="eager", initial_chunk_frames=2, chunk_frames=5))
    yield eng
    eng.shutdown()


def clone_params(voice: VoicePrompt, text: str, language: str = "Auto", **kw) -> SynthesisParams:
    """A voice-clone request; greedy talker and predictor with 40 max_new_tokens unless overridden."""
    kw = {"do_sample": False, "subtalker_do_sample": False, "max_new_tokens": 40, **kw}
    return SynthesisParams(text=text, task="voice_clone", language=language, voice=voice, **kw)


# ----------------------------------------------------------------------------- plain path, golden parity
@pytest.mark.parametrize("case", golden_cases())
def test_golden_parity_from_reference_audio(model, ref_audio, case) -> None:
    voice = model.voice_prompt((ref_audio, SR), case["ref_text"], case["x_vector_only_mode"])
    p = clone_params(voice, case["text"], case["language"])
    assert model.build_prompt(p).non_streaming_mode is False  # the official default for voice clone
    wav, codes = offline.synthesize(model, p)
    full = codes if voice.x_vector_only else torch.cat([voice.ref_codes, codes])  # what the decoder got
    gold = np.load(GOLDEN / f"case{case['case']}_codes.npy")
    assert full.shape == gold.shape == (case["frames"], 16)
    np.testing.assert_array_equal(full.numpy(), gold)
    gold_wav = np.load(GOLDEN / f"case{case['case']}_wav.npy")
    assert wav.dtype == np.float32 and wav.shape == gold_wav.shape == (case["samples"],)
    diff = float(np.abs(wav - gold_wav).max())
    print(f"case{case['case']}: codes identical, waveform max abs diff {diff:.3g}")
    assert diff < 1e-3


def test_reference_cut_is_the_official_formula(model, ref_audio) -> None:
    assert reference_cut(25, 64, 64 * UP) == 25 * UP
    assert reference_cut(25, 97, 97 * UP) == 25 * UP - 1  # the double-precision division rounds down
    cuts = {reference_cut(25, 25 + g, (25 + g) * UP) - 25 * UP for g in range(1, 400)}
    assert cuts == {0, -1}
    # the plain path applies it: 25 reference + 72 generated frames keep one reference sample
    voice = model.voice_prompt((ref_audio, SR), "the reference words")
    wav, codes = offline.synthesize(model, clone_params(voice, "the weather is nice today", fixed_frames=72))
    full = model.decode(torch.cat([voice.ref_codes, codes]))
    assert codes.shape[0] == 72 and wav.shape == (72 * UP + 1,)
    np.testing.assert_array_equal(wav, full[25 * UP - 1:])


def test_saved_voice_reloads_identically(model, ref_audio, tmp_path) -> None:
    for only in (False, True):
        direct = model.voice_prompt((ref_audio, SR), "the reference words", x_vector_only=only)
        direct.save(tmp_path / "v.safetensors")
        loaded = VoicePrompt.load(tmp_path / "v.safetensors")
        assert loaded.x_vector_only == only and loaded.ref_text == "the reference words"
        assert torch.equal(loaded.x_vector, direct.x_vector)
        assert (loaded.ref_codes is None) == only and (only or torch.equal(loaded.ref_codes, direct.ref_codes))
        p = dict(text="saved voices sound the same", do_sample=True, subtalker_do_sample=True, seed=11,
                 max_new_tokens=16)
        a_wav, a = offline.synthesize(model, clone_params(direct, **p))
        b_wav, b = offline.synthesize(model, clone_params(loaded, **p))
        assert a.shape[0] > 0 and torch.equal(a, b) and np.array_equal(a_wav, b_wav)


def test_voice_prompt_errors(model, ref_audio) -> None:
    with pytest.raises(InputError, match="ref_text"):
        model.voice_prompt((ref_audio, SR), None)  # ICL without a transcript
    with pytest.raises(InputError, match="too short"):
        model.voice_prompt((ref_audio[:2000], SR), "x")
    good = model.voice_prompt((ref_audio, SR), "the reference words")
    with pytest.raises(InputError, match="voice prompt"):
        model.prepare(clone_params(None, "hi"), 1024)
    wide = VoicePrompt(torch.zeros(5, 8, dtype=torch.long), good.x_vector, "ref words")
    with pytest.raises(InputError, match=r"\[frames, 16\]"):
        model.prepare(clone_params(wide, "hi"), 1024)
    big = VoicePrompt(torch.full((5, 16), 5000, dtype=torch.long), good.x_vector, "ref words")
    with pytest.raises(InputError, match="outside the codebook"):
        model.prepare(clone_params(big, "hi"), 1024)
    short = VoicePrompt(None, good.x_vector[:10], x_vector_only=True)
    with pytest.raises(InputError, match="x-vector has 10 values"):
        model.prepare(clone_params(short, "hi"), 1024)
    cv = TTSModel.from_checkpoint(load_checkpoint(fixture_dir("custom_voice")))
    with pytest.raises(InputError, match="Base checkpoint"):
        cv.voice_prompt((ref_audio, SR), "the reference words")
    with pytest.raises(InputError, match="cannot do task 'voice_clone'"):
        cv.prepare(clone_params(good, "hi"), 1024)


# ----------------------------------------------------------------------------- streaming
def test_streaming_decoder_primed_with_reference_codes(model) -> None:
    full = torch.from_numpy(np.load(GOLDEN / "case0_codes.npy"))  # [64, 16]: 25 reference + 39 generated
    ref, gen = full[:25], full[25:]
    want = model.decode(full)[25 * UP:]
    sd = model.streaming_decoder(2, 5, prefix_codes=ref)
    assert sd.push(gen[:1]) is None  # the prefix does not count towards the first chunk
    chunks, at = [sd.push(gen[1:2])], 2
    for n in (3, 1, 7, 5, 4, 9, 6, 2):
        chunks.append(sd.push(gen[at: at + n]))
        at += n
    chunks.append(sd.flush())
    chunks = [c for c in chunks if c is not None]
    assert at == gen.shape[0] and len(chunks) == 6 and chunks[0].shape == (2 * UP,)
    joined = np.concatenate(chunks)
    assert joined.shape == want.shape and float(np.abs(joined - want).max()) < 1e-4
    cold = model.streaming_decoder(2, 5).push(gen)  # without the reference as left context the start differs
    assert cold.shape == want.shape and float(np.abs(cold[:UP] - want[:UP]).max()) > 1e-3


def _stream(engine, p: SynthesisParams) -> tuple[list[np.ndarray], np.ndarray]:
    h = engine.submit(p)
    chunks = [c.samples for c in h.stream(timeout=120)]
    return chunks, h.result(timeout=120).codes


def assert_stream_equals_plain(streamed: np.ndarray, plain: np.ndarray, p: SynthesisParams, frames: int,
                               what: str = "") -> None:
    """The engine's audio holds exactly the generated frames'; the plain (official) cut keeps one more
    leading sample when its division rounds down (see test_reference_cut_is_the_official_formula)."""
    R = 0 if p.voice.x_vector_only else p.voice.ref_codes.shape[0]
    extra = R * UP - reference_cut(R, R + frames, (R + frames) * UP)  # 0 or 1
    assert streamed.shape == (frames * UP,) and plain.shape == (frames * UP + extra,), what
    assert float(np.abs(streamed - plain[extra:]).max()) < 1e-4, what


def test_engine_streams_clone_equal_to_plain(engine, model, ref_audio) -> None:
    icl = engine.voice_prompt((ref_audio, SR), "the reference words")
    speaker_enc = engine.model._encoders._speaker
    xvec = engine.voice_prompt((ref_audio, SR), x_vector_only=True)
    assert engine.model._encoders._speaker is speaker_enc  # encoders are built once per model
    for p, extra in [(clone_params(icl, "the weather is nice today", "English"), 0),
                     (clone_params(xvec, "hello there, this is a test of the system."), 0),
                     (clone_params(icl, "the weather is nice today", fixed_frames=72), 1)]:
        chunks, codes = _stream(engine, p)
        wav, want_codes = offline.synthesize(model, p)
        np.testing.assert_array_equal(codes, want_codes.numpy())
        assert len(chunks) >= 3 and chunks[0].shape == (2 * UP,)
        assert_stream_equals_plain(np.concatenate(chunks), wav, p, codes.shape[0])
        assert wav.shape[0] == codes.shape[0] * UP + extra  # both cut cases are covered


def test_concurrent_clone_requests_have_no_cross_talk(engine, model, ref_audio, other_audio) -> None:
    voices = {"A-icl": engine.voice_prompt((ref_audio, SR), "the reference words"),
              "B-icl": engine.voice_prompt((other_audio, SR), REF_TEXT_B),
              "A-x": engine.voice_prompt((ref_audio, SR), x_vector_only=True),
              "B-x": engine.voice_prompt((other_audio, SR), REF_TEXT_B, x_vector_only=True)}
    assert voices["B-icl"].ref_codes.shape[0] == 32 != voices["A-icl"].ref_codes.shape[0]
    sampled = dict(do_sample=True, subtalker_do_sample=True, max_new_tokens=24)
    reqs = [clone_params(voices["A-icl"], "one two three", seed=1, **sampled),
            clone_params(voices["B-icl"], "one two three", seed=1, **sampled),
            clone_params(voices["A-x"], "the weather is nice today", seed=2, **sampled),
            clone_params(voices["B-x"], "the weather is nice today", seed=2, **sampled),
            clone_params(voices["A-icl"], "one two three", seed=3, **sampled),  # waits for a free slot
            clone_params(voices["B-icl"], "a greedy one among sampled ones", "English")]
    handles = [engine.submit(p) for p in reqs]  # all at once: 4 slots, two queue
    results = [h.result(timeout=180) for h in handles]
    alone = [offline.synthesize(model, p) for p in reqs]
    for i, (r, (wav, codes)) in enumerate(zip(results, alone)):
        np.testing.assert_array_equal(r.codes, codes.numpy(), err_msg=f"request {i}")
        assert_stream_equals_plain(r.wav, wav, reqs[i], codes.shape[0], f"request {i}")
    firsts = {tuple(r.codes[:8].ravel()) for r in results}
    assert len(firsts) == len(results)  # every request differs, so a mix-up would show


def _from_four_clients_at_once(clone_engine, cv_engine, clones, customs) -> dict:
    """Four threads, each submitting a clone and a CustomVoice request (alternating which goes first) and
    streaming both; 4 clones fill the Base engine's 4 slots, CustomVoice's 2 slots make two queue.
    -> {(kind, i): (streamed wav, codes)} for kind "clone" / "cv"."""
    start, got, errors = threading.Barrier(4), {}, []

    def client(i: int) -> None:
        try:
            start.wait(timeout=60)
            order = [("clone", i), ("cv", i)] if i % 2 == 0 else [("cv", i), ("clone", i)]
            handles = {k: (clone_engine if k[0] == "clone" else cv_engine).submit(
                (clones if k[0] == "clone" else customs)[i]) for k in order}
            for k, h in handles.items():
                chunks = [c.samples for c in h.stream(timeout=180)]
                r = h.result(timeout=180)
                got[k] = (np.concatenate(chunks) if chunks else np.zeros(0, np.float32), r.codes)
        except Exception as e:  # reported below: a thread's assertion would otherwise be lost
            errors.append(f"client {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and len(got) == 8, errors
    return got


def test_clone_engine_and_custom_voice_engine_run_at_once_without_cross_talk(engine, model, ref_audio,
                                                                           other_audio) -> None:
    """One checkpoint is Base or CustomVoice, so a deployment serving both runs two engines in one process:
    requests submitted interleaved from several threads to both at once each get exactly their solo output."""
    from omni_tts.engine.engine import Engine

    cv = Engine.from_config(EngineConfig(model=str(fixture_dir("custom_voice")), device="cpu", max_num_seqs=2,
                                         max_seq_len=256, mode="eager", initial_chunk_frames=1, chunk_frames=4))
    try:
        voices = [engine.voice_prompt((ref_audio, SR), "the reference words"),
                  engine.voice_prompt((other_audio, SR), REF_TEXT_B),
                  engine.voice_prompt((ref_audio, SR), x_vector_only=True),
                  engine.voice_prompt((other_audio, SR), REF_TEXT_B, x_vector_only=True)]
        sampled = dict(do_sample=True, subtalker_do_sample=True, max_new_tokens=20)
        clones = [clone_params(v, text, seed=seed, **sampled) for v, text, seed in
                  zip(voices, ["one two three", "one two three", "the weather is nice today", "good morning"],
                      [1, 2, 3, 4])]
        customs = [SynthesisParams(text=text, speaker=spk, language="English", seed=seed, **sampled)
                   for text, spk, seed in zip(["one two three", "one two three", "the weather is nice today",
                                               "good morning"], ["ryan", "vivian", "dylan", "eric"], [1, 5, 6, 7])]
        # alone first, on the plain single-request path (both engines idle)
        alone = {("clone", i): offline.synthesize(model, p) for i, p in enumerate(clones)}
        alone.update({("cv", i): offline.synthesize(cv.model, p) for i, p in enumerate(customs)})

        got = _from_four_clients_at_once(engine, cv, clones, customs)
        for (kind, i), (wav, codes) in got.items():
            want_wav, want_codes = alone[(kind, i)]
            what = f"{kind} request {i}"
            assert codes.shape[0] > 0, what
            np.testing.assert_array_equal(codes, want_codes.numpy(), err_msg=what)
            if kind == "clone":
                assert_stream_equals_plain(wav, want_wav, clones[i], codes.shape[0], what)
            else:
                assert wav.shape == want_wav.shape == (codes.shape[0] * UP,), what
                assert float(np.abs(wav - want_wav).max()) < 1e-4, what
        firsts = {tuple(codes[:8].ravel()) for _, codes in got.values()}
        assert len(firsts) == len(got)  # all eight differ, so a mix-up would show
    finally:
        cv.shutdown()


def test_icl_prompt_too_long_names_the_reference_audio(engine, model, ref_audio) -> None:
    """The tiny ICL prompt is 34 rows (25 reference frames) whatever the short text; an x-vector prompt is 9."""
    from omni_tts.engine.engine import Engine

    small = Engine.from_config(EngineConfig(model=str(fixture_dir("base")), device="cpu", max_num_seqs=2,
                                            max_seq_len=34,
                                            mode="eager"))
    try:
        icl = engine.voice_prompt((ref_audio, SR), "the reference words")
        xvec = engine.voice_prompt((ref_audio, SR), x_vector_only=True)
        ok = clone_params(xvec, "hi", max_new_tokens=25)  # 9 + 24 frames + 1 fits exactly
        h_ok = small.submit(ok)
        waiting = small.snapshot().waiting
        with pytest.raises(InputError) as e:  # refused at submit, where the prompt is built
            small.submit(clone_params(icl, "hi"))
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("text + reference audio is too long for this engine"), msg
        assert "prompt 34 tokens incl. 25 reference frames" in msg and "max_seq_len 34" in msg, msg
        assert small.snapshot().waiting <= waiting  # nothing was queued for it
        r = h_ok.result(timeout=120)  # the other request in the engine is unaffected
        np.testing.assert_array_equal(r.codes, offline.synthesize(model, ok)[1].numpy())
        # without reference audio in the prompt the message stays about the text alone
        long_text = clone_params(xvec, "this text is far too long for a small cache of positions",
                                 non_streaming_mode=True)
        with pytest.raises(InputError) as e:
            small.synthesize(long_text, timeout=120)
        msg = str(e.value)
        assert msg.startswith("text is too long for this engine (prompt 62 tokens, max_seq_len 34)"), msg
        assert "reference" not in msg and "\n" not in msg
    finally:
        small.shutdown()
