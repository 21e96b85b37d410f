"""The real CLI on the tiny fixture checkpoints: its entry function in this process (argv in; exit status,
stdout and stderr out), and `python -m omni_tts` in a subprocess where a fresh process is the point (the
module entry, raw argv bytes, a fresh machine's home and cache)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from _fixtures import REPO, fixture_dir, run_cli_process
from _fixtures import run_cli as cli


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
    out = tmp_path / "x.wav"
    r = run_cli_process("synth", "--text", "Hello there.", "--out", str(out), "--max-new-tokens", "6", "--greedy",
                        **_fresh_machine(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "noise" in r.stderr and "embedded" in r.stderr
    wav, sr = sf.read(out)
    assert sr == 24000 and wav.shape[0] == 5 * 1920  # max_new_tokens 6 -> 5 frames
    assert (tmp_path / "omni").is_dir()


def _fresh_machine(home: Path) -> dict[str, str | None]:
    """The environment of a first run: an empty home, HF cache and omni-tts cache, no model chosen."""
    return dict(HOME=str(home), HF_HOME=str(home / "hf"), OMNI_TTS_CACHE=str(home / "omni"), OMNI_TTS_MODEL=None)


# ------------------------------------------------------------------------------------------ at the door


@pytest.mark.parametrize("args,fragments", [
    (["--seed", "9223372036854775808"], ["seed must be >= 0 and <= 9223372036854775807"]),
    (["--seed", "-4"], ["seed must be >= 0"]),
    (["--max-new-tokens", "1180591620717411303424"], ["max_new_tokens must be >= 2 and <= 8192",
                                                      "an integer of 71 bits"]),
    (["--max-new-tokens", "1e12"], ["--max-new-tokens: invalid int value: '1e12'"]),
    (["--max-new-tokens", "100000"], ["max_new_tokens must be >= 2 and <= 8192"]),
])
def test_out_of_range_numbers_are_one_line_before_any_model_loads(tmp_path: Path, args, fragments):
    """--model names no checkpoint: the number is refused first, so nothing was loaded or synthesized."""
    r = cli("synth", "--model", str(tmp_path / "none"), "--text", "hi", "--out", str(tmp_path / "o.wav"), *args)
    assert_one_line_error(r, *fragments)
    assert not (tmp_path / "o.wav").exists()


def test_invalid_utf8_text_is_one_line(tmp_path: Path) -> None:
    # raw argv bytes: what a shell passes for text that is not UTF-8
    r = run_cli_process("synth", "--model", str(fixture_dir("custom_voice")), "--text", b"caf\xe9 ok",
                        "--out", str(tmp_path / "o.wav"), text=False, LC_ALL="C.UTF-8")
    assert_one_line_error(subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(),
                                                      r.stderr.decode(errors="replace")),
                          "--text is not valid UTF-8 (byte 0xe9 at character 3)")
    assert not (tmp_path / "o.wav").exists()


@pytest.mark.parametrize("out,fragment", [
    ("{tmp}", "is a directory"),
    ("{tmp}/o.xyz", "give a file name ending in .wav"),
    ("{tmp}/o", "give a file name ending in .wav"),
    ("{tmp}/missing/o.wav", "the directory"),
    ("", "give a file name ending in .wav"),
])
def test_bad_out_is_refused_before_loading_or_synthesizing(tmp_path: Path, out: str, fragment: str) -> None:
    """The checkpoint path does not exist: an --out error, not a checkpoint error, shows the order."""
    r = cli("synth", "--model", str(tmp_path / "none"), "--text", "hi", "--out", out.format(tmp=tmp_path))
    assert_one_line_error(r, "--out", fragment)


def test_existing_outputs_are_kept_unless_force(tmp_path: Path) -> None:
    d = fixture_dir("custom_voice")
    out, codes = tmp_path / "o.wav", tmp_path / "c.npy"
    out.write_text("keep me")
    base = ["synth", "--model", str(d), "--text", "hi", "--greedy", "--max-new-tokens", "4", "--out", str(out)]
    assert_one_line_error(cli(*base), "--out", "exists; pass --force")
    assert out.read_text() == "keep me"
    codes.write_text("keep me too")
    r = cli(*base[:-1], str(tmp_path / "new.wav"), "--codes-out", str(codes))
    assert_one_line_error(r, "--codes-out", "exists")
    assert codes.read_text() == "keep me too" and not (tmp_path / "new.wav").exists()
    voice = tmp_path / "v.safetensors"
    voice.write_text("not yet a voice")
    r = cli("synth", "--model", str(tmp_path / "none"), "--task", "voice_clone", "--text", "hi", "--ref-audio",
            str(tmp_path / "none.wav"), "--x-vector-only", "--save-voice", str(voice), "--out", str(tmp_path / "n.wav"))
    assert_one_line_error(r, "--save-voice", "exists")
    assert voice.read_text() == "not yet a voice"
    r = cli(*base, "--codes-out", str(codes), "--force")
    assert r.returncode == 0, r.stderr
    wav, sr = sf.read(out)
    assert sr == 24000 and wav.shape == (3 * 1920,) and np.load(codes).shape == (3, 16)


def test_argument_errors_and_a_huge_maker_seed_are_one_line(tmp_path: Path) -> None:
    assert_one_line_error(cli("synth", "--text", "hi"), "the following arguments are required: --out")
    assert_one_line_error(cli("synth", "--text", "hi", "--out", "o.wav", "--dtype", "fp8"), "--dtype")
    r = cli("make-checkpoint", "--size", "tiny", "--out", str(tmp_path / "m"), "--seed", str(2**70))
    assert_one_line_error(r, "--seed must be >= 0 and <= 9223372036854775807")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("key,value,fragment", [
    ("num_hidden_layers", -3, "talker_config.num_hidden_layers must be from 1 to 256 (got -3)"),
    ("hidden_size", "64", "talker_config.hidden_size must be a whole number"),
    ("num_hidden_layers", 1e6, "talker_config.num_hidden_layers must be a whole number"),
])
def test_absurd_checkpoint_sizes_are_one_line(tmp_path: Path, key: str, value, fragment: str) -> None:
    d = tmp_path / "ckpt"
    shutil.copytree(fixture_dir("custom_voice"), d, ignore=shutil.ignore_patterns("golden"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["talker_config"][key] = value
    (d / "config.json").write_text(json.dumps(cfg))
    r = cli("synth", "--model", str(d), "--text", "hi", "--out", str(tmp_path / "o.wav"))
    assert_one_line_error(r, "config.json", fragment)


def test_a_leftover_embedded_dir_without_config_is_rebuilt_and_said(tmp_path):
    """An interrupted first run left the embedded demo's folder without config.json: the next run says so,
    rebuilds it and synthesizes."""
    from omni_tts.models.checkpoint_maker import EMBEDDED_VERSION

    leftover = tmp_path / "omni" / f"embedded-tiny-custom_voice-v{EMBEDDED_VERSION}"
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"\x00" * 64)
    r = run_cli_process("synth", "--text", "Hello.", "--out", str(tmp_path / "x.wav"), "--max-new-tokens", "4",
                        "--greedy", HF_HUB_OFFLINE="1", **_fresh_machine(tmp_path))
    assert r.returncode == 0, r.stderr
    assert f"embedded demo checkpoint at {leftover} is broken" in r.stderr and "rebuilding it" in r.stderr
    assert (leftover / "config.json").is_file() and sf.read(tmp_path / "x.wav")[0].shape == (3 * 1920,)


# ------------------------------------------------------------------------------------------ one entry point
def test_help_lists_every_subcommand_and_each_answers_its_own_help() -> None:
    from omni_tts.tools.cli import COMMANDS

    r = run_cli_process("--help")
    assert r.returncode == 0 and all(name in r.stdout for name in COMMANDS)
    r = cli("soak", "--help")  # a tool's flags: the shared engine flags and its own
    assert r.returncode == 0 and all(f in r.stdout for f in ("--model", "--preset", "--set", "--minutes"))


def test_a_command_whose_module_is_missing_is_one_line(monkeypatch, capsys) -> None:
    from omni_tts.tools import cli as cli_module

    monkeypatch.setitem(cli_module.COMMANDS, "serve", cli_module.Command("omni_tts.no_such_module", "x"))
    assert cli_module.main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err == "error: 'serve' is not available in this installation (omni_tts.no_such_module is missing)\n"


def test_the_shared_flags_are_defined_once_and_the_app_uses_them() -> None:
    """`--model` (and its siblings) are added in one place; app.py's parser and every engine command's
    take them, and turn them into the same EngineConfig."""
    import app
    from omni_tts.tools.args import Parser, add_engine_flags, engine_config

    sources = [REPO / "app.py", *(REPO / "omni_tts").rglob("*.py")]
    defs = [p for p in sources for line in p.read_text().splitlines() if 'add_argument("--model"' in line]
    assert defs == [REPO / "omni_tts" / "tools" / "args.py"]
    argv = ["--model", "/m", "--preset", "bench", "--set", "max_num_seqs=4", "--set", "kernels=false",
            "--device", "cpu"]
    tool = Parser(prog="t")
    add_engine_flags(tool)
    from_app, from_tool = engine_config(app.parse_args(argv)), engine_config(tool.parse_args(argv))
    assert from_app == from_tool
    assert (from_app.model, from_app.max_num_seqs, from_app.device, from_app.name) == ("/m", 4, "cpu", "bench")
    assert not from_app.experimental.kernels
