"""Talker / code predictor / TTSModel: golden parity with the official implementation, cache semantics,
strict loading, sampling reproducibility. Uses the tiny fixture checkpoints (CPU, float32)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from _fixtures import FIXTURES, fixture_dir

from omni_tts.config import SynthesisParams
from omni_tts.engine import offline
from omni_tts.errors import CheckpointError, InputError
from omni_tts.models import sampling
from omni_tts.models.checkpoint import load_checkpoint
from omni_tts.models.qwen3_tts import TTSModel

_MODELS: dict[str, TTSModel] = {}



def model(name: str) -> TTSModel:
    if name not in _MODELS:
        _MODELS[name] = TTSModel.from_checkpoint(load_checkpoint(fixture_dir(name)))
    return _MODELS[name]



def golden_cases(name: str) -> list[tuple[str, dict]]:
    f = FIXTURES / name / "golden" / "cases.json"
    if not f.is_file():
        return [pytest.param(name, {}, marks=pytest.mark.skip(reason=f"fixtures not found at {FIXTURES}"))]
    return [(name, c) for c in json.loads(f.read_text())["cases"]]


def params_of(case: dict, **kw) -> SynthesisParams:
    """A golden case as a request: greedy talker and predictor, max_new_tokens 40, rest from the checkpoint."""
    p = SynthesisParams(text=case["text"], task=case["task"], speaker=case.get("speaker"),
                        language=case["language"], instruct=case.get("instruct"),
                        non_streaming_mode=case.get("non_streaming_mode"), do_sample=False,
                        subtalker_do_sample=False, max_new_tokens=40)
    return dataclasses.replace(p, **kw)


@pytest.mark.parametrize("name,case", golden_cases("custom_voice") + golden_cases("voice_design"))
def test_golden_codes_and_waveform(name: str, case: dict) -> None:
    m = model(name)
    gold = np.load(FIXTURES / name / "golden" / f"case{case['case']}_codes.npy")
    wav, codes = offline.synthesize(m, params_of(case))
    assert codes.shape == gold.shape == (case["frames"], 16)
    np.testing.assert_array_equal(codes.numpy(), gold)
    gold_wav = np.load(FIXTURES / name / "golden" / f"case{case['case']}_wav.npy")
    assert wav.dtype == np.float32 and wav.shape == gold_wav.shape == (case["samples"],)
    assert float(np.abs(wav - gold_wav).max()) < 1e-3


@pytest.mark.parametrize("name,case", golden_cases("base"))
def test_golden_voice_clone_from_reference_codes(name: str, case: dict) -> None:
    """Voice clone with the golden reference codes + x-vector (the encoders are tested elsewhere)."""
    speaker = pytest.importorskip("omni_tts.models.speaker")
    m, g = model(name), FIXTURES / name / "golden"
    ref = torch.from_numpy(np.load(g / "ref_codes.npy")).long()
    xvec = torch.from_numpy(np.load(g / "ref_xvector.npy")).float()
    only = case["x_vector_only_mode"]
    voice = speaker.VoicePrompt(ref_codes=None if only else ref, x_vector=xvec, ref_text=case["ref_text"],
                                x_vector_only=only)
    p = SynthesisParams(text=case["text"], task="voice_clone", language=case["language"], voice=voice,
                        do_sample=False, subtalker_do_sample=False, max_new_tokens=40)
    wav, codes = offline.synthesize(m, p)
    full = codes if only else torch.cat([ref, codes])
    np.testing.assert_array_equal(full.numpy(), np.load(g / f"case{case['case']}_codes.npy"))
    gold_wav = np.load(g / f"case{case['case']}_wav.npy")
    assert wav.shape == gold_wav.shape and float(np.abs(wav - gold_wav).max()) < 1e-3


def test_frame_count_follows_max_new_tokens_and_fixed_frames() -> None:
    m = model("custom_voice")
    case = golden_cases("custom_voice")[0][1]
    gold = np.load(FIXTURES / "custom_voice" / "golden" / "case0_codes.npy")
    short = offline.generate_codes(m, params_of(case, max_new_tokens=6))  # the official loop yields N - 1 frames
    np.testing.assert_array_equal(short.numpy(), gold[:5])
    fixed = offline.generate_codes(m, params_of(case, fixed_frames=7))
    assert fixed.shape == (7, 16) and int(fixed[:, 0].max()) < 2048
    with pytest.raises(InputError, match="max_new_tokens"):
        offline.generate_codes(m, params_of(case, max_new_tokens=1))


def test_sampling_is_reproducible_per_seed() -> None:
    m = model("custom_voice")
    p = SynthesisParams(text="the weather is nice today", speaker="ryan", max_new_tokens=12, seed=7)
    a_wav, a = offline.synthesize(m, p)
    b_wav, b = offline.synthesize(m, p)
    assert torch.equal(a, b) and np.array_equal(a_wav, b_wav)
    c = offline.generate_codes(m, dataclasses.replace(p, seed=8))
    assert a.shape != c.shape or (a != c).float().mean() > 0.5  # another seed: other codes
    assert int(a[:, 0].max()) < 2048 and int(a.min()) >= 0


def test_settings_merge_request_then_generation_config_then_defaults() -> None:
    m = model("custom_voice")  # generation_config.json: temperature 0.9, top_k 50, repetition_penalty 1.05
    s = m.resolve_settings(SynthesisParams(text="x", temperature=0.5, seed=3))
    assert (s.talker.temperature, s.talker.top_k, s.talker.repetition_penalty) == (0.5, 50, 1.05)
    assert not s.talker.greedy and not s.subtalker.greedy and s.max_frames == 8191 and s.seed == 3
    g = m.resolve_settings(SynthesisParams(text="x", greedy=True))
    assert g.talker.greedy and g.subtalker.greedy


def test_talker_cache_incremental_equals_full_and_slots() -> None:
    m = model("custom_voice")
    t = m.talker
    torch.manual_seed(0)
    x = torch.randn(1, 9, t.hidden_size)
    pos = torch.arange(9)[None]
    full = t(x, pos, t.new_cache(1, 16), None)  # [1, 9, D]
    cache = t.new_cache(3, 16)
    h0 = t(x[:, :5], pos[:, :5], cache, torch.tensor([2]))
    steps = [t(x[:, i:i + 1], pos[:, i:i + 1], cache, torch.tensor([2])) for i in range(5, 9)]
    inc = torch.cat([h0] + steps, dim=1)
    torch.testing.assert_close(inc, full, rtol=1e-5, atol=1e-5)
    # two rows in one batch (other slots, permuted), and the slots=None fast path over rows 0..B-1
    y = torch.randn(1, 9, t.hidden_size)
    both = t(torch.cat([y, x]), torch.cat([pos, pos]), t.new_cache(4, 16), torch.tensor([3, 1]))
    torch.testing.assert_close(both[1:], full, rtol=1e-5, atol=1e-5)
    fast = t(torch.cat([x, y]), torch.cat([pos, pos]), t.new_cache(4, 16), None)
    torch.testing.assert_close(fast[:1], full, rtol=1e-5, atol=1e-5)


def test_code_predictor_rows_independent_of_batch() -> None:
    m = model("custom_voice")
    torch.manual_seed(1)
    B = 4
    h = torch.randn(B, m.hidden_size)
    code0 = torch.tensor([5, 100, 2047, 7])
    rows = [sampling.RowSettings(greedy=True), sampling.RowSettings(greedy=False, temperature=0.9, top_k=50),
            sampling.RowSettings(greedy=False, temperature=1.0, top_p=0.9), sampling.RowSettings(greedy=True)]
    seed, frame = torch.tensor([1, 2, 3, 4]), torch.tensor([0, 3, 9, 1])
    codes, fb = m.code_predictor.predict_frame(h, code0, sampling.SlotParams.from_settings(rows), seed, frame)
    assert codes.shape == (B, 15) and fb.shape == (B, m.hidden_size)
    for i in range(B):
        one = m.code_predictor.predict(h[i:i + 1], code0[i:i + 1], sampling.SlotParams.from_settings([rows[i]]),
                                       seed[i:i + 1], frame[i:i + 1])
        assert one[0].tolist() == codes[i].tolist()
    full = torch.cat([code0[:, None], codes], dim=1)
    torch.testing.assert_close(m.frame_embedding(full), fb, rtol=1e-5, atol=1e-5)


def test_bfloat16_runs() -> None:
    m = TTSModel.from_checkpoint(load_checkpoint(fixture_dir("custom_voice")), dtype=torch.bfloat16)
    assert m.talker.rope.inv_freq.dtype == torch.float32 and m.talker.codec_head.weight.dtype == torch.bfloat16
    codes = offline.generate_codes(m, SynthesisParams(text="hello", speaker="ryan", greedy=True, fixed_frames=3))
    assert codes.shape == (3, 16) and int(codes.max()) < 2048


def test_bad_requests_against_the_checkpoint() -> None:
    m = model("custom_voice")
    with pytest.raises(InputError, match="cannot do task 'voice_design'"):
        m.prepare(SynthesisParams(text="hi", task="voice_design", instruct="calm"), 1024)
    with pytest.raises(InputError, match="unknown speaker"):
        m.prepare(SynthesisParams(text="hi", speaker="nobody"), 1024)
    with pytest.raises(InputError, match="text is empty"):
        m.prepare(SynthesisParams(text=""), 1024)
    with pytest.raises(InputError, match="voice prompt"):
        model("base").prepare(SynthesisParams(text="hi", task="voice_clone"), 1024)


def _with_weights(name: str, change) -> TTSModel:
    ck = load_checkpoint(fixture_dir(name))
    weights = dict(ck.weights)
    change(weights)
    return TTSModel.from_checkpoint(dataclasses.replace(ck, weights=weights))


def test_strict_loading_names_the_key() -> None:
    key = "talker.model.layers.1.mlp.up_proj.weight"
    with pytest.raises(CheckpointError, match=f"missing tensor '{key}'"):
        _with_weights("custom_voice", lambda w: w.pop(key))
    key2 = "talker.code_predictor.lm_head.3.weight"
    with pytest.raises(CheckpointError, match=f"missing tensor '{key2}'"):
        _with_weights("custom_voice", lambda w: w.pop(key2))
    with pytest.raises(CheckpointError, match="unexpected tensor 'talker.model.layers.9.mlp.up_proj.weight'"):
        _with_weights("custom_voice", lambda w: w.__setitem__("talker.model.layers.9.mlp.up_proj.weight", w[key]))
    with pytest.raises(CheckpointError, match="unexpected tensor 'talker.extra'"):
        _with_weights("custom_voice", lambda w: w.__setitem__("talker.extra", w[key]))
    with pytest.raises(CheckpointError, match="'talker.codec_head.weight' has shape"):
        _with_weights("custom_voice", lambda w: w.__setitem__("talker.codec_head.weight", torch.zeros(3, 3)))


def test_corrupt_safetensors(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    shutil.copytree(fixture_dir("custom_voice"), d, ignore=shutil.ignore_patterns("golden"))
    (d / "model.safetensors").write_bytes(b"\x00garbage" * 100)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(d)


def _embedding_calls(fn) -> int:
    """How many embedding lookups `fn()` makes (each a device call on a GPU)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += func is torch.ops.aten.embedding.default
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


@pytest.mark.parametrize("rows_max", [256, 1])
def test_shared_template_rows_equal_fresh_ones(monkeypatch: pytest.MonkeyPatch, rows_max: int) -> None:
    """The template rows kept across requests (special tokens, role, codec prefix per language and speaker)
    give bit for bit the prefill a fresh model computes, for any mix of voices, languages and text modes;
    the store stays bounded; a repeated request embeds only its own text."""
    import omni_tts.models.qwen3_tts as qm

    monkeypatch.setattr(qm, "SHARED_ROWS_MAX", rows_max)
    ck = load_checkpoint(fixture_dir("custom_voice"))
    kept = TTSModel.from_checkpoint(ck)
    reqs = [dict(speaker="ryan", language="English"), dict(speaker="vivian", language="Chinese"),
            dict(speaker="ryan", language="Auto", non_streaming_mode=False), dict(speaker="eric", language="English"),
            dict(speaker="ryan", language="English", text="Another sentence entirely.")]
    for kw in reqs + reqs:
        p = SynthesisParams(**{"text": "Hello there.", **kw}, greedy=True, fixed_frames=3)
        got, want = kept.build_prefill(p), TTSModel.from_checkpoint(ck).build_prefill(p)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), kw
        assert len(kept._shared) <= rows_max
    p = SynthesisParams(text="Hello there.", speaker="ryan", language="English", greedy=True, fixed_frames=3)
    calls = _embedding_calls(lambda: kept.build_prefill(p))
    assert calls == 1 if rows_max > 1 else calls > 1  # only the text; a full store recomputes the rest


def test_voice_design_instruct_rows_are_per_request() -> None:
    """Instructs are a request's own text: two voice descriptions give two different prefills, each equal
    to a fresh model's."""
    ck = load_checkpoint(fixture_dir("voice_design"))
    kept = TTSModel.from_checkpoint(ck)
    out = []
    for instruct in ("A deep, slow voice.", "A bright, quick voice.", "A deep, slow voice."):
        p = SynthesisParams(text="Hello.", task="voice_design", instruct=instruct, greedy=True, fixed_frames=3)
        got = kept.build_prefill(p)
        assert all(torch.equal(a, b) for a, b in zip(got, TTSModel.from_checkpoint(ck).build_prefill(p)))
        out.append(got.embeds)
    assert not torch.equal(out[0], out[1]) and torch.equal(out[0], out[2])
