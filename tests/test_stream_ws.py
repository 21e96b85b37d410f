"""Text streamed in over /v1/audio/speech/stream, with a real WebSocket client against a real uvicorn
server on the tiny checkpoint: sentences spoken as soon as the text completes them, in order, with their
audio frames between audio.start and audio.done; errors as error messages; a client that leaves
cancels the session's requests and frees their slots."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _fixtures import fixture_dir
from _serving import grown, serve_app, until
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from omni_tts.config import EngineConfig, SynthesisParams
from omni_tts.serving.app import build_app
from omni_tts.serving.settings import ServeSettings

CONFIG = {"type": "session.config", "voice": "ryan", "language": "English", "max_new_tokens": 5, "seed": 4}


@pytest.fixture(scope="module")
def server():
    from omni_tts.engine.engine import Engine

    engine = Engine.from_config(EngineConfig(model=str(fixture_dir("custom_voice")), device="cpu", max_num_seqs=2,
                                             max_seq_len=4096, mode="eager", initial_chunk_frames=1, chunk_frames=2))
    with serve_app(build_app(engine)) as url:
        yield url.replace("http://", "ws://") + "/v1/audio/speech/stream", engine
    engine.shutdown()


def messages(ws) -> list:
    """Everything the server sends until session.done or an error that closes (binary frames as bytes)."""
    out = []
    for m in ws:
        out.append(m if isinstance(m, bytes) else json.loads(m))
        if isinstance(out[-1], dict) and out[-1]["type"] == "session.done":
            break
    return out


def test_sentences_are_spoken_in_order_as_the_text_completes_them(server):
    url, engine = server
    with connect(url) as ws:
        ws.send(json.dumps(CONFIG))
        ws.send(json.dumps({"type": "input.text", "text": "Hello there. How are"}))
        first = json.loads(ws.recv(timeout=60))  # the first sentence starts before the text is finished
        assert first == {"type": "audio.start", "sentence_index": 0, "sentence_text": "Hello there.", "format": "pcm"}
        for piece in (" you today? 我很好。", "Bye"):
            ws.send(json.dumps({"type": "input.text", "text": piece}))
        ws.send(json.dumps({"type": "input.done"}))
        got = [first] + messages(ws)
    events = [m for m in got if isinstance(m, dict)]
    starts = [m for m in events if m["type"] == "audio.start"]
    assert [m["sentence_text"] for m in starts] == ["Hello there.", "How are you today?", "我很好。", "Bye"]
    assert [m["sentence_index"] for m in starts] == [0, 1, 2, 3]
    assert events[-1] == {"type": "session.done", "total_sentences": 4}
    # each sentence: audio.start, its frames, audio.done; its frames equal the sentence spoken alone
    kinds = ["start" if isinstance(m, dict) and m["type"] == "audio.start" else
             "done" if isinstance(m, dict) and m["type"] == "audio.done" else "bytes" for m in got[:-1]]
    assert "".join(k[0] for k in kinds) == "".join("s" + "b" * kinds[i + 1:].index("done") + "d"
                                                    for i, k in enumerate(kinds) if k == "start")
    i = got.index(starts[2])
    audio = b"".join(got[i + 1:got.index({"type": "audio.done", "sentence_index": 2})])
    alone = engine.synthesize(SynthesisParams(text="我很好。", speaker="ryan", language="English", max_new_tokens=5,
                                              seed=4))
    # the session's sentences may share code-to-wave calls (two slots), whose rows agree with a row decoded
    # alone to float rounding (test_codec: 1e-5), which moves a 16-bit sample by one step at most
    streamed, solo = np.frombuffer(audio, "<i2").astype(int), (np.clip(alone.wav, -1, 1) * 32767).astype(np.int16)
    assert streamed.shape == solo.shape and np.abs(streamed - solo).max() <= 1


def test_wav_format_and_speed(server):
    url, engine = server
    with connect(url) as ws:
        ws.send(json.dumps({**CONFIG, "format": "wav", "speed": 2.0}))
        ws.send(json.dumps({"type": "input.text", "text": "One sentence only."}))
        ws.send(json.dumps({"type": "input.done"}))
        got = messages(ws)
    frames = [m for m in got if isinstance(m, bytes)]
    assert got[0]["format"] == "wav" and frames[0][:4] == b"RIFF"
    samples = sum(len(f) for f in frames[1:]) // 2
    assert samples == pytest.approx(4 * 1920 / 2, abs=200)  # four frames at twice the speed


@pytest.mark.parametrize("config, words", [
    ({"type": "input.text", "text": "hi"}, "first message must be"),
    ({**CONFIG, "format": "mp3"}, "cannot be streamed"),
    ({**CONFIG, "speed": 9}, "speed"),
    ({**CONFIG, "colour": "red"}, "colour"),
    ({**CONFIG, "voice": "nobody"}, "unknown voice 'nobody'"),
    ({**CONFIG, "mode": "reduce-overhead"}, "mode reduce-overhead is not available"),  # not on this CPU engine
    ({**CONFIG, "max_new_tokens": 0}, "max_new_tokens"),
    ({**CONFIG, "seed": True}, "seed: Input should be a valid integer"),
])
def test_a_bad_config_is_an_error_and_the_session_ends(server, config, words):
    url, _ = server
    with connect(url) as ws:
        ws.send(json.dumps(config))
        m = json.loads(ws.recv(timeout=30))
        assert m["type"] == "error" and words in m["message"]
        with pytest.raises(ConnectionClosed):  # closed by the server
            ws.recv(timeout=30)


def test_a_request_the_engine_refuses_ends_the_session_with_its_error(server):
    """A sentence the engine refuses (its text holds a lone surrogate, which JSON can carry): the refusal is
    the session's last word."""
    url, _ = server
    with connect(url) as ws:
        ws.send(json.dumps(CONFIG))
        ws.send(json.dumps({"type": "input.text", "text": "Hello \ud800 there. "}))
        m = json.loads(ws.recv(timeout=30))
        assert m["type"] == "error" and "not valid Unicode" in m["message"]
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=30)


@pytest.mark.parametrize(("message", "words"), [
    ("not json", "the message must be a JSON object"),
    (b"\x00\x01", "a binary message (messages are JSON text)"),
    ("[1, 2]", "the message must be a JSON object"),
    ('{"type": "input.text", "text": "a", "text": "b"}', "text: given twice"),
    pytest.param('{"type": "input.text", "text": ' + "[" * 50_000 + "]" * 50_000 + "}", "text: nested too deeply",
                 id="nested"),
    (json.dumps(CONFIG), "session.config comes once, as the first message"),
    (json.dumps({"type": "input.text", "text": 5}), "unknown message {'type': 'input.text', 'text': 5}"),
])
def test_an_unknown_message_is_an_error_that_says_why_and_the_session_goes_on(server, message, words):
    url, _ = server
    with connect(url) as ws:
        ws.send(json.dumps(CONFIG))
        ws.send(message)
        m = json.loads(ws.recv(timeout=30))
        assert m["type"] == "error" and m["message"].startswith(words)
        assert m["message"].endswith("expected input.text (with a text string) or input.done")
        ws.send(json.dumps({"type": "input.text", "text": "Still here."}))
        ws.send(json.dumps({"type": "input.done"}))
        assert messages(ws)[-1] == {"type": "session.done", "total_sentences": 1}


def _until_closed(ws) -> list:
    out = []
    with pytest.raises(ConnectionClosed):  # closed by the server
        while True:
            m = ws.recv(timeout=30)
            out.append(m if isinstance(m, bytes) else json.loads(m))
    return out


def test_a_session_that_sends_nothing_in_time_ends_with_an_error_that_says_so(server):
    """The config is due within body_timeout_s of connecting, more text within ws_idle_timeout_s of the
    last (half a second each here, on the server's clock); past either, one error and the server closes."""
    _, engine = server
    quick = ServeSettings(body_timeout_s=0.5, ws_idle_timeout_s=0.5)
    with serve_app(build_app(engine, quick)) as http:
        url = http.replace("http://", "ws://") + "/v1/audio/speech/stream"
        with connect(url) as ws:
            assert _until_closed(ws) == [{"type": "error",
                                          "message": "no session.config within 0.5 s: the session ends"}]
        with connect(url) as ws:
            ws.send(json.dumps(CONFIG))
            ws.send(json.dumps({"type": "input.text", "text": "Spoken first. And then"}))
            got = [m for m in _until_closed(ws) if isinstance(m, dict)]
    assert got[-1] == {"type": "error", "message": "no message (input.done ends the text) within 0.5 s: the "
                                                   "session ends"}
    assert [m["type"] for m in got[:-1]] in ([], ["audio.start"], ["audio.start", "audio.done"])
    assert all(m.get("sentence_text", "Spoken first.") == "Spoken first." for m in got)


def _idle(engine) -> bool:
    snap = engine.snapshot()
    return snap.active == 0 and snap.waiting == 0


def test_a_client_that_leaves_cancels_its_requests(server):
    """The session's requests end soon after the client leaves, as cancelled because it went away (as on
    the HTTP routes)."""
    url, engine = server
    until(lambda: _idle(engine), timeout=30, what="an idle engine")
    before = dict(engine.stats.outcomes)
    with connect(url) as ws:
        ws.send(json.dumps({**CONFIG, "max_new_tokens": 4000}))
        ws.send(json.dumps({"type": "input.text", "text": "A long one. And another. "}))
        assert json.loads(ws.recv(timeout=60))["type"] == "audio.start"
        assert isinstance(ws.recv(timeout=60), bytes)
        assert engine.snapshot().active >= 1
    # both sentences would run for thousands of frames: only a cancel frees their slots this soon
    until(lambda: _idle(engine), timeout=30, what="the session's slots freed after the client left")
    # a request leaves its slot before the audio stage ends it (and counts its outcome)
    until(lambda: sum(grown(before, engine.stats.outcomes).values()) >= 2, timeout=30,
          what="both sentences' ends counted")
    assert grown(before, engine.stats.outcomes) == {("eager", "cancelled (client gone)"): 2}


def test_a_sentence_that_fails_is_the_sessions_last_word_naming_it():
    """A sentence's request ends with an error (here the server's deadline, far shorter than the thousands
    of frames asked): one error naming the sentence, no audio.done for it, no later sentence, close 1008."""
    from omni_tts.engine.engine import Engine

    engine = Engine.from_config(EngineConfig(model=str(fixture_dir("custom_voice")), device="cpu", max_num_seqs=2,
                                             max_seq_len=4096, mode="eager", request_timeout_s=0.3,
                                             initial_chunk_frames=1, chunk_frames=2))
    try:
        with serve_app(build_app(engine)) as http, connect(http.replace("http://", "ws://") +
                                                           "/v1/audio/speech/stream") as ws:
            ws.send(json.dumps({**CONFIG, "max_new_tokens": 4000}))
            ws.send(json.dumps({"type": "input.text", "text": "A long one. And another."}))
            ws.send(json.dumps({"type": "input.done"}))
            got = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    m = ws.recv(timeout=60)
                    got.append(m if isinstance(m, bytes) else json.loads(m))
        events = [m for m in got if isinstance(m, dict)]
        assert events[0]["type"] == "audio.start" and events[0]["sentence_index"] == 0
        assert events[-1]["type"] == "error" and events[-1]["sentence_index"] == 0
        assert "deadline" in events[-1]["message"] and len(events) == 2
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    finally:
        engine.shutdown()


def test_the_socket_is_read_while_sentences_wait_so_a_close_cancels_them(server):
    """Thirty sentences queued behind the two that run: the client's close frame is still read at once (as
    its pings are), so the session ends and the sentences not yet spoken are cancelled, not synthesized."""
    url, engine = server
    until(lambda: _idle(engine), timeout=30, what="an idle engine")
    before = dict(engine.stats.outcomes)
    text = " ".join(f"Sentence number {i} is here." for i in range(30))
    with connect(url, close_timeout=60) as ws:
        ws.send(json.dumps({**CONFIG, "max_new_tokens": 40}))
        ws.send(json.dumps({"type": "input.text", "text": text}))
        ws.send(json.dumps({"type": "input.done"}))
        while not (isinstance(m := ws.recv(timeout=60), str) and json.loads(m)["type"] == "audio.done"):
            pass
    until(lambda: _idle(engine), timeout=30, what="the session's slots freed after the client closed")
    until(lambda: not engine.schedulers[engine.default_mode].waiting.qsize(), timeout=30, what="nothing waiting")
    grew = grown(before, engine.stats.outcomes)
    # the first sentence, and those running or being submitted at the close: not the thirty
    assert set(grew) <= {("eager", "done"), ("eager", "cancelled (client gone)")} and sum(grew.values()) <= 5
