"""The start-up timing tool over the real app (a process of its own) on the tiny checkpoint, on CPU."""

from __future__ import annotations

from _fixtures import FIXTURES, free_port

from omni_tts.tools import start_timing


def test_start_timing_times_the_page_then_eager_requests_and_stops_the_app():
    port = free_port()
    res = start_timing.measure(["--model", str(FIXTURES / "custom_voice")], requests=2, frames=6,
                               wait_for="eager ready", limit=180, port=port)
    assert res["page_s"] is not None and res["page_s"] > 0
    assert len(res["requests"]) == 2
    for r in res["requests"]:
        assert r["status"] == 200 and "error" not in r, r
        assert 0 < r["first_audio_s"] <= r["total_s"] and r["output_seconds"] > 0
        assert 0 <= r["queue_ms"] <= r["ttfp_ms"]  # the engine's own figures, from the stream's usage
    assert res["requests"][0]["sent_s"] >= res["page_s"]
    assert res["requests"][1]["sent_s"] >= res["requests"][0]["sent_s"] + res["requests"][0]["total_s"]
    assert res["wait_for_seen_s"] is not None
    assert any("page served" in line for line in res["log"])
    assert res["exit_code"] == 0  # stopped at the end, with its own clean exit


def test_an_app_that_fails_to_start_is_reported_with_its_last_lines(tmp_path):
    """No page, no requests, its exit code, and the lines that say why (kept only for an unclean exit)."""
    res = start_timing.measure(["--model", str(tmp_path / "missing")], requests=2, frames=6,
                               wait_for="eager ready", limit=120, port=free_port())
    assert res["page_s"] is None and res["requests"] == []
    assert res["exit_code"] == 2
    assert any("error:" in line and "missing" in line for line in res["log_tail"])
