"""Reference-audio loading: validation messages, mono mixing, band-limited resampling to 24 kHz."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from omni_tts.errors import InputError
from omni_tts.models.audio import AudioLimits, load_reference_audio, resample


def tone(freq: float, sr: int, seconds: float, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(round(sr * seconds))) / sr
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_hz(wav: np.ndarray, sr: int) -> float:
    spec = np.abs(np.fft.rfft(wav * np.hanning(wav.size)))
    return float(np.argmax(spec) * sr / wav.size)


def test_24k_float_file_passes_through_bit_exact(tmp_path):
    x = tone(440, 24000, 1.5)
    sf.write(tmp_path / "a.wav", x, 24000, subtype="FLOAT")
    got = load_reference_audio(tmp_path / "a.wav")
    assert got.dtype == torch.float32 and torch.equal(got, torch.from_numpy(x))


@pytest.mark.parametrize("sr", [16000, 44100, 22050, 48000])
def test_other_rates_are_resampled_preserving_duration_and_pitch(tmp_path, sr):
    x = tone(1000, sr, 2.0)
    sf.write(tmp_path / "a.flac", x, sr, subtype="PCM_24")
    got = load_reference_audio(tmp_path / "a.flac").numpy()
    assert got.size == -(-x.size * 24000 // sr)  # same duration: ceil(N * 24000 / sr) samples
    assert abs(peak_hz(got, 24000) - 1000) <= 24000 / got.size
    ref = tone(1000, 24000, got.size / 24000)
    inner = slice(1200, got.size - 1200)  # away from the zero-padded edges
    assert np.abs(got[inner] - ref[inner]).max() < 1e-3


def test_ogg_vorbis_is_read(tmp_path):
    sf.write(tmp_path / "a.ogg", tone(600, 24000, 1.5), 24000, format="OGG", subtype="VORBIS")
    got = load_reference_audio(tmp_path / "a.ogg").numpy()
    assert got.size == 36000 and abs(peak_hz(got, 24000) - 600) <= 24000 / got.size


def test_long_file_refused_from_its_header(tmp_path):
    sf.write(tmp_path / "long.flac", tone(200, 8000, 40.0), 8000)
    with pytest.raises(InputError, match="40.0 s is too long"):
        load_reference_audio(tmp_path / "long.flac")


def test_resampler_rejects_content_above_new_nyquist():
    x = tone(13000, 48000, 1.0)  # above 12 kHz: must be filtered out, not aliased to 11 kHz
    y = resample(x, 48000, 24000)
    assert np.abs(y[600:-600]).max() < 1e-4


def test_resampler_odd_rate_path():
    x = tone(1000, 44101, 1.0)  # gcd(44101, 24000) = 1: the gathered (non-polyphase) path
    y = resample(x, 44101, 24000)
    ref = tone(1000, 24000, y.size / 24000)
    assert y.size == -(-x.size * 24000 // 44101)
    assert np.abs(y[600:-600] - ref[600:-600]).max() < 1e-3


def test_stereo_is_mixed_to_mono(tmp_path):
    left, right = tone(300, 24000, 1.2), tone(700, 24000, 1.2, amp=0.2)
    sf.write(tmp_path / "s.wav", np.stack([left, right], axis=1), 24000, subtype="FLOAT")
    got = load_reference_audio(tmp_path / "s.wav")
    assert got.dim() == 1
    assert torch.allclose(got, torch.from_numpy((left + right) / 2), atol=1e-7)
    # In-memory arrays: [samples, channels] and channels-first both work.
    assert torch.allclose(load_reference_audio((np.stack([left, right], 1), 24000)), got, atol=1e-7)
    assert torch.allclose(load_reference_audio((np.stack([left, right], 0), 24000)), got, atol=1e-7)


def test_in_memory_forms(tmp_path):
    x = tone(500, 24000, 1.0)
    pcm = np.round(x * 32767).astype(np.int16)
    assert torch.equal(load_reference_audio((torch.from_numpy(x), 24000)), torch.from_numpy(x))
    got = load_reference_audio((24000, pcm))  # Gradio order and int16 PCM
    assert torch.allclose(got, torch.from_numpy(pcm / 32768.0).float(), atol=0)
    with pytest.raises(InputError, match="sample rate"):
        load_reference_audio(x)
    with pytest.raises(InputError, match="sample rate"):
        load_reference_audio((x, 0))


@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_bytes(b""), "empty"),
    (lambda p: p.write_text("this is a text file, not audio\n" * 20), "not a readable audio file"),
    (lambda p: sf.write(p, np.zeros((0,), np.float32), 24000), "empty"),
    (lambda p: sf.write(p, np.zeros(48000, np.float32), 24000), "silent"),
    (lambda p: sf.write(p, tone(200, 24000, 0.4), 24000), "too short"),
    (lambda p: sf.write(p, tone(200, 8000, 31.0), 8000), "too long"),
])
def test_bad_files_give_one_line_input_errors(tmp_path, make, message):
    path = tmp_path / "ref.wav"
    make(path)
    with pytest.raises(InputError, match=message) as info:
        load_reference_audio(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(InputError, match="file not found"):
        load_reference_audio(tmp_path / "nope.wav")
    with pytest.raises(InputError, match="not a file"):
        load_reference_audio(tmp_path)


def test_nan_and_inf_rejected():
    for bad in (np.nan, np.inf):
        x = tone(200, 24000, 1.5)
        x[100] = bad
        with pytest.raises(InputError, match="NaN or infinite"):
            load_reference_audio((x, 24000))


def test_limits_are_configurable(tmp_path):
    x = tone(200, 24000, 2.0)
    sf.write(tmp_path / "a.wav", x, 24000, subtype="PCM_16")
    with pytest.raises(InputError, match="above the"):
        load_reference_audio(tmp_path / "a.wav", AudioLimits(max_file_bytes=10_000))
    with pytest.raises(InputError, match="too long"):
        load_reference_audio((x, 24000), AudioLimits(max_seconds=1.5))
    assert load_reference_audio((x[:12000], 24000), AudioLimits(min_seconds=0.5)).numel() == 12000


def test_sample_rates_above_the_ceiling_are_refused_before_resampling(tmp_path):
    """A 1 MHz clip would cost a sinc filter hundreds of taps wide per output sample; it is refused at once."""
    x = tone(200, 1_000_000, 1.5)
    with pytest.raises(InputError, match="sample rate 1000000 Hz is too high \\(at most 384000 Hz\\)"):
        load_reference_audio((x, 1_000_000))
    sf.write(tmp_path / "hi.wav", x, 1_000_000)
    with pytest.raises(InputError, match=f"reference audio {tmp_path / 'hi.wav'}: sample rate 1000000 Hz is too high"):
        load_reference_audio(tmp_path / "hi.wav")
    assert load_reference_audio((tone(200, 384_000, 1.5), 384_000)).shape == (36000,)  # the ceiling itself


def test_arrays_that_are_not_samples_are_one_line_errors():
    for bad, message in (([[0.1, 0.2], [0.3]], "not an array of samples"),
                         (np.array(["a", "b"]), "expected numeric samples"),
                         (np.zeros((2, 3, 4), np.float32), "expected \\[samples\\] or \\[samples, channels\\]")):
        with pytest.raises(InputError, match=message) as info:
            load_reference_audio((bad, 24000))
        assert "\n" not in str(info.value)
