"""The start-up readiness tool over the real app (a process of its own) on the tiny checkpoint, on CPU."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from _fixtures import fixture_dir, free_port

from omni_tts.tools import start_ready


def _args(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    start_ready.add_arguments(ap)
    return ap.parse_args(list(argv))


def test_page_then_the_cpu_mode_ready_then_its_first_audio(tmp_path, capsys):
    out = tmp_path / "ready.json"
    args = _args("--app-args", f"--model {fixture_dir('custom_voice')}", "--request-mode", "eager", "--frames", "6",
                 "--limit", "180", "--port", str(free_port()), "--fresh-caches",
                 "--env", f"OMNI_TTS_DATA_DIR={tmp_path / 'data'}", "--json", str(out))
    assert start_ready.main(args) == 0
    res = json.loads(out.read_text())
    assert res["source"] in ("/ready", "log") and "eager" in res["awaited"]
    assert 0 < res["page_s"] <= res["modes"]["eager"]["s"] and res["modes"]["eager"]["state"] == "ready"
    req = res["request"]
    assert req["status"] == 200 and req["mode"] == "eager" and "error" not in req
    assert res["modes"]["eager"]["serves_s"] <= req["sent_s"] < req["first_audio_at_s"] <= res["page_s"] + 180
    assert any(f"saved voices: {tmp_path / 'data'}" in line for line in res["log"])  # --env reached the app
    assert start_ready.log_states("\n".join(res["log"]), ["eager", "default"]) == {
        "eager": {"state": "ready", "serving": True}, "default": {"state": "waiting", "serving": False}}
    assert res["page_s"] <= res["modes"]["eager"]["serves_s"] <= res["modes"]["eager"]["s"]
    for path in res["fresh_caches"].values():  # new, empty cache folders, removed at the end
        assert not Path(path).exists()
    assert res["exit_code"] == 0 and {"commit", "torch", "device"} <= set(res)
    assert "eager: serves " in capsys.readouterr().out


def test_an_env_flag_without_a_value_is_refused_naming_it(capsys):
    with pytest.raises(SystemExit):
        _args("--env", "OMNI_TTS_ARTIFACTS")
    assert "--env wants KEY=VALUE" in capsys.readouterr().err


def test_an_app_that_never_serves_its_page_is_a_failed_run_with_its_last_lines(tmp_path):
    out = tmp_path / "ready.json"
    args = _args("--app-args", f"--model {tmp_path / 'missing'}", "--limit", "120", "--port", str(free_port()),
                 "--json", str(out))
    assert start_ready.main(args) == 1
    res = json.loads(out.read_text())
    assert res["page_s"] is None and "modes" not in res and res["exit_code"] == 2
    assert any("error:" in line and "missing" in line for line in res["log_tail"])
