"""The start-up profile tool on the tiny checkpoint, on CPU: real engine, real sampling."""

from __future__ import annotations

from _fixtures import FIXTURES

from omni_tts.config import load_preset
from omni_tts.tools import start_profile


def test_start_profile_times_each_request_and_samples_the_first_ones_threads():
    """Also: an eager scheduler that compiles nothing imports nothing (Dynamo) on its first request's path."""
    config = load_preset("default", model=str(FIXTURES / "custom_voice"), modes=["eager"], mode="eager")
    res = start_profile.measure(config, requests=2, frames=6, page_s=0.2)
    assert [r["sent_s"] >= 0.2 for r in res["requests"]] == [True, True]
    for r in res["requests"]:
        assert 0 <= r["queue_ms"] <= r["ttfp_ms"] and r["first_audio_s"] > 0
    assert res["requests"][1]["sent_s"] > res["requests"][0]["sent_s"] + res["requests"][0]["first_audio_s"]
    assert any("eager path primed" in line for _, line in res["log"])
    scheduler = res["first_request_threads"]["omni-tts-eager"]  # the scheduler that served it was sampled working
    assert scheduler["samples"] >= 1
    assert all(place.count(" | ") == 2 for place, _ in scheduler["top"])
    assert any("omni_tts/" in place for place, _ in scheduler["top"])
    importing = sum(n for place, n in scheduler["top"] if place.startswith("importing"))
    assert importing <= scheduler["samples"] // 5, scheduler["top"]
