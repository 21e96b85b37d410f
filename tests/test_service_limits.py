"""The HTTP service's bounds, on a real uvicorn server over build_app and the tiny checkpoint (CPU): every
bad body is one JSON 4xx naming its field (never a traceback), JSON only, headers that never complete
and oversized ones are cut off, a reader that falls too far behind ends its request."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest
from _serving import LONG, SHORT, WAIT_S, Ended, serve, tiny_config

from omni_tts.engine.engine import Engine
from omni_tts.serving.app import build_app
from omni_tts.serving.settings import ServeSettings
from omni_tts.serving.streams import StreamAborted

SPEECH = "/v1/audio/speech"


@pytest.fixture(scope="module")
def service():
    """(url, engine, ended): headers must complete within half a second; a reader may lag 256 kB (the
    long clip is 1.1 MB)."""
    engine = Engine.from_config(tiny_config(max_num_seqs=2))
    ended = Ended(engine)
    server, url = serve(engine, ServeSettings(header_timeout_s=0.5, stream_buffer_bytes=256 << 10))
    yield url, engine, ended
    engine.shutdown()
    server.stop()


def _raw(text: str) -> bytes:
    return text.encode()


@pytest.mark.parametrize("body, param, words", [
    (_raw('{"input": "hi", "seed": ' + "9" * 5001 + "}"), "seed", "outside JSON's safe integer range"),
    (_raw('{"input": "hi", "voice": ' + "[" * 5000 + "]" * 5000 + "}"), "voice", "nested too deeply"),
    (_raw('{"input": "hi", "seed": 9007199254740992}'), "seed", "outside JSON's safe integer range"),
    (_raw('{"input": "hi", "seed": -9007199254740992}'), "seed", "outside JSON's safe integer range"),
    (_raw('{"input": "hi", "top_p": NaN}'), "top_p", "not a JSON number"),
    (_raw('{"input": "hi", "temperature": 1e400}'), "temperature", "not a finite number"),
    (_raw('{"input": "hi", "input": "again"}'), "input", "given twice"),
    (_raw('{"input": "hi", "voice": ["ryan"]}'), "voice", "voice"),
    (_raw('{"input": "hi"} trailing'), None, "text after the object"),
    (_raw('["input"]'), None, "must be a JSON object"),
    (_raw('{"input": "hi", "seed": }'), "seed", "not valid JSON"),
    (b'{"input": "\xff"}', None, "not valid UTF-8"),
])
def test_every_bad_body_is_a_json_400_naming_its_field(service, body, param, words):
    url, _, _ = service
    r = httpx.post(url + SPEECH, content=body, headers={"Content-Type": "application/json"}, timeout=WAIT_S)
    err = r.json()["error"]
    assert r.status_code == 400 and words in err["message"] and err["param"] == param, err
    assert "\n" not in err["message"] and "Traceback" not in r.text
    assert httpx.post(url + SPEECH, json=SHORT, timeout=WAIT_S).status_code == 200  # the server serves on


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                          None])
def test_a_body_that_is_not_sent_as_json_is_a_415(service, content_type):
    """A cross-site form can send text/plain or a form without a preflight: it must start nothing."""
    url, engine, _ = service
    requests = engine.stats.outcomes.copy()
    headers = {"Content-Type": content_type} if content_type else {}
    r = httpx.post(url + SPEECH, content=json.dumps(SHORT).encode(), headers=headers, timeout=WAIT_S)
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]
    assert engine.stats.outcomes == requests
    typed = httpx.post(url + SPEECH, content=json.dumps(SHORT).encode(), timeout=WAIT_S,
                       headers={"Content-Type": "application/json; charset=utf-8"})
    assert typed.status_code == 200


def test_an_unknown_voice_is_quoted_as_given(service):
    url, _, _ = service
    r = httpx.post(url + SPEECH, json={**SHORT, "voice": "../../etc/passwd"}, timeout=WAIT_S)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "voice"
    assert err["message"].startswith("unknown voice '../../etc/passwd'; valid: ") and "ryan" in err["message"]


def test_sse_usage_is_rounded(service):
    url, _, _ = service
    with httpx.stream("POST", url + SPEECH, json={**SHORT, "stream_format": "sse"}, timeout=WAIT_S) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    usage = events[-1]["usage"]
    assert events[-1]["type"] == "speech.audio.done" and usage["output_seconds"] == 0.4  # 5 frames of 80 ms
    for key in ("queue_ms", "ttfp_ms", "e2e_ms"):
        assert usage[key] == round(usage[key], 1)


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closes `sock` (reads until the end; WAIT_S at most)."""
    sock.settimeout(WAIT_S)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_connections_that_never_finish_their_headers_are_closed(service):
    url, _, _ = service
    host, port = url.removeprefix("http://").split(":")
    silent = socket.create_connection((host, int(port)))
    partial = socket.create_connection((host, int(port)))
    partial.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    try:
        assert _closed_by_server(silent) and _closed_by_server(partial)
    finally:
        silent.close()
        partial.close()
    assert httpx.get(url + "/health").status_code == 200


def test_a_connection_that_trickles_body_bytes_after_its_response_is_closed(service):
    """A declared body the route never reads: each byte it trickles after the response stopped uvicorn's
    keep-alive timer, so such connections stayed open for good (and enough of them took every slot)."""
    url, _, _ = service
    host, port = url.removeprefix("http://").split(":")
    for framing in (b"Content-Length: 1000\r\n", b"Transfer-Encoding: chunked\r\n"):
        with socket.create_connection((host, int(port)), timeout=WAIT_S) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n")
            reply = b""
            while b"\r\n\r\n" not in reply:
                reply += s.recv(65536)
            assert reply.startswith(b"HTTP/1.1 200 ")
            s.sendall(b"x" if framing.startswith(b"Content") else b"1\r\nx\r\n")  # then nothing more
            assert _closed_by_server(s), framing
    assert httpx.get(url + "/health").status_code == 200


def test_headers_are_counted_as_the_fewest_bytes_they_took(service):
    """Many small headers under the limit are served; a single write just over it is a 431."""
    url, _, _ = service
    host, port = url.removeprefix("http://").split(":")
    many = b"".join(b"a%d:b\r\n" % i for i in range(7000))  # ~62 KB of headers, counted as they were sent

    def send(block: bytes) -> bytes:
        with socket.create_connection((host, int(port)), timeout=WAIT_S) as s:
            s.sendall(block)
            reply = b""
            while b"\r\n" not in reply:
                reply += s.recv(65536)
            return reply

    head = b"GET /health HTTP/1.1\r\nHost: x\r\n"
    assert len(head + many + b"\r\n") < 64 << 10 and send(head + many + b"\r\n").startswith(b"HTTP/1.1 200 ")
    pad = (64 << 10) + 8 - len(head) - len(b"X-Big: \r\n\r\n")
    assert send(head + b"X-Big: " + b"x" * pad + b"\r\n\r\n").startswith(b"HTTP/1.1 431 ")  # 8 bytes over


def test_a_complete_header_block_over_the_limit_is_a_431_and_so_is_a_websocket_handshake_s(service):
    """Sent in one write, a 100 KiB header block arrives complete, past uvicorn's bound on incomplete ones."""
    url, _, _ = service
    host, port = url.removeprefix("http://").split(":")
    big = b"X-Big: " + b"x" * (100 << 10) + b"\r\n"
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += s.recv(65536)
    assert reply.startswith(b"HTTP/1.1 431 "), reply[:80]
    r = httpx.get(url + "/health", headers={"X-Fits": "x" * (32 << 10)}, timeout=WAIT_S)
    assert r.status_code == 200  # under the limit: served
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    ws_url = url.replace("http", "ws") + "/v1/audio/speech/stream"
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url, additional_headers={"X-Big": "x" * (100 << 10)}, open_timeout=WAIT_S)
    assert refused.value.response.status_code == 431
    with connect(ws_url, additional_headers={"X-Fits": "x" * 100}, open_timeout=WAIT_S):
        pass  # the same handshake under the limit opens


def test_a_request_framed_both_by_length_and_chunked_is_a_400_that_closes_the_connection(service):
    url, _, _ = service
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(SHORT).encode()
    chunked = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as s:
        s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(body) + chunked)
        reply = b""
        while chunk := s.recv(65536):  # the server closes after its answer
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400 ") and b"Transfer-Encoding" in reply, reply[:200]
    assert httpx.post(url + SPEECH, json=SHORT, timeout=WAIT_S).status_code == 200  # one framing: served


def test_oversized_headers_are_refused(service):
    url, _, _ = service
    try:
        status = httpx.get(url + "/health", headers={"X-Big": "x" * (1 << 20)}, timeout=WAIT_S).status_code
    except httpx.TransportError:  # cut off while it was still sending: refused all the same
        status = None
    assert status in (400, 431, None)
    assert httpx.get(url + "/health").status_code == 200


def test_a_reader_that_falls_too_far_behind_ends_its_request(service):
    """The app driven as uvicorn drives it, by a client whose socket stops taking bytes: its first write never
    completes (over a real socket the kernel's buffers, megabytes on loopback, would hold a test clip)."""
    _, engine, ended = service
    app = build_app(engine, ServeSettings(stream_buffer_bytes=16 << 10))
    body = json.dumps({**LONG, "stream": True, "response_format": "pcm"}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/audio/speech", "raw_path": b"/v1/audio/speech",
             "root_path": "", "query_string": b"", "headers": [(b"content-type", b"application/json")],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    started: list[int] = []

    async def receive() -> dict:
        if not started:
            started.append(0)
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client never leaves
        return {}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            started.append(int(dict(message["headers"])[b"x-request-id"]))
        elif message.get("body"):
            await asyncio.Event().wait()  # nor reads

    async def run() -> None:
        await asyncio.wait_for(app(scope, receive, send), WAIT_S)

    with pytest.raises(StreamAborted):  # uvicorn drops the connection: the stream is cut, not ended
        asyncio.run(run())
    m = ended.wait([started[1]])[0]
    assert m.outcome == "cancelled (slow reader)" and m.frames < LONG["max_new_tokens"] - 1


def test_a_client_that_leaves_mid_body_is_a_quiet_499():
    """The body's reader learns that the client left (Starlette's ClientDisconnect): an ApiError the route
    answers with, not an unexpected error logged with its traceback."""
    from starlette.requests import Request

    from omni_tts.serving import speech
    from omni_tts.serving.errors import ApiError

    messages = iter([{"type": "http.request", "body": b'{"input":', "more_body": True}, {"type": "http.disconnect"}])

    async def receive() -> dict:
        return next(messages)

    scope = {"type": "http", "method": "POST", "path": SPEECH, "headers": [(b"content-length", b"100")]}
    with pytest.raises(ApiError) as e:
        asyncio.run(speech._body(Request(scope, receive), ServeSettings()))
    assert e.value.status == 499 and "left before its request body arrived" in e.value.message


def test_a_body_that_is_not_json_is_refused_before_it_is_uploaded(service):
    """With 'Expect: 100-continue' the client waits for the server's go-ahead before sending its body: a
    non-JSON body gets its 415 at once, not a '100 Continue' asking for the upload first."""
    url, _, _ = service
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as s:
        s.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                  b"Content-Length: 100000\r\nExpect: 100-continue\r\n\r\n")
        first = s.recv(4096).split(b"\r\n", 1)[0]
    assert first == b"HTTP/1.1 415 Unsupported Media Type"
