"""The soak tool, briefly, on the tiny fixture checkpoint (CPU): mixed bursts with cancels and bad inputs
all end as expected, RSS is reported at warm-up, at a mark and at the end, each of its bad inputs is one
the engine refuses, and its checks catch a result whose audio and codes disagree."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _fixtures import fixture_dir

from omni_tts.config import SynthesisParams, build_config
from omni_tts.engine.engine import Engine
from omni_tts.engine.metrics import RequestMetrics
from omni_tts.engine.request import SynthesisResult
from omni_tts.errors import InputError
from omni_tts.tools.cli import main
from omni_tts.tools.soak import BAD_INPUTS, check, rss_mb


def test_a_short_soak_serves_every_kind_of_request_and_reports_memory(tmp_path: Path, capsys) -> None:
    out = tmp_path / "soak.json"
    rc = main(["soak", "--model", str(fixture_dir("custom_voice")), "--device", "cpu", "--mode", "eager",
               "--set", "max_num_seqs=3", "--burst", "5", "--warmup", "5", "--max-frames", "6", "--requests", "40",
               "--minutes", "5", "--marks", "0", "--gap-s", "0", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    summary = json.loads(out.read_text())
    assert summary["unexpected"] == {}, summary
    counts = summary["outcomes"]
    assert counts["done"] > 0 and counts["refused"] > 0 and counts.get("cancelled", 0) > 0, counts
    assert summary["requests"] == sum(counts.values()) >= 45  # warm-up 5 + at least 40
    assert [m["label"] for m in summary["marks"]] == ["after warm-up", "at 0 min", "at the end"]
    assert all(m["rss_mb"] > 50 for m in summary["marks"])
    for line in ("rss after warm-up:", "rss at 0 min:", "rss at the end:", "served ", "rss growth after warm-up:"):
        assert line in text, text


@pytest.fixture(scope="module")
def engine():
    """The engine the soak runs on without flags: the default preset, here on the fixture checkpoint."""
    eng = Engine.from_config(build_config({"model": str(fixture_dir("custom_voice")), "device": "cpu",
                                           "mode": "eager"}))
    yield eng
    eng.shutdown()


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=lambda b: next(iter(b)))
def test_each_bad_input_of_the_soak_is_refused_at_submit(engine, bad: dict) -> None:
    good = dict(text="hello there", speaker=engine.speakers()[0], max_new_tokens=4)
    engine.submit(SynthesisParams(**good)).cancel()  # the request without its bad field is taken
    with pytest.raises(InputError):
        engine.submit(SynthesisParams(**{**good, **bad}))


def test_the_checks_catch_audio_that_disagrees_with_its_codes() -> None:
    request = SynthesisParams(text="hi", max_new_tokens=5)
    codes = np.zeros((3, 16), np.int64)

    def result(samples: int, codes: np.ndarray = codes) -> SynthesisResult:
        return SynthesisResult(np.zeros(samples, np.float32), codes, 24000, RequestMetrics(1, "eager", 0.0))

    assert check(result(3 * 1920), request, 1920) == ("done", "")
    assert check(result(2 * 1920), request, 1920, cancelled=True)[0] == "audio_codes_mismatch"
    assert check(result(3 * 1920, codes + 2048), request, 1920)[0] == "code_out_of_range"
    assert check(result(5 * 1920, np.zeros((5, 16), np.int64)), request, 1920)[0] == "too_many_frames"
    assert 10 < rss_mb() < 1e6
