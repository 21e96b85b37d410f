"""The open-loop load tool (omni_tts.tools.openloop) against a real headless server of the tiny checkpoint:
every scheduled request is counted once by status, underrun comes from the chunks' real arrival times;
the player arithmetic and the sweep's bisection on constructed inputs."""

from __future__ import annotations

import argparse
import asyncio
import json

import pytest
from test_server import start_headless, stop

from omni_tts.tools import openloop

BPS = 2 * 24000  # pcm bytes per second of audio


@pytest.fixture(scope="module")
def server():
    url, proc = start_headless()
    yield url
    stop(proc)


def test_lateness_plays_each_chunk_in_real_time_from_the_first():
    # 0.5 s of audio per chunk; playback needs chunk k at 0.2 + 0.5 k
    assert openloop.lateness([(0.2, BPS // 2), (0.6, BPS // 2), (1.1, BPS // 2)], BPS) == pytest.approx(0.0)
    assert openloop.lateness([(0.2, BPS // 2), (0.85, BPS // 2), (1.0, BPS)], BPS) == pytest.approx(0.15)
    assert openloop.lateness([(0.3, BPS)], BPS) == 0.0 and openloop.lateness([], BPS) == 0.0
    records = [openloop.Record(0.0, "200", [(0.1, BPS // 2), (0.62, BPS // 2)], 0.7),  # 20 ms late: within 100 ms
               openloop.Record(0.1, "200", [(0.1, BPS // 2), (0.75, BPS // 2)], 0.8),  # 150 ms late: an underrun
               openloop.Record(0.2, "503"), openloop.Record(0.3, "ReadTimeout")]
    r = openloop.report(records, 2.0, 2.0, 2.0)
    assert (r["sent"], r["done"], r["statuses"]) == (4, 2, {"200": 2, "503": 1, "ReadTimeout": 1})
    assert r["underrun_share"] == 0.5 and r["max_lateness_ms"] == pytest.approx(150.0)
    assert r["ttfp_ms_p50"] == pytest.approx(100.0) and r["audio_s_per_s"] == pytest.approx(1.0)


def test_sweep_bisects_for_the_highest_rate_meeting_the_target():
    def measure(rate: float) -> dict:  # p95 TTFP grows with the rate; the target is met up to 6 req/s
        return {"rate": rate, "sent": 10, "done": 10, "ttfp_ms_p95": 8.0 * rate, "underrun_share": 0.0}

    best, results = openloop.sweep(measure, 1.0, 16.0, 4, 50.0)
    assert 5.0 <= best <= 6.25 and [r["rate"] for r in results][:2] == [16.0, 1.0] and len(results) == 6
    assert openloop.sweep(measure, 8.0, 16.0, 4, 50.0)[0] is None


def test_open_loop_run_against_the_server(server, tmp_path):
    rate, duration, seed = 3.0, 2.0, 7
    sent = len(openloop.arrivals(rate, duration, seed))
    out = tmp_path / "openloop.json"
    args = openloop.add_arguments(argparse.ArgumentParser()).parse_args(
        ["--http", server, "--rate", str(rate), "--duration", str(duration), "--seed", str(seed),
         "--max-new-tokens", "12", "--voice", "ryan", "--json", str(out)])
    assert openloop.main(args) == 0
    data = json.loads(out.read_text())
    (r,) = data["results"]
    assert sent > 0 and r["sent"] == sent and sum(r["statuses"].values()) == sent
    assert r["statuses"] == {"200": sent} and r["done"] == sent
    assert 0 < r["ttfp_ms_p50"] <= r["ttfp_ms_p95"] <= r["ttfp_ms_p99"] <= r["e2e_ms_p99"]
    assert r["underrun_share"] is not None and 0 <= r["underrun_share"] <= 1 and r["audio_s_per_s"] > 0
    assert data["rates"] == [rate] and data["command"] and len(data["commit"]) == 40


def test_bad_requests_are_counted_by_status(server):
    records, wall = asyncio.run(openloop.run(server, 4.0, 1.0, {
        "response_format": "pcm", "stream": True, "voice": "nobody", "max_new_tokens": 5}, seed=1))
    r = openloop.report(records, wall, 4.0, 1.0)
    assert r["sent"] == len(openloop.arrivals(4.0, 1.0, 1)) and r["statuses"] == {"400": r["sent"]}
    assert r["done"] == 0 and r["underrun_share"] is None and r["ttfp_ms_p95"] is None
