"""The service's request log: one line per request the engine ends (however many apps serve the engine),
naming its id, outcome, mode, audio and latencies; an error's line is a warning with its message; the
settings turn it off. Tiny CustomVoice checkpoint, eager, CPU."""

from __future__ import annotations

import logging

import pytest
from _serving import WAIT_S, params, tiny_config

from omni_tts.engine.engine import Engine
from omni_tts.engine.metrics import RequestMetrics
from omni_tts.errors import Cancelled
from omni_tts.serving import request_log
from omni_tts.serving.app import build_app
from omni_tts.serving.settings import LOG_REQUESTS_ENV, ServeSettings

LOGGER = "omni_tts.requests"


def test_each_request_the_engine_ends_is_one_line_with_its_outcome(caplog):
    engine = Engine.from_config(tiny_config(max_num_seqs=2))
    try:
        build_app(engine, ServeSettings())
        build_app(engine, ServeSettings())  # a second app over the same engine adds no second line
        with caplog.at_level(logging.INFO, logger=LOGGER):
            done = engine.submit(params(max_new_tokens=6)).result(timeout=WAIT_S)
            left = engine.submit(params(fixed_frames=400))
            next(iter(left.stream(timeout=WAIT_S)))
            left.cancel("client gone")
            with pytest.raises(Cancelled):
                left.result(timeout=WAIT_S)
        records = [r for r in caplog.records if r.name == LOGGER]
        assert [r.levelno for r in records] == [logging.INFO, logging.INFO]
        m = done.metrics
        assert records[0].getMessage() == (
            f"request #{m.request_id} done (eager): {m.audio_s:.2f} s of audio ({len(done.codes)} frames), TTFP "
            f"{m.ttfp_ms:.0f} ms (queued {m.queue_ms:.0f} ms), E2E {m.e2e_ms:.0f} ms, RTF {m.rtf:.3f}")
        assert records[1].getMessage().startswith(f"request #{left.id} cancelled (client gone) (eager): ")
    finally:
        engine.shutdown()


def test_an_error_is_a_warning_with_its_message_and_the_log_can_be_turned_off(caplog):
    m = RequestMetrics(7, "default", accepted_at=1.0, finished_at=2.5, status="error", error="deadline passed",
                       reason="deadline exceeded")
    assert request_log.line(m) == ("request #7 error (deadline exceeded) (default): 0.00 s of audio (0 frames), "
                                   "E2E 1500 ms, deadline passed")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        request_log._observe(m)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.WARNING, request_log.line(m))]
    caplog.clear()
    off = ServeSettings.from_env("127.0.0.1", env={LOG_REQUESTS_ENV: "0"})
    assert not off.log_requests and ServeSettings.from_env("127.0.0.1", env={}).log_requests
    engine = Engine.from_config(tiny_config(max_num_seqs=1))
    try:
        build_app(engine, off)
        with caplog.at_level(logging.INFO, logger=LOGGER):
            engine.submit(params(max_new_tokens=4)).result(timeout=WAIT_S)
        assert not [r for r in caplog.records if r.name == LOGGER]
    finally:
        engine.shutdown()


def test_requests_a_shutdown_ends_are_warnings_that_say_so(caplog):
    """Running and waiting requests the engine's shutdown ends: outcome 'cancelled (engine shut down)', a
    warning with the message their callers get, not a quiet cancel."""
    engine = Engine.from_config(tiny_config(max_num_seqs=1))
    build_app(engine, ServeSettings())
    with caplog.at_level(logging.INFO, logger=LOGGER):
        running = engine.submit(params(fixed_frames=400))
        next(iter(running.stream(timeout=WAIT_S)))
        waiting = engine.submit(params(max_new_tokens=4))
        engine.shutdown()
    records = sorted((r for r in caplog.records if r.name == LOGGER), key=lambda r: r.getMessage())
    assert [r.levelno for r in records] == [logging.WARNING, logging.WARNING]
    for r, h in zip(records, sorted([running, waiting], key=lambda h: f"request #{h.id}")):
        assert r.getMessage().startswith(f"request #{h.id} cancelled (engine shut down) (eager): ")
        assert r.getMessage().endswith("the engine shut down")
