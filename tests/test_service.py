"""The HTTP service under careless and hostile clients: real uvicorn servers over build_app on free ports,
the real engine on the tiny checkpoint (CPU), clients over real sockets (raw connections, httpx, the
`openai` client). A client that leaves frees its slot; a full mode answers 503; health, readiness and
Prometheus metrics. Bad bodies and server limits: tests/test_service_limits.py."""

from __future__ import annotations

import json

import httpx
import pytest
from _serving import LONG, SHORT, WAIT_S, Ended, Leaver, serve, tiny_config, until
from prometheus_client.parser import text_string_to_metric_families

from omni_tts.config import SynthesisParams
from omni_tts.engine.engine import Engine
from omni_tts.errors import DeadlineExceeded
from omni_tts.serving.settings import ServeSettings

SLOTS, WAITING = 4, 4
NATURAL_FRAMES = LONG["max_new_tokens"] - 1  # what an abandoned request would make if nobody stopped it


@pytest.fixture(scope="module")
def service():
    """(url, engine, ended): 4 slots and 4 waiting places for the eager mode."""
    engine = Engine.from_config(tiny_config(max_num_seqs=SLOTS, max_waiting=WAITING))
    ended = Ended(engine)
    server, url = serve(engine)
    yield url, engine, ended
    engine.shutdown()
    server.stop()


def _idle(engine) -> bool:
    snap = engine.snapshot()
    return snap.active == 0 and snap.waiting == 0


@pytest.mark.parametrize("how", [{"stream_format": "sse", "response_format": "pcm"},
                                 {"stream_format": "audio", "response_format": "wav"},
                                 {"stream": True, "response_format": "pcm"}], ids=["sse", "wav-stream", "pcm"])
def test_eight_clients_that_leave_free_every_slot_and_place(service, how):
    url, engine, ended = service
    until(lambda: _idle(engine), what="an idle engine")
    clients = [Leaver(url, {**LONG, **how}) for _ in range(SLOTS + WAITING)]
    ids = []
    for c in clients:
        status, rid = c.status()  # the headers: the request is in the engine (in a slot or a waiting place)
        assert status == 200
        ids.append(rid)
    admitted = sorted(ids)[:SLOTS]  # slots are taken in submit order
    for c, rid in zip(clients, ids):  # the clients in a slot wait for their first audio, the others for nothing
        if rid in admitted:
            assert len(c.read(16)) == 16
    for c in clients:
        c.leave()
    gone = ended.wait(ids)
    assert [m.outcome for m in gone] == ["cancelled (client gone)"] * len(ids), [m.outcome for m in gone]
    assert all(m.frames < NATURAL_FRAMES for m in gone), [m.frames for m in gone]
    assert _idle(engine)  # nothing of theirs holds a slot or a place
    rows = engine.snapshot().busy_slots_sum
    r = httpx.post(url + "/v1/audio/speech", json=SHORT, timeout=WAIT_S)
    assert r.status_code == 200 and r.content[:4] == b"RIFF"
    short = ended.wait([int(r.headers["x-request-id"])])[0]
    # every frame step while it ran was its own: no abandoned request was still being made beside it
    assert short.frames == SHORT["max_new_tokens"] - 1
    assert engine.snapshot().busy_slots_sum - rows == short.frames


def test_a_whole_clip_whose_client_hung_up_while_waiting_is_cancelled(service):
    url, engine, ended = service
    until(lambda: _idle(engine), what="an idle engine")
    known = set(ended.by_id)
    client = Leaver(url, LONG)  # a whole wav: nothing is sent before the clip is finished
    until(lambda: engine.snapshot().active == 1, what="the request in a slot")
    client.leave()
    m = ended.wait_new(known)[0]
    assert m.outcome == "cancelled (client gone)" and m.frames < NATURAL_FRAMES


def test_a_full_mode_answers_503_with_retry_after_and_admitted_requests_finish(service):
    from openai import APIStatusError, OpenAI

    url, engine, ended = service
    until(lambda: _idle(engine), what="an idle engine")
    body = {**LONG, "max_new_tokens": 120, "stream": True, "response_format": "pcm"}  # none ends before the probes
    clients = [Leaver(url, body) for _ in range(SLOTS + WAITING)]
    ids = [c.status()[1] for c in clients]
    until(lambda: (engine.snapshot().active, engine.snapshot().waiting) == (SLOTS, WAITING),
          what="every slot and waiting place taken")
    r = httpx.post(url + "/v1/audio/speech", json=SHORT, timeout=WAIT_S)
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
    err = r.json()["error"]
    assert err["type"] == "overloaded" and "busy" in err["message"] and "\n" not in err["message"]
    with pytest.raises(APIStatusError) as e:
        OpenAI(base_url=url + "/v1", api_key="x", max_retries=0).audio.speech.create(
            model="x", voice="ryan", input="Busy?", extra_body={"max_new_tokens": 6})
    assert e.value.status_code == 503
    pcm = [len(c.r.read()) for c in clients]  # the admitted and the waiting ones all finish their clips
    done = ended.wait(ids)
    assert [m.outcome for m in done] == ["done"] * len(ids)
    assert pcm == [m.frames * 1920 * 2 for m in done]
    assert engine.stats.outcomes[("eager", "refused (overloaded)")] >= 2


def test_clients_that_leave_while_waiting_free_their_places_at_once(service):
    url, engine, ended = service
    until(lambda: _idle(engine), what="an idle engine")
    body = {**LONG, "stream": True, "response_format": "pcm"}
    admitted = [Leaver(url, body) for _ in range(SLOTS)]
    for c in admitted:
        c.status()
    until(lambda: engine.snapshot().active == SLOTS, what="every slot taken")
    waiting = [Leaver(url, body) for _ in range(WAITING)]  # sent once the slots are full: they wait
    ids = [c.status()[1] for c in waiting]
    assert engine.snapshot().waiting == WAITING
    for c in waiting:
        c.leave()
    gone = ended.wait(ids)
    assert [(m.outcome, m.frames) for m in gone] == [("cancelled (client gone)", 0)] * WAITING
    assert engine.snapshot().active == SLOTS  # the admitted ones run on meanwhile
    late = Leaver(url, body)
    assert late.status()[0] == 200  # a freed place, not a 503
    for c in [*admitted, late]:
        c.leave()
    until(lambda: _idle(engine), what="an idle engine")


def _families(url: str) -> dict:
    r = httpx.get(url + "/metrics", timeout=WAIT_S)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def _value(families: dict, family: str, sample: str, **labels) -> float:
    return sum(s.value for s in families[family].samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


def test_health_ready_model_card_and_prometheus_metrics_move_with_requests(service):
    url, engine, ended = service
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    ready = httpx.get(url + "/ready")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    assert ready.json()["modes"]["eager"]["state"] == "ready" and ready.json()["modes"]["eager"]["default"]
    name = httpx.get(url + "/v1/models").json()["data"][0]["id"]
    assert httpx.get(f"{url}/v1/models/{name}").json()["id"] == name
    missing = httpx.get(url + "/v1/models/gpt-4o-mini-tts")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    until(lambda: _idle(engine), what="an idle engine")
    before = _families(url)
    ids = [int(httpx.post(url + "/v1/audio/speech", json=SHORT, timeout=WAIT_S).headers["x-request-id"])
           for _ in range(2)]
    frames = sum(m.frames for m in ended.wait(ids))
    after = _families(url)
    done = dict(mode="eager", outcome="done")
    assert _value(after, "omni_tts_requests", "omni_tts_requests_total", **done) == \
        _value(before, "omni_tts_requests", "omni_tts_requests_total", **done) + 2
    for hist in ("omni_tts_ttfp_seconds", "omni_tts_e2e_seconds", "omni_tts_rtf"):
        assert _value(after, hist, hist + "_count", mode="eager") == \
            _value(before, hist, hist + "_count", mode="eager") + 2
    parts, h = ("queued", "first_codes", "first_chunk"), "omni_tts_ttfp_part_seconds"
    for part in parts:
        assert _value(after, h, h + "_count", mode="eager", part=part) == \
            _value(before, h, h + "_count", mode="eager", part=part) + 2
    added = sum(_value(after, h, h + "_sum", mode="eager", part=p) - _value(before, h, h + "_sum", mode="eager", part=p)
                for p in parts)  # the parts add up to the TTFP
    t = "omni_tts_ttfp_seconds"
    ttfp = _value(after, t, t + "_sum", mode="eager") - _value(before, t, t + "_sum", mode="eager")
    assert added == pytest.approx(ttfp)
    assert _value(after, "omni_tts_frames", "omni_tts_frames_total") - \
        _value(before, "omni_tts_frames", "omni_tts_frames_total") == frames
    assert _value(after, "omni_tts_running_requests", "omni_tts_running_requests", mode="eager") == 0
    assert _value(after, "omni_tts_waiting_requests", "omni_tts_waiting_requests", mode="eager") == 0
    assert _value(after, "omni_tts_mode_state", "omni_tts_mode_state", mode="eager", state="ready") == 1
    assert _value(after, "omni_tts_mode_state", "omni_tts_mode_state", mode="eager", state="warming") == 0
    assert _value(after, "omni_tts_draining", "omni_tts_draining") == 0


def test_a_public_bind_caps_anonymous_lengths_and_the_admin_token_lifts_the_cap(service):
    url, engine, ended = service
    settings = ServeSettings(public=True, admin_token="s3cret", public_max_new_tokens=12)
    server, public = serve(engine, settings)
    try:
        over = httpx.post(public + "/v1/audio/speech", json={**SHORT, "max_new_tokens": 20}, timeout=WAIT_S)
        assert over.status_code == 400 and over.json()["error"]["param"] == "max_new_tokens"
        plain = httpx.post(public + "/v1/audio/speech", json={k: v for k, v in SHORT.items() if k != "max_new_tokens"},
                           timeout=WAIT_S)
        admin = httpx.post(public + "/v1/audio/speech", json={**SHORT, "max_new_tokens": 20}, timeout=WAIT_S,
                           headers={"Authorization": "Bearer s3cret"})
        assert plain.status_code == admin.status_code == 200
        capped, lifted = ended.wait([int(plain.headers["x-request-id"]), int(admin.headers["x-request-id"])])
        assert capped.frames == 11 and lifted.frames == 19  # the cap is the default of those who name none
    finally:
        server.stop()


@pytest.fixture(scope="module")
def deadline_service():
    """(url, engine, ended): a 1 s deadline; not warmed before the test asks for readiness."""
    engine = Engine.from_config(tiny_config(max_num_seqs=2, request_timeout_s=1.0), wait=False, warm=False)
    ended = Ended(engine)
    server, url = serve(engine)
    yield url, engine, ended
    engine.shutdown()
    server.stop()


def test_ready_answers_503_until_a_mode_serves(deadline_service):
    url, engine, _ = deadline_service
    r = httpx.get(url + "/ready")
    assert r.status_code == 503 and r.json() == {"ready": False, "draining": False, "modes": {"eager": {
        "state": "queued", "serving": False, "progress": [0, 0], "default": True}}}
    assert httpx.get(url + "/health").status_code == 200  # alive all the same
    assert httpx.head(url + "/ready").status_code == 503 and httpx.head(url + "/health").status_code == 200
    engine.start_warming()
    assert engine.wait_ready(timeout=WAIT_S)
    assert httpx.get(url + "/ready").status_code == 200
    head = httpx.head(url + "/ready")  # a HEAD probe: the status, no body
    assert head.status_code == 200 and head.content == b""


def test_past_the_deadline_a_request_ends_with_a_clear_error_on_every_path(deadline_service):
    url, engine, ended = deadline_service
    engine.start_warming()
    assert engine.wait_ready(timeout=WAIT_S)
    whole = httpx.post(url + "/v1/audio/speech", json=LONG, timeout=WAIT_S)
    assert whole.status_code == 504 and "deadline" in whole.json()["error"]["message"]
    whole_id = int(whole.headers["x-request-id"])  # named as a clip's answer would be
    with httpx.stream("POST", url + "/v1/audio/speech", json={**LONG, "stream_format": "sse"},
                      timeout=WAIT_S) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] == "error" and "deadline" in events[-1]["error"]["message"]
    assert (events[-1]["error"]["type"], events[-1]["error"]["code"]) == ("timeout", 504)  # as the whole clip's
    sse_id = int(r.headers["x-request-id"])
    with pytest.raises(httpx.RemoteProtocolError):  # a cut transfer, not a clean end of a short clip
        with httpx.stream("POST", url + "/v1/audio/speech", json={**LONG, "stream": True}, timeout=WAIT_S) as r:
            for _ in r.iter_raw():
                pass
    outcomes = ended.wait([whole_id, sse_id, int(r.headers["x-request-id"])])
    assert {m.outcome for m in outcomes} == {"error (deadline exceeded)"}
    assert all(0 < m.frames < NATURAL_FRAMES for m in outcomes)
    assert all(m.audio_samples == m.frames * 1920 for m in outcomes)  # its frames are those of its audio


def test_a_request_that_waits_past_the_deadline_ends_without_a_slot():
    # an engine of its own whose mode is not warmed, so no slot can open before the deadline (under full
    # slots the holders, accepted earlier, expire first and free one: a race, not a test)
    engine = Engine.from_config(tiny_config(max_num_seqs=2, request_timeout_s=1.0), wait=False, warm=False)
    ended = Ended(engine)
    try:
        params = SynthesisParams(text=LONG["input"], speaker="ryan", max_new_tokens=LONG["max_new_tokens"], seed=3)
        handles = [engine.submit(params) for _ in range(3)]
        outcomes = ended.wait([h.id for h in handles])
        assert {m.outcome for m in outcomes} == {"error (deadline exceeded)"}
        assert all(m.frames == 0 and m.started_at is None for m in outcomes)
        with pytest.raises(DeadlineExceeded, match="request_timeout_s"):
            handles[2].result(0)
        assert engine.snapshot().waiting == 0
    finally:
        engine.shutdown()


def test_a_shutdown_ends_an_open_sse_stream_with_an_error_event():
    engine = Engine.from_config(tiny_config(max_num_seqs=1))
    server, url = serve(engine)
    try:
        with httpx.stream("POST", url + "/v1/audio/speech", json={**LONG, "stream_format": "sse"},
                          timeout=WAIT_S) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert json.loads(first[6:])["type"] == "speech.audio.delta"
            engine.shutdown()
            last = [json.loads(line[6:]) for line in lines if line.startswith("data: ")][-1]
        assert last["type"] == "error" and "shut down" in last["error"]["message"]
        assert (last["error"]["type"], last["error"]["code"]) == ("server_error", 503)
        after = httpx.post(url + "/v1/audio/speech", json=SHORT, timeout=WAIT_S)
        assert after.status_code == 503 and "shut down" in after.json()["error"]["message"]
    finally:
        engine.shutdown()
        server.stop()
