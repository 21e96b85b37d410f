"""The app over HTTP, in-process on a free port over the tiny checkpoint: the named Gradio API through
gradio_client, and the OpenAI-compatible /v1 routes through the official `openai` client and raw
streaming HTTP (httpx). No mocks: the real engine, page and server (app.serve)."""

from __future__ import annotations

import base64
import io
import json
import time

import httpx
import numpy as np
import pytest
import soundfile as sf
from _fixtures import FIXTURES, free_port

import app
from omni_tts.config import EngineConfig
from omni_tts.ui import files

pytestmark = pytest.mark.filterwarnings("ignore:The clip stopped at Max length")
# frames + 1: about two seconds of audio, well under a second of CPU; a fixed seed, so no early EOS is drawn
SHORT = {"max_new_tokens": 24, "seed": 3}


@pytest.fixture(scope="module")
def server():
    """(base URL, engine): the page and the APIs on 127.0.0.1 (max_seq_len 96 bounds a clip without Max length)."""
    from omni_tts.engine.engine import Engine

    engine = Engine.from_config(EngineConfig(model=str(FIXTURES / "custom_voice"), device="cpu", max_num_seqs=2,
                                             max_seq_len=96, mode="eager", initial_chunk_frames=1, chunk_frames=4))
    demo = app.build_demo(engine)
    server, url = app.serve(engine, demo, "127.0.0.1", free_port(), block=False)
    yield url.rstrip("/"), engine
    engine.shutdown()
    server.stop()
    demo.close()


def test_gradio_client_synthesize_with_only_text_returns_a_wav_and_metrics(server):
    from gradio_client import Client

    url, engine = server
    client = Client(url + "/", verbose=False)
    assert list(client.view_api(print_info=False, return_format="dict")["named_endpoints"]) == ["/synthesize"]
    path, metrics = client.predict("Hello", api_name="/synthesize")
    wav, sr = sf.read(path)
    assert sr == engine.sample_rate and wav.size > 0
    assert metrics["status"] == "done" and metrics["mode"] == "eager" and metrics["ttfp_ms"] > 0
    assert metrics["frames"] * 1920 == wav.size  # 80 ms of 24 kHz audio per frame
    path2, m2 = client.predict("Hi again", speaker="vivian", seed=5, max_new_tokens=10, api_name="/synthesize")
    assert m2["frames"] == 9 and sf.read(path2)[0].size == 9 * 1920
    with pytest.raises(Exception, match="text is empty"):
        client.predict("", api_name="/synthesize")


def test_openai_client_gets_a_playable_wav(server):
    from openai import OpenAI

    url, engine = server
    client = OpenAI(base_url=url + "/v1", api_key="x")
    audio = client.audio.speech.create(model="omni-tts", voice="ryan", input="Hello", extra_body=SHORT)
    wav, sr = sf.read(io.BytesIO(audio.content))
    assert sr == engine.sample_rate and wav.size == 23 * 1920
    names = [m.id for m in client.models.list().data]
    assert names and names[0] == "custom_voice"


def test_openai_streaming_gives_pcm_before_the_clip_is_finished(server):
    from openai import OpenAI

    url, _ = server
    client = OpenAI(base_url=url + "/v1", api_key="x")
    arrivals = []
    t0 = time.perf_counter()
    with client.audio.speech.with_streaming_response.create(
            model="omni-tts", voice="ryan", input="Streaming, chunk by chunk.", response_format="pcm",
            extra_body={"max_new_tokens": 60, "seed": 3}) as response:
        for piece in response.iter_bytes():
            arrivals.append((time.perf_counter() - t0, len(piece)))
    total = sum(n for _, n in arrivals)
    # 16-bit samples of whole frames, at most 59 (a request batched with another may draw EOS sooner)
    assert total % (1920 * 2) == 0 and 0 < total <= 59 * 1920 * 2
    first, last = arrivals[0][0], arrivals[-1][0]
    assert len(arrivals) > 3 and first < 0.5 * last  # the first PCM bytes came long before the end


def test_raw_http_stream_arrives_in_chunks_as_they_are_made(server):
    url, engine = server
    body = {"model": "x", "input": "Raw HTTP streaming.", "voice": "vivian", "response_format": "wav",
            "stream_format": "audio", "max_new_tokens": 60}
    sizes, times = [], []
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("audio/wav")
        assert int(r.headers["x-sample-rate"]) == engine.sample_rate
        for piece in r.iter_raw():
            sizes.append(len(piece))
            times.append(time.perf_counter() - t0)
    data = sum(sizes) - 44  # after the streamed wav header: whole frames, at most 59
    assert len(sizes) > 3 and times[0] < 0.5 * times[-1] and data % (1920 * 2) == 0 and data <= 59 * 1920 * 2


def test_sse_stream_has_deltas_then_done(server):
    url, _ = server
    body = {"input": "Events.", "voice": "ryan", "response_format": "pcm", "stream_format": "sse", **SHORT}
    events = []
    with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    usage = events[-1]["usage"]
    assert deltas and events[-1]["type"] == "speech.audio.done" and usage["ttfp_ms"] > 0
    assert 0 <= usage["queue_ms"] <= usage["ttfp_ms"]
    assert sum(len(base64.b64decode(e["audio"])) for e in deltas) == 23 * 1920 * 2


@pytest.mark.parametrize("fmt", ["flac", "mp3", "opus", "wav"])
def test_encoded_formats_are_readable(server, fmt):
    url, engine = server
    r = httpx.post(url + "/v1/audio/speech", json={"input": "Formats.", "response_format": fmt, **SHORT}, timeout=60)
    assert r.status_code == 200
    wav, sr = sf.read(io.BytesIO(r.content))
    assert sr == engine.sample_rate and abs(wav.shape[0] - 23 * 1920) < 2000  # codecs pad a little


@pytest.mark.parametrize("body, status, param, words", [  # param: the field the error names
    ({"input": ""}, 400, "input", "input is empty"),
    ({"input": "hi", "voice": "nobody"}, 400, "voice", "unknown voice 'nobody'"),
    ({"input": "hi", "seed": 2**70}, 400, "seed", "seed"),
    ({"input": "hi", "top_k": -3}, 400, "top_k", "top_k"),
    ({"input": "hi", "bogus": 1}, 400, "bogus", "not permitted"),
    ({"input": "hi", "speed": 4.5}, 400, "speed", "from 0.25 to 4"),
    ({"input": "hi", "response_format": "mp3", "stream_format": "audio"}, 400, "response_format", "cannot be streamed"),
    ({"input": "x" * 5001}, 400, "input", "too long"),
    ({"input": "hi", "task_type": "Base"}, 400, "task_type", "it does: custom_voice"),
    ({"input": "hi", "task_type": "Singing"}, 400, "task_type", "unknown task_type"),
    ({"input": "hi", "stream": "yes"}, 400, "stream", "valid boolean"),  # no value turns into another type
    ({"input": "hi", "max_new_tokens": True}, 400, "max_new_tokens", "valid integer"),
    ({"input": "hi", "voice": {"name": "ryan"}}, 400, "voice", '{"id": "<name>"}'),
    ({"input": "hi", "voice": {"id": "ryan", "name": "x"}}, 400, "voice", "and nothing else"),
    ({"input": "hi", "ref_audio": "!!!"}, 400, "ref_audio", "CustomVoice does not clone a voice"),
])
def test_bad_requests_get_json_errors_and_the_server_keeps_serving(server, body, status, param, words):
    url, _ = server
    r = httpx.post(url + "/v1/audio/speech", json=body, timeout=60)
    err = r.json()["error"]
    assert r.status_code == status and words in err["message"] and "\n" not in err["message"]
    assert err["param"] == param
    ok = httpx.post(url + "/v1/audio/speech", json={"input": "Still fine.", **SHORT}, timeout=60)
    assert ok.status_code == 200 and ok.content[:4] == b"RIFF"


def test_malformed_json_is_a_400(server):
    url, _ = server
    r = httpx.post(url + "/v1/audio/speech", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


@pytest.mark.parametrize("method, path, status, words", [
    ("GET", "/v1/audio/speech", 405, "GET is not a method of /v1/audio/speech (it takes: POST)"),
    ("POST", "/v1/audio/nothing", 404, "no route /v1/audio/nothing; the API: POST /v1/audio/speech"),
    ("GET", "/v1/audio/speech/stream", 426, "/v1/audio/speech/stream is a WebSocket route"),
])
def test_a_route_or_method_the_api_has_not_is_an_api_error(server, method, path, status, words):
    url, _ = server
    r = httpx.request(method, url + path, timeout=60)
    assert r.status_code == status and words in r.json()["error"]["message"]


def test_voices_list_ids_names_and_descriptions(server):
    url, engine = server
    voices = httpx.get(url + "/v1/audio/voices").json()
    assert voices["voices"][:len(engine.speakers())] == engine.speakers()  # then any saved voices
    ryan = next(v for v in voices["data"] if v["id"] == "ryan")
    assert ryan["kind"] == "builtin"
    assert ryan["name"] == "Ryan" and "English" in ryan["description"]


def test_files_the_app_did_not_hand_out_are_not_served(server):
    url, _ = server
    secret = files.out_dir().new("someone-elses", ".wav")
    sf.write(secret, np.zeros(2400, np.float32), 24000)
    for route in (f"/gradio_api/file={secret}", f"/file={secret}", "/gradio_api/file=/etc/passwd"):
        r = httpx.get(url + route)
        assert r.status_code in (403, 404), (route, r.status_code)


def test_bench_measures_the_server_through_its_speech_route(server, capsys):
    """`omni-tts bench --http URL`: the closed loop through POST /v1/audio/speech, streamed pcm."""
    from omni_tts.tools.cli import main

    url, engine = server
    assert main(["bench", "--http", url, "--modes", "eager", "--concurrency", "1", "2", "--num-prompts", "2",
                       "--fixed-frames", "6", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| Audio tput (s/s) | 2 |"))
    assert float(row.split("|")[3]) > 0
    ttfp = next(line for line in out.splitlines() if line.startswith("| Med TTFP (ms) | 1 |"))
    e2e = next(line for line in out.splitlines() if line.startswith("| Med E2E (ms) | 1 |"))
    assert 0 < float(ttfp.split("|")[3]) < float(e2e.split("|")[3])  # first bytes before the clip is finished


def test_the_page_takes_only_files_a_client_uploaded(server, tmp_path):
    """A file input naming a server path (no upload) is refused by Gradio's own check, which applies to the
    mounted page too: no server file is read as a voice or copied into the page's cache."""
    url, _ = server
    deps = httpx.get(url + "/config", timeout=60).json()["dependencies"]
    synth = next(d for d in deps if d.get("api_name") == "synthesize")
    data = ["hi", "voice_clone", "", "auto", "", "", 0.9, 50, 1.0, 1.05, 5, -1, None, "", False,
            {"path": str(FIXTURES / "custom_voice" / "config.json"), "meta": {"_type": "gradio.FileData"}}, 1.0]
    assert len(data) == len(synth["inputs"])
    join = httpx.post(url + "/gradio_api/queue/join", timeout=60,
                      json={"fn_index": synth["id"], "session_hash": "notuploaded", "data": data})
    assert join.status_code == 200, join.text
    with httpx.stream("GET", url + "/gradio_api/queue/data", params={"session_hash": "notuploaded"},
                      timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    done = next(e for e in events if e.get("msg") == "process_completed")
    assert not done["success"] and "not uploaded by a user" in json.dumps(done)
    from gradio_client import Client, handle_file  # an uploaded clip passes the check (this model then refuses it)

    clip = tmp_path / "ref.wav"
    sf.write(clip, np.load(FIXTURES / "base" / "golden_ref_audio.npy"), 24000)
    with pytest.raises(Exception, match="cannot clone voices") as e:
        Client(url, verbose=False).predict(text="hi", task="voice_clone", ref_audio=handle_file(str(clip)),
                                           x_vector_only=True, api_name="/synthesize")
    assert "not uploaded" not in str(e.value)
