"""Speaking speed: pitch kept while the length scales (pedalboard's Rubber Band), the bounds named as
`speed`, on the speech route (whole clips; streams refuse it) against a real uvicorn server, on
/synthesize, and flac among the formats that decode."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
import soundfile as sf
from _fixtures import fixture_dir
from _serving import serve_app

from omni_tts.config import EngineConfig
from omni_tts.errors import InputError
from omni_tts.models.stretch import change_speed, check_speed
from omni_tts.serving.app import build_app

SR = 24000
BODY = {"input": "Hello there.", "voice": "ryan", "max_new_tokens": 13, "seed": 3}


def pitch(wav: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(wav * np.hanning(len(wav))))
    return float(np.fft.rfftfreq(len(wav), 1 / SR)[np.argmax(spectrum)])


@pytest.mark.parametrize("speed", [0.25, 0.5, 2.0, 4.0])
def test_the_length_scales_and_the_pitch_stays(speed):
    tone = (0.5 * np.sin(2 * np.pi * 220 * np.arange(2 * SR) / SR)).astype(np.float32)
    out = change_speed(tone, SR, speed)
    assert out.dtype == np.float32 and len(out) == pytest.approx(len(tone) / speed, rel=0.02)
    assert pitch(out) == pytest.approx(220, abs=4)
    assert change_speed(tone, SR, 1.0) is tone or np.array_equal(change_speed(tone, SR, 1.0), tone)


@pytest.mark.parametrize("bad", [0.2, 4.5, 0, -1, float("nan"), True, "fast"])
def test_out_of_range_speed_is_refused_naming_it(bad):
    with pytest.raises(InputError, match="^speed must be"):
        check_speed(bad)


@pytest.fixture(scope="module")
def server():
    from omni_tts.engine.engine import Engine

    engine = Engine.from_config(EngineConfig(model=str(fixture_dir("custom_voice")), device="cpu", max_num_seqs=2,
                                             max_seq_len=96, mode="eager", initial_chunk_frames=1, chunk_frames=4))
    with serve_app(build_app(engine)) as url:
        yield url, engine
    engine.shutdown()


def speech(url: str, **kw) -> httpx.Response:
    return httpx.post(url + "/v1/audio/speech", json={**BODY, **kw}, timeout=120)


def test_the_speech_route_speaks_faster_and_slower(server):
    url, _ = server
    plain, _ = sf.read(io.BytesIO(speech(url).content))
    fast, _ = sf.read(io.BytesIO(speech(url, speed=2.0).content))
    slow, _ = sf.read(io.BytesIO(speech(url, speed=0.5).content))
    assert len(plain) == 12 * 1920
    assert len(fast) == pytest.approx(len(plain) / 2, rel=0.03) and len(slow) == pytest.approx(2 * len(plain), rel=0.03)


@pytest.mark.parametrize("kw, words", [({"speed": 4.5}, "speed must be from 0.25 to 4"),
                                       ({"speed": 0.1}, "speed must be from 0.25 to 4"),
                                       ({"speed": 2.0, "stream": True}, "cannot be streamed"),
                                       ({"speed": 2.0, "response_format": "pcm"}, "cannot be streamed")])
def test_bad_speeds_are_refused_with_400_naming_speed(server, kw, words):
    url, _ = server
    r = speech(url, **kw)
    assert r.status_code == 400 and r.json()["error"]["param"] == "speed" and words in r.json()["error"]["message"]


@pytest.mark.parametrize("fmt", ["flac", "wav", "mp3", "opus"])
def test_formats_decode_with_soundfile(server, fmt):
    url, engine = server
    r = speech(url, response_format=fmt, speed=1.5)
    assert r.status_code == 200, r.text
    wav, sr = sf.read(io.BytesIO(r.content))
    assert sr in (engine.sample_rate, 48000) and len(wav) > 0
    if fmt == "flac":
        assert r.headers["content-type"] == "audio/flac" and len(wav) == pytest.approx(12 * 1920 / 1.5, rel=0.03)


def test_synthesize_takes_a_speed(server):
    import gradio as gr

    from omni_tts.ui import api

    _, engine = server
    path, _ = api.synthesize_request(engine, engine.model_info(), "Hello there.", speaker="ryan",
                                     max_new_tokens=13, seed=3, speed=0.5)
    assert len(sf.read(path)[0]) == pytest.approx(2 * 12 * 1920, rel=0.03)
    with pytest.raises(gr.Error, match="speed must be from 0.25 to 4"):
        api.synthesize_request(engine, engine.model_info(), "Hello there.", speed=9)
