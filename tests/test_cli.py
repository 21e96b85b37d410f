"""The real CLI (`python -m omni_tts`) in a subprocess on the tiny fixture checkpoints."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from _fixtures import fixture_dir

REPO = Path(__file__).resolve().parents[1]



def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "omni_tts", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)


def assert_one_line_error(r: subprocess.CompletedProcess, *fragments: str) -> None:
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.mark.parametrize("name,case_no,extra", [
    ("custom_voice", 0, []),
    ("custom_voice", 3, ["--non-streaming-mode", "false"]),
    ("voice_design", 1, []),
])
def test_synth_matches_golden(tmp_path: Path, name: str, case_no: int, extra: list[str]) -> None:
    d = fixture_dir(name)
    case = json.loads((d / "golden" / "cases.json").read_text())["cases"][case_no]
    args = ["synth", "--model", str(d), "--task", case["task"], "--text", case["text"], "--language",
            case["language"], "--greedy", "--max-new-tokens", "40", "--out", str(tmp_path / "o.wav"),
            "--codes-out", str(tmp_path / "o.npy"), *extra]
    if case.get("speaker"):
        args += ["--speaker", case["speaker"]]
    if case.get("instruct"):
        args += ["--instruct", case["instruct"]]
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), np.load(d / "golden" / f"case{case_no}_codes.npy"))
    wav, sr = sf.read(tmp_path / "o.wav", dtype="float32")
    gold = np.load(d / "golden" / f"case{case_no}_wav.npy")
    assert sr == 24000 and wav.shape == gold.shape and float(np.abs(wav - gold).max()) < 1e-3


def test_speakers() -> None:
    r = cli("speakers", "--model", str(fixture_dir("custom_voice")))
    assert r.returncode == 0 and r.stdout.split() == ["dylan", "eric", "ryan", "vivian"]


@pytest.mark.parametrize("args,fragments", [
    (["--speaker", "bob", "--text", "hi"], ["unknown speaker 'bob'", "valid: dylan, eric, ryan, vivian"]),
    (["--language", "klingon", "--text", "hi"], ["unknown language 'klingon'", "english"]),
    (["--text", "   "], ["text is empty"]),
    (["--task", "voice_design", "--text", "hi"], ["instruct"]),
])
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], fragments: list[str]) -> None:
    d = fixture_dir("voice_design" if "voice_design" in args else "custom_voice")
    r = cli("synth", "--model", str(d), "--out", str(tmp_path / "o.wav"), *args)
    assert_one_line_error(r, *fragments)
    assert not (tmp_path / "o.wav").exists()


def test_not_a_checkpoint_and_corrupt_weights(tmp_path: Path) -> None:
    r = cli("synth", "--model", str(tmp_path), "--text", "hi", "--out", str(tmp_path / "o.wav"))
    assert_one_line_error(r, "not a Qwen3-TTS checkpoint")
    d = tmp_path / "ckpt"
    shutil.copytree(fixture_dir("custom_voice"), d, ignore=shutil.ignore_patterns("golden"))
    (d / "model.safetensors").write_bytes(b"\x00garbage" * 100)
    r = cli("synth", "--model", str(d), "--text", "hi", "--out", str(tmp_path / "o.wav"))
    assert_one_line_error(r, "model.safetensors", "corrupt")
    r = cli("speakers", "--model", str(d))
    assert_one_line_error(r, "model.safetensors")


def test_synth_with_only_text_uses_the_embedded_demo_on_a_fresh_machine(tmp_path):
    """No --model, an empty HF cache and no Hub here: the embedded tiny checkpoint is made and used,
    and the output says it is noise."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HOME=str(tmp_path),
               HF_HOME=str(tmp_path / "hf"), OMNI_TTS_CACHE=str(tmp_path / "omni"))
    env.pop("OMNI_TTS_MODEL", None)
    out = tmp_path / "x.wav"
    r = subprocess.run([sys.executable, "-m", "omni_tts", "synth", "--text", "Hello there.", "--out", str(out),
                        "--max-new-tokens", "6", "--greedy"], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "noise" in r.stderr and "embedded" in r.stderr
    wav, sr = sf.read(out)
    assert sr == 24000 and wav.shape[0] == 5 * 1920  # max_new_tokens 6 -> 5 frames
    assert (tmp_path / "omni").is_dir()
