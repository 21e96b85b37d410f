"""Base voice clone through `omni-tts synth`: golden parity from a reference clip given as a file (also a
stereo 44.1 kHz one, mixed and resampled), a saved voice reloaded, and every bad reference clip or voice
flag as one error line with exit status 2. Tiny Base fixture, CPU, float32; real subprocesses beside
in-process calls of the same `main`."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf
from _fixtures import FIXTURES, REPO, cli_env, fixture_dir

BASE = FIXTURES / "base"
GOLDEN = BASE / "golden"
SR = 24000  # output rate


@pytest.fixture(scope="module")
def ref_audio() -> np.ndarray:
    return np.load(fixture_dir("base") / "golden_ref_audio.npy")  # [48000] float32 at 24 kHz


def _cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "omni_tts", "synth", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=REPO)


def _wait(procs: dict[str, subprocess.Popen]) -> dict[str, tuple[int, str]]:
    """Wait for CLI calls started in parallel; -> name: (exit status, stderr)."""
    out = {}
    for name, p in procs.items():
        err = p.communicate(timeout=300)[1]
        out[name] = (p.returncode, err)
    return out


def test_cli_clone_matches_golden_and_saved_voice_reloads(tmp_path, ref_audio, capsys) -> None:
    from omni_tts.tools.cli import main

    cases = {c["case"]: c for c in json.loads((GOLDEN / "cases.json").read_text())["cases"]}
    sf.write(tmp_path / "ref.wav", ref_audio, SR, subtype="FLOAT")
    stereo = np.stack([ref_audio, 0.5 * ref_audio], 1)[np.arange(88200) * SR // 44100]  # crude 44.1 kHz copy
    sf.write(tmp_path / "stereo.flac", stereo, 44100)
    common = ["--model", str(BASE), "--greedy", "--max-new-tokens", "40"]

    def case_args(c: dict, tag: str) -> list[str]:
        return [*common, "--text", c["text"], "--language", c["language"], "--out", str(tmp_path / f"{tag}.wav"),
                "--codes-out", str(tmp_path / f"{tag}.npy")]

    procs = {
        "icl": _cli(*case_args(cases[0], "icl"), "--ref-audio", str(tmp_path / "ref.wav"), "--ref-text",
                    cases[0]["ref_text"], "--save-voice", str(tmp_path / "v.safetensors")),
        "xvec": _cli(*case_args(cases[1], "xvec"), "--task", "voice_clone", "--ref-audio", str(tmp_path / "ref.wav"),
                     "--x-vector-only")}
    # in-process (same `main`) while the subprocesses run: a stereo 44.1 kHz clip is mixed and resampled
    rc = main(["synth", *common, "--text", "hi", "--ref-audio", str(tmp_path / "stereo.flac"), "--x-vector-only",
               "--out", str(tmp_path / "stereo.wav")])
    runs = {"stereo": (rc, capsys.readouterr().err), **_wait(procs)}
    runs.update(_wait({"saved": _cli(*case_args(cases[0], "saved"), "--voice", str(tmp_path / "v.safetensors"))}))
    for name, (rc, err) in runs.items():
        assert rc == 0 and "Traceback" not in err, f"{name}: {err}"
    ref = np.load(GOLDEN / "ref_codes.npy")
    for tag, c in (("icl", cases[0]), ("xvec", cases[1]), ("saved", cases[0])):
        codes = np.load(tmp_path / f"{tag}.npy")
        full = codes if c["x_vector_only_mode"] else np.concatenate([ref, codes])
        np.testing.assert_array_equal(full, np.load(GOLDEN / f"case{c['case']}_codes.npy"), err_msg=tag)
        wav, sr = sf.read(tmp_path / f"{tag}.wav", dtype="float32")
        gold = np.load(GOLDEN / f"case{c['case']}_wav.npy")
        assert sr == SR and wav.shape == gold.shape and float(np.abs(wav - gold).max()) < 1e-3, tag
    assert np.array_equal(sf.read(tmp_path / "icl.wav")[0], sf.read(tmp_path / "saved.wav")[0])
    note = runs["stereo"][1].splitlines()[0]
    assert note.startswith("note: ") and "2 channels mixed to mono" in note and "44100 Hz resampled" in note


def test_cli_bad_reference_audio_is_one_line(tmp_path, ref_audio, capsys) -> None:
    """Real subprocesses for two cases (no traceback, exit 2); the rest through the same `main` in-process
    (the reference audio is checked before the model loads, so these take milliseconds)."""
    from omni_tts.tools.cli import main

    d = str(fixture_dir("base"))
    (tmp_path / "empty.wav").write_bytes(b"")
    (tmp_path / "text.wav").write_text("this is not audio\n" * 50)
    sf.write(tmp_path / "silent.wav", np.zeros(48000, np.float32), SR)
    sf.write(tmp_path / "long.flac", np.resize(ref_audio, 8000 * 31), 8000)
    sf.write(tmp_path / "short.wav", ref_audio[:6000], SR)
    sf.write(tmp_path / "lowrate.wav", ref_audio[:8000], 4000)
    sf.write(tmp_path / "ok.wav", ref_audio, SR)
    ok, xv = str(tmp_path / "ok.wav"), "--x-vector-only"
    bad = {  # name: (voice flags, fragments the one error line must hold)
        "empty": (["--ref-audio", str(tmp_path / "empty.wav"), xv], ["empty.wav", "the file is empty"]),
        "not audio": (["--ref-audio", str(tmp_path / "text.wav"), xv], ["text.wav", "not a readable audio file"]),
        "silent": (["--ref-audio", str(tmp_path / "silent.wav"), xv], ["silent.wav", "silent"]),
        "too long": (["--ref-audio", str(tmp_path / "long.flac"), xv], ["long.flac", "31.0 s is too long"]),
        "too short": (["--ref-audio", str(tmp_path / "short.wav"), xv], ["short.wav", "too short"]),
        "low rate": (["--ref-audio", str(tmp_path / "lowrate.wav"), xv], ["sample rate 4000 Hz is too low"]),
        "missing": (["--ref-audio", str(tmp_path / "nope.wav"), xv], ["nope.wav", "file not found"]),
        "no transcript": (["--ref-audio", ok], ["needs --ref-text", "--x-vector-only"]),
        "no reference": ([], ["voice_clone needs --ref-audio"]),
        "voice not a prompt": (["--voice", ok], ["ok.wav", "not a safetensors file"]),
        "both": (["--voice", ok, "--ref-audio", ok], ["either --voice"]),
        "custom_voice": (["--ref-audio", ok, xv, "--model", str(fixture_dir("custom_voice"))],
                         ["--task voice_clone", "custom_voice"]),
    }
    (tmp_path / "out").mkdir()

    def argv(name: str) -> list[str]:
        return ["--model", d, "--text", "hi", "--out", str(tmp_path / "out" / f"{name}.wav"), *bad[name][0]]

    procs = {k: _cli(*argv(k)) for k in ("not audio", "silent")}  # run while the in-process ones do
    runs = {}
    for k in bad:
        if k not in procs:
            rc = main(["synth", *argv(k)])
            runs[k] = (rc, capsys.readouterr().err)
    runs.update(_wait(procs))
    for name, (rc, err) in runs.items():
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), f"{name}: rc {rc}: {err}"
        assert "Traceback" not in err and all(f in lines[0] for f in bad[name][1]), f"{name}: {lines[0]}"
    assert not any((tmp_path / "out").iterdir())


def test_a_refused_request_leaves_no_saved_voice_and_codes_keep_their_name(tmp_path, ref_audio, capsys) -> None:
    """--save-voice is written only once the request is served (a language the model does not know is refused
    after the voice is made); --codes-out is written under the name given, whatever its suffix's case."""
    from omni_tts.tools.cli import main

    sf.write(tmp_path / "ref.wav", ref_audio, SR, subtype="FLOAT")
    common = ["synth", "--model", str(BASE), "--text", "hi", "--ref-audio", str(tmp_path / "ref.wav"),
              "--x-vector-only", "--max-new-tokens", "4", "--seed", "1",
              "--save-voice", str(tmp_path / "v.safetensors")]
    assert main([*common, "--language", "Klingon", "--out", str(tmp_path / "x.wav")]) == 2
    assert "unknown language 'Klingon'" in capsys.readouterr().err
    assert not (tmp_path / "v.safetensors").exists() and not (tmp_path / "x.wav").exists()
    assert main([*common, "--out", str(tmp_path / "y.wav"), "--codes-out", str(tmp_path / "c.NPY")]) == 0
    assert (tmp_path / "v.safetensors").is_file() and np.load(tmp_path / "c.NPY").shape[1] == 16
