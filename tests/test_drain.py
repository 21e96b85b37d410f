"""A shutdown that drains: the engine refuses new requests while those it accepted finish whole (a long
text counted once), and the HTTP service's `Server.close` keeps answering meanwhile: /ready and new
requests 503, an accepted stream delivered to its end, then the engine and the server stop; the grace
from the environment. Tiny CustomVoice checkpoint, eager, CPU, a real uvicorn server."""

from __future__ import annotations

import threading

import httpx
import numpy as np
import pytest
from _serving import WAIT_S, params, serve, tiny_config, until

from omni_tts.engine.engine import Engine
from omni_tts.errors import Cancelled, EngineError, InputError
from omni_tts.serving.settings import PUBLIC_MAX_NEW_TOKENS_ENV, SHUTDOWN_GRACE_ENV, ServeSettings

SENTENCE = "The river ran past the old mill before dawn. "


def test_a_drain_refuses_new_requests_and_waits_for_the_accepted_ones_to_finish():
    engine = Engine.from_config(tiny_config(max_num_seqs=2))
    try:
        long = engine.submit(params(text=SENTENCE * 20, max_new_tokens=6))  # segments: counted as one
        short = engine.submit(params(fixed_frames=40))
        assert engine.drain(0) is False  # both still run
        with pytest.raises(EngineError, match="shutting down"):
            engine.submit(params())
        assert engine.drain(WAIT_S) is True
        assert long.metrics.status == short.metrics.status == "done"
        assert len(short.result().codes) == 40 and len(long.result().codes) > 0
        assert len(long._handles) == len(long.segments) > 2  # one ahead at a time: most after the drain began
        assert engine.stats.outcomes == {("eager", "done"): 2}
    finally:
        engine.shutdown()


def _stream(url: str, body: dict, accepted: threading.Event, out: dict) -> None:
    with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=WAIT_S) as r:
        out["status"] = r.status_code
        accepted.set()
        out["pcm"] = b"".join(r.iter_bytes())


def test_closing_the_server_finishes_accepted_streams_and_refuses_new_requests():
    engine = Engine.from_config(tiny_config(max_num_seqs=2))
    body = {"input": "Streamed to its end.", "voice": "ryan", "response_format": "pcm", "stream": True,
            "max_new_tokens": 40, "seed": 7}
    whole = engine.submit(params(text=body["input"], max_new_tokens=40, seed=7)).result(timeout=WAIT_S).wav
    server, url = serve(engine, ServeSettings(graceful_shutdown_s=int(WAIT_S)))
    holder = engine.submit(params(fixed_frames=400))  # keeps the drain open until the test cancels it
    accepted, got = threading.Event(), {}
    client = threading.Thread(target=_stream, args=(url, body, accepted, got))
    client.start()
    assert accepted.wait(WAIT_S) and got["status"] == 200
    closer = threading.Thread(target=server.close, args=(engine,))
    closer.start()
    try:
        until(lambda: engine.draining, what="the drain")
        ready = httpx.get(url + "/ready", timeout=WAIT_S)
        assert ready.status_code == 503 and ready.json()["draining"] is True and ready.json()["ready"] is False
        refused = httpx.post(url + "/v1/audio/speech", json={"input": "Late.", "voice": "ryan"}, timeout=WAIT_S)
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
        assert refused.headers["retry-after"]
        assert "\nomni_tts_draining 1.0\n" in httpx.get(url + "/metrics", timeout=WAIT_S).text
        client.join(WAIT_S)
        expected = (np.clip(whole, -1, 1) * 32767).astype(np.int16)
        pcm = np.frombuffer(got["pcm"], "<i2")
        assert pcm.shape == expected.shape and np.abs(pcm.astype(int) - expected).max() <= 1  # whole, not cut
        assert closer.is_alive()  # the holder still runs: the drain goes on
    finally:
        holder.cancel()
    closer.join(WAIT_S)
    assert not closer.is_alive()
    with pytest.raises(Cancelled):
        holder.result(timeout=WAIT_S)
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health", timeout=5)
    with pytest.raises(EngineError, match="shut down"):
        engine.submit(params())


def test_the_grace_and_the_anonymous_cap_come_from_the_environment_or_one_clear_error():
    got = ServeSettings.from_env("0.0.0.0", env={SHUTDOWN_GRACE_ENV: " 30 ", PUBLIC_MAX_NEW_TOKENS_ENV: "0"})
    assert got.graceful_shutdown_s == 30 and got.public_max_new_tokens is None
    assert ServeSettings.from_env("0.0.0.0", env={}).graceful_shutdown_s == ServeSettings().graceful_shutdown_s
    for name, raw in ((SHUTDOWN_GRACE_ENV, "ten"), (SHUTDOWN_GRACE_ENV, "-1"), (PUBLIC_MAX_NEW_TOKENS_ENV, "1e3")):
        with pytest.raises(InputError, match=f"{name} must be a whole number >= 0 \\(got '{raw}'\\)"):
            ServeSettings.from_env("0.0.0.0", env={name: raw})
