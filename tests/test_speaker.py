"""Speaker encoder (x-vector) parity, mel front end, VoicePrompt persistence and create_voice_prompt."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
import torch
from _fixtures import FIXTURES, fixture_dir

from omni_tts.errors import CheckpointError, InputError
from omni_tts.models.checkpoint import load_checkpoint
from omni_tts.models.codec.encoder import CodecEncoder
from omni_tts.models.speaker import (
    SpeakerEncoder,
    VoicePrompt,
    create_voice_prompt,
    log_mel_spectrogram,
    slaney_mel_filterbank,
)

BASE = FIXTURES / "base"


@pytest.fixture(scope="module")
def ckpt():
    return load_checkpoint(fixture_dir("base"))


@pytest.fixture(scope="module")
def speaker(ckpt):
    return SpeakerEncoder.from_checkpoint(ckpt)


@pytest.fixture(scope="module")
def encoders(ckpt, speaker):
    return speaker, CodecEncoder.from_checkpoint(ckpt)


@pytest.fixture(scope="module")
def ref_audio() -> np.ndarray:
    return np.load(BASE / "golden_ref_audio.npy")


def test_xvector_matches_golden(speaker, ref_audio):
    want = np.load(BASE / "golden/ref_xvector.npy")
    got = speaker.embed(torch.from_numpy(ref_audio))
    assert got.shape == want.shape == (speaker.dim,)
    diff = float(np.abs(got.numpy() - want).max())
    assert diff <= 1e-4, f"x-vector max abs diff {diff}"


def test_mel_filterbank_matches_librosa_values():
    bank = slaney_mel_filterbank(24000, 1024, 128, 0.0, 12000.0)
    assert tuple(bank.shape) == (128, 513) and bank.dtype == torch.float32
    # Values of librosa.filters.mel(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000) (librosa 0.11).
    assert bank[5].nonzero().flatten().tolist() == [6, 7]
    assert torch.equal(bank[5, 6:8], torch.tensor([0.01212772075086832, 0.029991790652275085]))
    assert bank[60].nonzero().flatten().tolist() == [79, 80, 81, 82]
    assert torch.equal(bank[60, 79:83], torch.tensor([0.008432397618889809, 0.01747637428343296,
                                                      0.01268701907247305, 0.0038862258661538363]))
    assert [int(bank[i].argmax()) for i in (0, 40, 80, 127)] == [1, 47, 138, 498]
    assert abs(float(bank.double().sum()) - 5.459415810865721) < 1e-9


def test_log_mel_frames_and_tone_peak():
    t = torch.arange(24000, dtype=torch.float64) / 24000
    tone = (0.5 * torch.sin(2 * torch.pi * 3000 * t)).float()
    mel = log_mel_spectrogram(tone[None])  # [1, 128, frames]
    assert tuple(mel.shape) == (1, 128, 24000 // 256)
    centres = slaney_mel_filterbank(24000, 1024, 128, 0.0, 12000.0).argmax(dim=1) * 24000 / 1024
    loudest = int(mel[0, :, 10].argmax())
    assert abs(float(centres[loudest]) - 3000) < 150
    assert float(mel.min()) >= float(np.log(1e-5)) - 1e-6


def test_speaker_encoder_strict_loading(ckpt):
    weights = dict(ckpt.weights)
    del weights["speaker_encoder.fc.bias"]
    broken = type(ckpt)(**{**ckpt.__dict__, "weights": weights})
    with pytest.raises(CheckpointError, match=r"speaker_encoder\.fc\.bias"):
        SpeakerEncoder.from_checkpoint(broken)


def test_non_base_checkpoint_has_no_speaker_encoder():
    with pytest.raises(CheckpointError, match="Base checkpoint"):
        SpeakerEncoder.from_checkpoint(load_checkpoint(fixture_dir("custom_voice")))


def test_create_icl_prompt_from_file_matches_golden(encoders, ref_audio, tmp_path):
    wav = tmp_path / "ref.wav"
    sf.write(wav, ref_audio, 24000, subtype="FLOAT")
    prompt = create_voice_prompt(encoders, str(wav), ref_text="Hello there.")
    assert not prompt.x_vector_only and prompt.ref_text == "Hello there."
    assert np.array_equal(prompt.ref_codes.numpy(), np.load(BASE / "golden/ref_codes.npy"))
    assert np.abs(prompt.x_vector.numpy() - np.load(BASE / "golden/ref_xvector.npy")).max() <= 1e-4


def test_create_prompt_from_checkpoint_x_vector_only(ckpt, ref_audio):
    prompt = create_voice_prompt(ckpt, (ref_audio, 24000), x_vector_only=True)
    assert prompt.x_vector_only and prompt.ref_codes is None and prompt.ref_text is None
    assert np.abs(prompt.x_vector.numpy() - np.load(BASE / "golden/ref_xvector.npy")).max() <= 1e-4


def test_icl_needs_ref_text(encoders, ref_audio):
    for text in (None, "", "   "):
        with pytest.raises(InputError, match="ref_text"):
            create_voice_prompt(encoders, (ref_audio, 24000), ref_text=text)


def test_bad_audio_surfaces_as_input_error(encoders):
    with pytest.raises(InputError, match="silent"):
        create_voice_prompt(encoders, (np.zeros(48000, np.float32), 24000), x_vector_only=True)


@pytest.mark.parametrize("x_only", [False, True])
def test_voice_prompt_round_trip_is_bit_identical(tmp_path, x_only):
    rng = np.random.default_rng(7)
    xv = torch.from_numpy(rng.standard_normal(64).astype(np.float32))
    codes = None if x_only else torch.from_numpy(rng.integers(0, 2048, (25, 16)))
    text = "Ünïcode ref text — \"quoted\"\nline two" if not x_only else None
    prompt = VoicePrompt(ref_codes=codes, x_vector=xv, ref_text=text, x_vector_only=x_only)
    path = tmp_path / "voice.safetensors"
    prompt.save(path)
    back = VoicePrompt.load(path)
    assert back.x_vector_only == x_only and back.ref_text == text
    assert back.x_vector.dtype == xv.dtype and torch.equal(back.x_vector, xv)
    assert (back.ref_codes is None) if x_only else (back.ref_codes.dtype == torch.long
                                                   and torch.equal(back.ref_codes, codes))


def test_voice_prompt_load_rejects_other_files(tmp_path):
    from safetensors.torch import save_file

    text = tmp_path / "notes.txt"
    text.write_text("not a voice prompt")
    with pytest.raises(InputError, match="not a safetensors file"):
        VoicePrompt.load(text)
    with pytest.raises(InputError, match="file not found"):
        VoicePrompt.load(tmp_path / "absent.safetensors")
    plain = tmp_path / "weights.safetensors"
    save_file({"x_vector": torch.zeros(4)}, str(plain))
    with pytest.raises(InputError, match="format tag"):
        VoicePrompt.load(plain)
    future = tmp_path / "future.safetensors"
    save_file({"x_vector": torch.zeros(4)}, str(future),
              metadata={"format": "omni-tts-voice-prompt", "version": "99", "mode": "icl", "ref_text": "null"})
    with pytest.raises(InputError, match="unsupported version"):
        VoicePrompt.load(future)
    no_codes = tmp_path / "nocodes.safetensors"
    save_file({"x_vector": torch.ones(4)}, str(no_codes),
              metadata={"format": "omni-tts-voice-prompt", "version": "1", "mode": "icl", "ref_text": '"hi"'})
    with pytest.raises(InputError, match="ref_codes"):
        VoicePrompt.load(no_codes)


def test_voice_prompt_validates_fields():
    with pytest.raises(InputError, match="x_vector"):
        VoicePrompt(ref_codes=None, x_vector=torch.zeros(2, 2), x_vector_only=True)
    with pytest.raises(InputError, match="LongTensor"):
        VoicePrompt(ref_codes=torch.zeros(3, 16), x_vector=torch.zeros(4), ref_text="hi")


def _saved_prompt(tmp_path, x_vector: torch.Tensor, ref_text: str = "hi", frames: int = 5):
    """A voice file as `save` writes it, with any tensor values (save itself refuses none)."""
    from safetensors.torch import save_file

    path = tmp_path / "voice.safetensors"
    codes = torch.zeros(frames, 16, dtype=torch.long)
    save_file({"x_vector": x_vector, "ref_codes": codes}, str(path),
              metadata={"format": "omni-tts-voice-prompt", "version": "1", "mode": "icl",
                        "ref_text": json.dumps(ref_text)})
    return path


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_voice_file_with_a_non_finite_x_vector_is_refused(tmp_path, bad):
    xv = torch.ones(64)
    VoicePrompt.load(_saved_prompt(tmp_path, xv))  # the same file with finite values loads
    xv[17] = bad
    path = _saved_prompt(tmp_path, xv)
    with pytest.raises(InputError, match=f"voice prompt {path}: x_vector has NaN or infinite values"):
        VoicePrompt.load(path)
    with pytest.raises(InputError, match="x_vector has NaN or infinite values"):
        VoicePrompt(ref_codes=None, x_vector=xv, x_vector_only=True)


def test_a_voice_file_out_of_bounds_is_refused(tmp_path):
    with pytest.raises(InputError, match="ref_text has a character that is not valid Unicode"):
        VoicePrompt.load(_saved_prompt(tmp_path, torch.ones(64), ref_text="hi \ud800"))
    with pytest.raises(InputError, match="ref_text is too long"):
        VoicePrompt.load(_saved_prompt(tmp_path, torch.ones(64), ref_text="x" * 2001))
    with pytest.raises(InputError, match="5000 reference frames, more than 1024"):
        VoicePrompt.load(_saved_prompt(tmp_path, torch.ones(64), frames=5000))
    huge = tmp_path / "huge.safetensors"
    with open(huge, "wb") as f:
        f.truncate(17 * 2**20)  # sparse: nothing is written, the size alone is refused
    with pytest.raises(InputError, match="far larger than a voice prompt"):
        VoicePrompt.load(huge)
