"""`python -m omni_tts make-checkpoint` and omni_tts.models.checkpoint_maker: random-weight checkpoints in the
released layout that our loaders and TTSModel accept, deterministic per seed, at plausible real sizes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omni_tts.models.checkpoint import load_checkpoint
from omni_tts.models.checkpoint_maker import make_configs
from omni_tts.models.code_predictor import CodePredictor
from omni_tts.config import SynthesisParams
from omni_tts.models.qwen3_tts import TTSModel
from omni_tts.models.talker import Talker

REPO = Path(__file__).resolve().parents[1]


def make(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "omni_tts", "make-checkpoint", *args], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=300)


@pytest.mark.parametrize("kind, params", [
    ("custom_voice", dict(task="custom_voice", speaker="vivian")),
    ("voice_design", dict(task="voice_design", instruct="a calm, low voice")),
])
def test_cli_checkpoint_loads_and_synthesizes(tmp_path: Path, kind: str, params: dict) -> None:
    out = tmp_path / kind
    r = make("--size", "tiny", "--type", kind, "--out", str(out), "--seed", "7")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and str(out) in lines[0] and "random" in lines[0].lower() and "noise" in lines[0]
    model = TTSModel.from_checkpoint(load_checkpoint(str(out)), device=torch.device("cpu"), dtype=torch.float32)
    assert model.tasks() == [kind]
    assert bool(model.speakers()) == (kind == "custom_voice")
    wav, codes = model.synthesize(SynthesisParams(text="Hello there.", greedy=True, max_new_tokens=4, **params))
    assert 1 <= codes.shape[0] <= 4 and codes.shape[1] == 16
    assert len(wav) == codes.shape[0] * 1920


def test_voice_design_checkpoint_needs_instruct(tmp_path: Path) -> None:
    r = make("--size", "tiny", "--type", "voice_design", "--out", str(tmp_path / "vd"))
    assert r.returncode == 0, r.stderr
    model = TTSModel.from_checkpoint(load_checkpoint(str(tmp_path / "vd")), device=torch.device("cpu"),
                                     dtype=torch.float32)
    with pytest.raises(Exception, match="instruct"):
        model.synthesize(SynthesisParams(text="Hello.", task="voice_design", greedy=True, max_new_tokens=4))


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    for name in ("a", "b"):
        r = make("--size", "tiny", "--out", str(tmp_path / name), "--seed", "11")
        assert r.returncode == 0, r.stderr
    for file in ("model.safetensors", "speech_tokenizer/model.safetensors"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes(), file
    r = make("--size", "tiny", "--out", str(tmp_path / "c"), "--seed", "12")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "c" / "model.safetensors").read_bytes() != (tmp_path / "a" / "model.safetensors").read_bytes()


@pytest.mark.parametrize("args, fragment", [
    (["--size", "3B"], "unknown --size '3B'"),
    (["--size", "tiny", "--type", "base"], "unknown --type 'base'"),
    (["--size", "tiny", "--out", "EXISTING"], "not an empty directory"),
])
def test_errors_are_one_line(tmp_path: Path, args: list[str], fragment: str) -> None:
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("x")
    args = [str(existing) if a == "EXISTING" else a for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "new")]
    r = make(*args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], r.stderr
    assert (existing / "keep.txt").read_text() == "x" and not (tmp_path / "new").exists()


@pytest.mark.parametrize("size, low, high", [("0.6B", 0.6e9, 1.1e9), ("1.7B", 1.5e9, 2.2e9)])
def test_real_size_configs_have_plausible_parameter_counts(size: str, low: float, high: float) -> None:
    config, _, _ = make_configs(size)
    tc = config["talker_config"]
    with torch.device("meta"):  # shapes only: no memory
        talker = Talker(tc)
        predictor = CodePredictor(tc["code_predictor_config"], talker.hidden_size, talker.codec_embedding)
    unique = {id(p): p.numel() for m in (talker, predictor) for p in m.parameters()}  # shared embedding once
    total = sum(unique.values())
    assert low < total < high, f"{size}: {total / 1e9:.3f}e9 talker + code predictor parameters"


def test_the_real_size_random_codec_keeps_its_activations_bounded() -> None:
    """The speech tokenizer's weights are drawn by fan-in (each layer halves its input's scale), so the
    1.7B-size random vocoder's SnakeBeta inputs stay small, as a trained codec's do: with a flat std they
    grow to ~1e7, where sin() takes a slow path (the codec then decodes several times slower)."""
    from omni_tts.models.checkpoint_maker import _module_shapes, _random_tensors
    from omni_tts.models.codec.decoder import CodecDecoder
    from omni_tts.models.codec.layers import SnakeBeta

    config, _, codec_config = make_configs("1.7B")
    _, speech = _module_shapes(config, codec_config)
    speech = {k: v for k, v in speech.items() if k.startswith("decoder.")}
    weights = _random_tensors(speech, torch.Generator().manual_seed(0), torch.device("cpu"), torch.float32, 0.05,
                              fan_in=True)
    codec = CodecDecoder.from_config(codec_config, weights)
    peaks: list[float] = []
    for m in codec.modules():
        if isinstance(m, SnakeBeta):
            m.register_forward_hook(lambda mod, inp, out: peaks.append(float(inp[0].abs().max())))
    wav = codec.decode_window(torch.randint(0, 2048, (1, 14, 16), generator=torch.Generator().manual_seed(1)), 10)
    assert len(peaks) == 29 and 0 < max(peaks) < 1e3
    assert 1e-5 < float(wav.std()) < 0.1  # quiet noise, not silence
