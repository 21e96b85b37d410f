"""`python -m omni_tts make-checkpoint` and omni_tts.models.checkpoint_maker: random-weight checkpoints in the
released layout that our loaders and TTSModel accept, deterministic per seed, at plausible real sizes."""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

import pytest
import torch
from _fixtures import fixture_dir, run_cli, run_cli_process

from omni_tts.config import SynthesisParams
from omni_tts.engine import offline
from omni_tts.models.checkpoint import load_checkpoint
from omni_tts.models.checkpoint_maker import make_checkpoint, make_configs, shape_table
from omni_tts.models.code_predictor import CodePredictor
from omni_tts.models.qwen3_tts import TTSModel
from omni_tts.models.talker import Talker

# Every tensor of the released checkpoints (CustomVoice and VoiceDesign: the Base model adds its speaker
# encoder), named as the official qwen-tts names them, at the tiny fixtures' sizes: {a,b} and {a-b} stand
# for the listed indices. The tiny fixtures in tests/fixtures (made by the official implementation) hold
# exactly these; the real sizes hold the same names with their own counts.
RELEASED_TENSORS = {
    "model.safetensors": """
talker.code_predictor.lm_head.{0-14}.weight
talker.code_predictor.model.codec_embedding.{0-14}.weight
talker.code_predictor.model.layers.{0,1}.input_layernorm.weight
talker.code_predictor.model.layers.{0,1}.mlp.down_proj.weight
talker.code_predictor.model.layers.{0,1}.mlp.gate_proj.weight
talker.code_predictor.model.layers.{0,1}.mlp.up_proj.weight
talker.code_predictor.model.layers.{0,1}.post_attention_layernorm.weight
talker.code_predictor.model.layers.{0,1}.self_attn.k_norm.weight
talker.code_predictor.model.layers.{0,1}.self_attn.k_proj.weight
talker.code_predictor.model.layers.{0,1}.self_attn.o_proj.weight
talker.code_predictor.model.layers.{0,1}.self_attn.q_norm.weight
talker.code_predictor.model.layers.{0,1}.self_attn.q_proj.weight
talker.code_predictor.model.layers.{0,1}.self_attn.v_proj.weight
talker.code_predictor.model.norm.weight
talker.code_predictor.small_to_mtp_projection.bias
talker.code_predictor.small_to_mtp_projection.weight
talker.codec_head.weight
talker.model.codec_embedding.weight
talker.model.layers.{0-2}.input_layernorm.weight
talker.model.layers.{0-2}.mlp.down_proj.weight
talker.model.layers.{0-2}.mlp.gate_proj.weight
talker.model.layers.{0-2}.mlp.up_proj.weight
talker.model.layers.{0-2}.post_attention_layernorm.weight
talker.model.layers.{0-2}.self_attn.k_norm.weight
talker.model.layers.{0-2}.self_attn.k_proj.weight
talker.model.layers.{0-2}.self_attn.o_proj.weight
talker.model.layers.{0-2}.self_attn.q_norm.weight
talker.model.layers.{0-2}.self_attn.q_proj.weight
talker.model.layers.{0-2}.self_attn.v_proj.weight
talker.model.norm.weight
talker.model.text_embedding.weight
talker.text_projection.linear_fc1.bias
talker.text_projection.linear_fc1.weight
talker.text_projection.linear_fc2.bias
talker.text_projection.linear_fc2.weight
""",
    "speech_tokenizer/model.safetensors": """
decoder.decoder.5.alpha
decoder.decoder.5.beta
decoder.decoder.{1-4}.block.{2-4}.act1.alpha
decoder.decoder.{1-4}.block.{2-4}.act1.beta
decoder.decoder.{1-4}.block.{2-4}.act2.alpha
decoder.decoder.{1-4}.block.{2-4}.act2.beta
decoder.decoder.{1-4}.block.0.alpha
decoder.decoder.{1-4}.block.0.beta
decoder.decoder.{1-4}.block.1.conv.bias
decoder.decoder.{1-4}.block.1.conv.weight
decoder.decoder.{1-4}.block.{2-4}.conv1.conv.bias
decoder.decoder.{1-4}.block.{2-4}.conv1.conv.weight
decoder.decoder.{1-4}.block.{2-4}.conv2.conv.bias
decoder.decoder.{1-4}.block.{2-4}.conv2.conv.weight
decoder.decoder.{0,6}.conv.bias
decoder.decoder.{0,6}.conv.weight
decoder.pre_conv.conv.bias
decoder.pre_conv.conv.weight
decoder.pre_transformer.input_proj.bias
decoder.pre_transformer.input_proj.weight
decoder.pre_transformer.layers.{0,1}.input_layernorm.weight
decoder.pre_transformer.layers.{0,1}.mlp.down_proj.weight
decoder.pre_transformer.layers.{0,1}.mlp.gate_proj.weight
decoder.pre_transformer.layers.{0,1}.mlp.up_proj.weight
decoder.pre_transformer.layers.{0,1}.mlp_layer_scale.scale
decoder.pre_transformer.layers.{0,1}.post_attention_layernorm.weight
decoder.pre_transformer.layers.{0,1}.self_attn.k_proj.weight
decoder.pre_transformer.layers.{0,1}.self_attn.o_proj.weight
decoder.pre_transformer.layers.{0,1}.self_attn.q_proj.weight
decoder.pre_transformer.layers.{0,1}.self_attn.v_proj.weight
decoder.pre_transformer.layers.{0,1}.self_attn_layer_scale.scale
decoder.pre_transformer.norm.weight
decoder.pre_transformer.output_proj.bias
decoder.pre_transformer.output_proj.weight
decoder.quantizer.rvq_first.input_proj.weight
decoder.quantizer.rvq_first.output_proj.weight
decoder.quantizer.rvq_first.vq.layers.0._codebook.cluster_usage
decoder.quantizer.rvq_first.vq.layers.0._codebook.embedding_sum
decoder.quantizer.rvq_rest.input_proj.weight
decoder.quantizer.rvq_rest.output_proj.weight
decoder.quantizer.rvq_rest.vq.layers.{0-14}._codebook.cluster_usage
decoder.quantizer.rvq_rest.vq.layers.{0-14}._codebook.embedding_sum
decoder.upsample.{0,1}.0.conv.bias
decoder.upsample.{0,1}.0.conv.weight
decoder.upsample.{0,1}.1.dwconv.conv.bias
decoder.upsample.{0,1}.1.dwconv.conv.weight
decoder.upsample.{0,1}.1.gamma
decoder.upsample.{0,1}.1.norm.bias
decoder.upsample.{0,1}.1.norm.weight
decoder.upsample.{0,1}.1.pwconv1.bias
decoder.upsample.{0,1}.1.pwconv1.weight
decoder.upsample.{0,1}.1.pwconv2.bias
decoder.upsample.{0,1}.1.pwconv2.weight
encoder.downsample.conv.weight
encoder.encoder.layers.{1,4,7,10}.block.{1,3}.conv.bias
encoder.encoder.layers.{1,4,7,10}.block.{1,3}.conv.weight
encoder.encoder.layers.{0,3,6,9,12,14}.conv.bias
encoder.encoder.layers.{0,3,6,9,12,14}.conv.weight
encoder.encoder_transformer.layers.0.input_layernorm.bias
encoder.encoder_transformer.layers.0.input_layernorm.weight
encoder.encoder_transformer.layers.0.mlp.fc1.weight
encoder.encoder_transformer.layers.0.mlp.fc2.weight
encoder.encoder_transformer.layers.0.mlp_layer_scale.scale
encoder.encoder_transformer.layers.0.post_attention_layernorm.bias
encoder.encoder_transformer.layers.0.post_attention_layernorm.weight
encoder.encoder_transformer.layers.0.self_attn.k_proj.weight
encoder.encoder_transformer.layers.0.self_attn.o_proj.weight
encoder.encoder_transformer.layers.0.self_attn.q_proj.weight
encoder.encoder_transformer.layers.0.self_attn.v_proj.weight
encoder.encoder_transformer.layers.0.self_attn_layer_scale.scale
encoder.quantizer.acoustic_residual_vector_quantizer.input_proj.weight
encoder.quantizer.acoustic_residual_vector_quantizer.layers.{0-14}.codebook.cluster_usage
encoder.quantizer.acoustic_residual_vector_quantizer.layers.{0-14}.codebook.embed_sum
encoder.quantizer.acoustic_residual_vector_quantizer.layers.{0-14}.codebook.initialized
encoder.quantizer.acoustic_residual_vector_quantizer.output_proj.weight
encoder.quantizer.semantic_residual_vector_quantizer.input_proj.weight
encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codebook.cluster_usage
encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codebook.embed_sum
encoder.quantizer.semantic_residual_vector_quantizer.layers.0.codebook.initialized
encoder.quantizer.semantic_residual_vector_quantizer.output_proj.weight
""",
}


def make(*args: str) -> subprocess.CompletedProcess:
    """`omni-tts make-checkpoint ARGS` in this process."""
    return run_cli("make-checkpoint", *args)


def make_in_a_process(*args: str) -> subprocess.CompletedProcess:
    """`python -m omni_tts make-checkpoint ARGS` in a fresh process."""
    return run_cli_process("make-checkpoint", *args)


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
    params = SynthesisParams(text="Hello there.", greedy=True, max_new_tokens=4, **params)
    wav, codes = offline.synthesize(model, params)
    assert 1 <= codes.shape[0] <= 4 and codes.shape[1] == 16
    assert len(wav) == codes.shape[0] * 1920


def test_voice_design_checkpoint_needs_instruct(tmp_path: Path) -> None:
    r = make("--size", "tiny", "--type", "voice_design", "--out", str(tmp_path / "vd"))
    assert r.returncode == 0, r.stderr
    model = TTSModel.from_checkpoint(load_checkpoint(str(tmp_path / "vd")), device=torch.device("cpu"),
                                     dtype=torch.float32)
    with pytest.raises(Exception, match="instruct"):
        offline.synthesize(model, SynthesisParams(text="Hello.", task="voice_design", greedy=True, max_new_tokens=4))


def test_base_checkpoint_is_the_released_base_layout_and_clones_a_voice(tmp_path: Path) -> None:
    """--type base: every tensor of the official tiny Base checkpoint (the speaker encoder's included) with its
    shape, the same speaker_encoder_config, no built-in speakers; it makes an x-vector and clones with it."""
    out = tmp_path / "base"
    r = make("--size", "tiny", "--type", "base", "--out", str(out), "--seed", "4")
    assert r.returncode == 0, r.stderr
    for file in ("model.safetensors", "speech_tokenizer/model.safetensors"):
        made, official = _header(out / file), _header(fixture_dir("base") / file)
        assert made == official, sorted(set(made) ^ set(official))[:5]
    ckpt = load_checkpoint(str(out))
    assert ckpt.config["speaker_encoder_config"] == load_checkpoint(
        str(fixture_dir("base"))).config["speaker_encoder_config"]
    model = TTSModel.from_checkpoint(ckpt, device=torch.device("cpu"), dtype=torch.float32)
    assert model.tasks() == ["voice_clone"] and not model.speakers()
    wav = torch.randn(48000, generator=torch.Generator().manual_seed(0)) * 0.1
    voice = model.voice_prompt((wav.numpy(), 24000), x_vector_only=True)
    assert voice.x_vector.shape == (64,) and bool(torch.isfinite(voice.x_vector).all())
    _, codes = offline.synthesize(model, SynthesisParams(text="Hello there.", task="voice_clone", voice=voice,
                                                         greedy=True, max_new_tokens=4))
    assert 1 <= codes.shape[0] <= 4 and codes.shape[1] == 16


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    """The same bytes from another process and from this one."""
    for name, run in (("a", make_in_a_process), ("b", make)):
        r = run("--size", "tiny", "--out", str(tmp_path / name), "--seed", "11")
        assert r.returncode == 0, r.stderr
    for file in ("model.safetensors", "speech_tokenizer/model.safetensors"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes(), file
    r = make("--size", "tiny", "--out", str(tmp_path / "c"), "--seed", "12")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "c" / "model.safetensors").read_bytes() != (tmp_path / "a" / "model.safetensors").read_bytes()


@pytest.mark.parametrize("args, fragment", [
    (["--size", "3B"], "unknown --size '3B'"),
    (["--size", "tiny", "--type", "clone"], "unknown --type 'clone'"),
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
    from omni_tts.models.checkpoint_maker import _random_tensors, module_shapes
    from omni_tts.models.codec.decoder import CodecDecoder
    from omni_tts.models.codec.layers import SnakeBeta

    config, _, codec_config = make_configs("1.7B")
    _, speech = module_shapes(config, codec_config)
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


def _expand(patterns: str) -> set[str]:
    """The names a RELEASED_TENSORS entry stands for."""
    def choices(m: re.Match) -> list[str]:
        out: list[str] = []
        for part in m.group(1).split(","):
            lo, _, hi = part.partition("-")
            out += [str(i) for i in range(int(lo), int(hi or lo) + 1)]
        return out

    names: set[str] = set()
    for line in patterns.split():
        fixed = re.split(r"\{[^}]*\}", line)
        for pick in itertools.product(*(choices(m) for m in re.finditer(r"\{([^}]*)\}", line))):
            names.add("".join(a + b for a, b in itertools.zip_longest(fixed, pick, fillvalue="")))
    return names


def _header(file: Path) -> dict[str, tuple]:
    from safetensors import safe_open

    with safe_open(str(file), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def _indices_dropped(names: set[str]) -> set[str]:
    return {re.sub(r"(?<=\.)\d+(?=\.)", "#", n) for n in names}


@pytest.mark.parametrize("kind", ["custom_voice", "voice_design"])
def test_made_checkpoint_holds_every_released_tensor_with_the_released_shapes(tmp_path: Path, kind: str) -> None:
    out = make_checkpoint(tmp_path / kind, "tiny", kind, seed=3)
    for file, patterns in RELEASED_TENSORS.items():
        made, official = _header(out / file), _header(fixture_dir(kind) / file)
        assert _expand(patterns) == set(official), f"{file}: the list above no longer matches the fixture"
        assert set(made) == _expand(patterns), (file, sorted(set(made) ^ _expand(patterns))[:5])
        assert made == official, [(k, made[k], official[k]) for k in made if made[k] != official[k]][:5]
    assert all(k in _header(out / "speech_tokenizer/model.safetensors")
               for k in ("decoder.quantizer.rvq_first.input_proj.weight", "encoder.downsample.conv.weight"))


def test_made_checkpoints_speech_tokenizer_encoder_loads_strictly_and_encodes(tmp_path: Path) -> None:
    from omni_tts.models.codec.encoder import CodecEncoder

    ckpt = load_checkpoint(str(make_checkpoint(tmp_path / "cv", "tiny", seed=5)))
    encoder = CodecEncoder.from_checkpoint(ckpt)
    wav = torch.randn(1, 24000, generator=torch.Generator().manual_seed(0)) * 0.1
    codes = encoder.encode(wav)
    assert codes.shape == (1, 13, 16) and int(codes.min()) >= 0 and int(codes.max()) < 2048
    assert len(set(codes[0, :, 1].tolist())) > 1  # random codebooks, but not all one code


@pytest.mark.parametrize("size", ["0.6B", "1.7B"])
def test_real_size_shape_tables_have_the_released_names(size: str) -> None:
    """The same tensors as the released checkpoints, their counts from the real configs (the 0.6B talker is as
    wide as its code predictor, so it has no small_to_mtp_projection, as the official model builds it)."""
    table = shape_table(size)
    for file, patterns in RELEASED_TENSORS.items():
        want = _indices_dropped(_expand(patterns))
        if size == "0.6B" and file == "model.safetensors":
            want = {n for n in want if "small_to_mtp_projection" not in n}
        assert _indices_dropped(set(table[file])) == want, file


@pytest.mark.parametrize("size, file, name, shape", [
    ("1.7B", "model.safetensors", "talker.model.layers.27.self_attn.q_proj.weight", (2048, 2048)),
    ("1.7B", "model.safetensors", "talker.model.layers.27.self_attn.k_proj.weight", (1024, 2048)),
    ("1.7B", "model.safetensors", "talker.model.text_embedding.weight", (151936, 2048)),
    ("1.7B", "model.safetensors", "talker.codec_head.weight", (3072, 2048)),
    ("1.7B", "model.safetensors", "talker.code_predictor.small_to_mtp_projection.weight", (1024, 2048)),
    ("1.7B", "model.safetensors", "talker.code_predictor.model.layers.4.mlp.gate_proj.weight", (3072, 1024)),
    ("1.7B", "model.safetensors", "speaker_encoder.fc.weight", (2048, 3072, 1)),  # Base only
    ("0.6B", "model.safetensors", "speaker_encoder.blocks.0.conv.weight", (512, 128, 5)),
    ("0.6B", "model.safetensors", "talker.model.layers.27.mlp.down_proj.weight", (1024, 3072)),
    ("0.6B", "model.safetensors", "talker.text_projection.linear_fc2.weight", (1024, 2048)),
    ("0.6B", "model.safetensors", "talker.code_predictor.model.codec_embedding.14.weight", (2048, 1024)),
    # the speech tokenizer is the same for both sizes: these are the shapes vLLM-Omni 0.26's strict loader
    # asks for, and those of the released decoder
    ("1.7B", "speech_tokenizer/model.safetensors", "encoder.encoder.layers.0.conv.weight", (64, 1, 7)),
    ("1.7B", "speech_tokenizer/model.safetensors", "encoder.encoder.layers.12.conv.weight", (1024, 512, 16)),
    ("1.7B", "speech_tokenizer/model.safetensors", "encoder.encoder.layers.14.conv.weight", (512, 1024, 3)),
    ("0.6B", "speech_tokenizer/model.safetensors", "encoder.encoder_transformer.layers.7.mlp.fc1.weight",
     (2048, 512)),
    ("0.6B", "speech_tokenizer/model.safetensors", "encoder.downsample.conv.weight", (512, 512, 4)),
    ("1.7B", "speech_tokenizer/model.safetensors",
     "encoder.quantizer.acoustic_residual_vector_quantizer.input_proj.weight", (256, 512, 1)),
    ("1.7B", "speech_tokenizer/model.safetensors",
     "encoder.quantizer.acoustic_residual_vector_quantizer.layers.30.codebook.embed_sum", (2048, 256)),
    ("1.7B", "speech_tokenizer/model.safetensors", "decoder.quantizer.rvq_rest.input_proj.weight", (256, 512, 1)),
    ("1.7B", "speech_tokenizer/model.safetensors",
     "decoder.quantizer.rvq_rest.vq.layers.14._codebook.embedding_sum", (2048, 256)),
    ("1.7B", "speech_tokenizer/model.safetensors", "decoder.pre_transformer.layers.7.mlp.gate_proj.weight",
     (1024, 512)),
])
def test_real_size_shape_tables_give_the_released_shapes(size: str, file: str, name: str, shape: tuple) -> None:
    table = shape_table(size, "base" if name.startswith("speaker_encoder.") else "custom_voice")
    assert table[file][name] == shape
