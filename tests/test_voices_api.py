"""Saved voices by API against a real uvicorn server on the tiny Base checkpoint: multipart uploads
through httpx, the listing, deletion, every refusal naming its field, the admin gate, a saved voice used
by name through the official `openai` client and through /synthesize, and the refusal on a checkpoint
that cannot clone."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
import soundfile as sf
from _fixtures import fixture_dir
from _serving import serve_app

from omni_tts import voices
from omni_tts.config import EngineConfig
from omni_tts.serving import voices as voices_api
from omni_tts.serving.app import build_app
from omni_tts.serving.settings import ServeSettings

SHORT = {"max_new_tokens": 5, "seed": 3}


def wav_bytes(seconds: float = 1.0) -> bytes:
    ref = np.load(fixture_dir("base") / "golden_ref_audio.npy")[: int(24000 * seconds)]
    buf = io.BytesIO()
    sf.write(buf, ref, 24000, format="WAV")
    return buf.getvalue()


def engine_for(kind: str):
    from omni_tts.engine.engine import Engine

    return Engine.from_config(EngineConfig(model=str(fixture_dir(kind)), device="cpu", max_num_seqs=2,
                                           max_seq_len=256, mode="eager", initial_chunk_frames=1, chunk_frames=4))


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("OMNI_TTS_DATA_DIR", str(tmp_path_factory.mktemp("data")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def base(library):
    engine = engine_for("base")
    with serve_app(build_app(engine)) as url:
        yield url, engine
    engine.shutdown()


def upload(url: str, name: str, audio: bytes | None = None, **fields) -> httpx.Response:
    data = {"name": name, "consent": "true", **fields}
    files = {"audio_sample": ("me.wav", wav_bytes() if audio is None else audio, "audio/wav")}
    return httpx.post(url + "/v1/audio/voices", data=data, files=files, timeout=120)


def test_a_voice_is_saved_listed_used_by_name_and_deleted(base):
    from openai import OpenAI

    url, engine = base
    r = upload(url, "Ann Smith", x_vector_only="true")
    assert r.status_code == 200, r.text
    made = r.json()
    assert made["name"] == "Ann_Smith" and made["kind"] == "saved" and made["mode"] == "x_vector_only"
    assert made["id"].startswith("voice-") and made["consent"] == "true"
    assert voices.voice_path("Ann_Smith").is_file()  # on disk: a restart finds it
    listed = httpx.get(url + "/v1/audio/voices").json()
    assert "Ann_Smith" in listed["voices"]
    assert {v["name"]: v["kind"] for v in listed["data"]}["Ann_Smith"] == "saved"

    client = OpenAI(base_url=url + "/v1", api_key="unused")
    got = client.audio.speech.create(model="omni-tts", voice="Ann_Smith", input="Hello there.",
                                     response_format="wav", extra_body=SHORT)
    wav, sr = sf.read(io.BytesIO(got.content))
    assert sr == engine.sample_rate and wav.size == 4 * 1920

    assert httpx.delete(url + "/v1/audio/voices/Ann_Smith").json()["deleted"] is True
    assert "Ann_Smith" not in httpx.get(url + "/v1/audio/voices").json()["voices"]
    r = httpx.delete(url + "/v1/audio/voices/Ann_Smith")
    assert r.status_code == 404 and r.json()["error"]["param"] == "name"


def test_an_icl_voice_keeps_its_transcript(base):
    url, _ = base
    r = upload(url, "icl", ref_text="Some words the clip says.")
    assert r.status_code == 200, r.text
    assert r.json()["mode"] == "icl" and r.json()["ref_text"] == "Some words the clip says."
    assert voices.load("icl").ref_text == "Some words the clip says."


@pytest.mark.parametrize("name, audio, fields, status, param, words", [
    ("bad", b"this is not audio at all" * 50, {"x_vector_only": "true"}, 400, "audio_sample", "audio_sample"),
    ("noconsent", None, {"consent": "", "x_vector_only": "true"}, 400, "consent", "consent is required"),
    ("", None, {"x_vector_only": "true"}, 400, "name", "Voice name is empty"),
    ("xv", None, {"x_vector_only": "maybe"}, 400, "x_vector_only", "true or false"),
    ("notext", None, {}, 400, "ref_text", "ref_text"),
    ("extra", None, {"x_vector_only": "true", "colour": "red"}, 400, "colour", "unknown form field"),
])
def test_bad_uploads_are_refused_naming_the_field(base, name, audio, fields, status, param, words):
    url, _ = base
    r = upload(url, name, audio, **fields)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"]
    assert "/tmp" not in err["message"]  # no server paths
    assert not voices.exists(name or "-")


def test_a_taken_name_is_refused_with_409_and_a_large_clip_with_413(base):
    url, _ = base
    assert upload(url, "twice", x_vector_only="true").status_code == 200
    r = upload(url, "twice", x_vector_only="true")
    assert r.status_code == 409 and r.json()["error"]["param"] == "name"
    r = upload(url, "huge", b"\0" * (voices_api.MAX_SAMPLE_BYTES + 10), x_vector_only="true")
    assert r.status_code == 413 and r.json()["error"]["param"] == "audio_sample"
    r = httpx.post(url + "/v1/audio/voices", data={"name": "nofile", "consent": "true"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "audio_sample"


def test_changes_need_the_admin_token_on_a_public_server(library):
    engine = engine_for("base")
    try:
        with serve_app(build_app(engine, ServeSettings(public=True, admin_token="s3cret"))) as url:
            r = upload(url, "gated", x_vector_only="true")
            assert r.status_code == 403 and "Authorization: Bearer" in r.json()["error"]["message"]
            assert httpx.get(url + "/v1/audio/voices").status_code == 200  # listing stays open
            r = httpx.post(url + "/v1/audio/voices", data={"name": "gated", "consent": "yes", "x_vector_only": "1"},
                           files={"audio_sample": ("a.wav", wav_bytes(), "audio/wav")},
                           headers={"Authorization": "Bearer s3cret"}, timeout=120)
            assert r.status_code == 200, r.text
            assert httpx.delete(url + "/v1/audio/voices/gated").status_code == 403
            assert httpx.delete(url + "/v1/audio/voices/gated", headers={"Authorization": "Bearer s3cret"}).json()[
                "deleted"]
        with serve_app(build_app(engine, ServeSettings(public=True))) as url:
            r = upload(url, "off", x_vector_only="true")
            assert r.status_code == 403 and "off on a public server" in r.json()["error"]["message"]
    finally:
        engine.shutdown()


def test_a_custom_voice_checkpoint_refuses_to_clone(library):
    engine = engine_for("custom_voice")
    try:
        with serve_app(build_app(engine)) as url:
            r = upload(url, "nope", x_vector_only="true")
            assert r.status_code == 400 and "cannot clone voices" in r.json()["error"]["message"]
            listed = httpx.get(url + "/v1/audio/voices").json()
            assert {v["kind"] for v in listed["data"]} >= {"builtin"}
            assert "ryan" in listed["voices"]
    finally:
        engine.shutdown()


def test_synthesize_endpoint_speaks_a_saved_voice_by_name(base):
    from omni_tts.ui import api

    url, engine = base
    assert upload(url, "forgradio", x_vector_only="true").status_code == 200
    path, metrics = api.synthesize_request(engine, engine.model_info(), "Hello.", speaker="forgradio",
                                           max_new_tokens=5, seed=2)
    assert metrics["status"] == "done" and sf.read(path)[0].size == 4 * 1920


def test_a_form_of_unknown_length_is_refused(base):
    url, _ = base

    def chunks():
        yield b"--x\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\nstreamed\r\n--x--\r\n"

    r = httpx.post(url + "/v1/audio/voices", content=chunks(),
                   headers={"Content-Type": "multipart/form-data; boundary=x"})
    assert r.status_code == 411 and "Content-Length" in r.json()["error"]["message"]


def test_a_form_that_never_finishes_arriving_is_a_408(library):
    """A voice upload whose body stops part-way is answered once the body deadline passes (and the
    connection is freed) instead of holding its connection and task for good."""
    import socket

    engine = engine_for("base")
    try:
        with serve_app(build_app(engine, ServeSettings(body_timeout_s=0.5))) as url:
            host, port = url.removeprefix("http://").split(":")
            part = b'--x\r\nContent-Disposition: form-data; name="name"\r\n\r\nhalf'
            with socket.create_connection((host, int(port)), timeout=30) as s:
                s.sendall(b"POST /v1/audio/voices HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
                          b"Content-Type: multipart/form-data; boundary=x\r\n\r\n" + part)  # then nothing more
                reply = b""
                while b"\r\n\r\n" not in reply:
                    reply += s.recv(65536)
            assert reply.startswith(b"HTTP/1.1 408 "), reply[:120]
            assert httpx.get(url + "/v1/audio/voices").status_code == 200
    finally:
        engine.shutdown()


def test_a_body_that_is_not_a_form_and_an_unknown_voice_are_named_as_such(base):
    """JSON sent to the upload route is refused as the wrong kind of body (not as an empty name), and a
    Base request naming a voice the library does not hold says so and lists the saved ones (not that a
    reference clip is missing)."""
    url, _ = base
    r = httpx.post(url + "/v1/audio/voices", json={"name": "x", "consent": True}, timeout=120)
    assert r.status_code == 415 and r.json()["error"]["message"].startswith(
        "send the voice as a multipart form (Content-Type: multipart/form-data)")
    assert "(got 'application/json')" in r.json()["error"]["message"]
    assert upload(url, "kept", x_vector_only="true").status_code == 200
    r = httpx.post(url + "/v1/audio/speech", json={"input": "Hi.", "voice": "nobody", **SHORT}, timeout=120)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "voice"
    assert error["message"].startswith("unknown voice 'nobody': no saved voice has that name (saved: ")
    assert "kept" in error["message"] and error["message"].endswith("or send ref_audio to clone one for this request")
    r = httpx.post(url + "/v1/audio/speech", json={"input": "Hi.", **SHORT}, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "ref_audio"


def b64(audio: bytes) -> str:
    import base64

    return base64.b64encode(audio).decode()


@pytest.mark.parametrize("extra, param, words", [
    ({"ref_audio": b64(b"this is not audio at all" * 50), "x_vector_only_mode": True}, "ref_audio",
     "ref_audio: not a readable audio file"),
    ({"ref_audio": b64(wav_bytes(0.05)), "x_vector_only_mode": True}, "ref_audio", "ref_audio: "),
    ({"ref_audio": b64(wav_bytes())}, "ref_text", "ref_text (the transcript of the reference audio) is required"),
    ({"ref_audio": b64(wav_bytes()), "ref_text": "x" * 5000}, "ref_text", "ref_text"),
    ({"ref_audio": "data:audio/wav;base64"}, "ref_audio", "a data: URL carries its audio after a comma"),
])
def test_a_bad_reference_clip_on_the_speech_route_is_named_as_its_field(base, extra, param, words):
    """The route writes the clip to a temporary file for the encoders: its errors name ref_audio (or
    ref_text), never that file."""
    url, _ = base
    r = httpx.post(url + "/v1/audio/speech", json={"input": "Hi.", **extra, **SHORT}, timeout=120)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == param and words in err["message"], err
    assert "ref-audio-" not in err["message"] and ".bin" not in err["message"]


def test_a_saved_voice_is_found_whatever_the_case_and_refuses_a_clip_beside_it(base):
    url, _ = base
    assert upload(url, "Zed", x_vector_only="true").status_code == 200
    assert upload(url, "zed", x_vector_only="true").status_code == 409  # taken, whatever the case
    r = httpx.post(url + "/v1/audio/speech", json={"input": "Hi.", "voice": "ZED", **SHORT}, timeout=120)
    assert r.status_code == 200 and r.content[:4] == b"RIFF"
    r = httpx.post(url + "/v1/audio/speech", json={"input": "Hi.", "voice": "zed", "ref_audio": b64(wav_bytes()),
                                                   **SHORT}, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "ref_audio"
    assert "voice 'zed' is a saved voice" in r.json()["error"]["message"]
    gone = httpx.delete(url + "/v1/audio/voices/zED").json()
    assert gone["deleted"] and gone["id"] == "Zed"  # the voice as it was saved
    assert not voices.exists("Zed")


def test_a_damaged_saved_voice_is_named_as_the_voice_not_as_a_server_path(library):
    (voices.voices_dir() / "broken.safetensors").write_bytes(b"not a safetensors file")
    try:
        with pytest.raises(voices.InputError) as e:
            voices.load("broken")
        assert "'broken'" in str(e.value) and str(voices.data_dir()) not in str(e.value)
    finally:
        voices.delete("broken")
