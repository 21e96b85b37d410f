"""Codec (speech tokenizer) ENCODER: exact code parity with the official encoder, strict loading, framing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _fixtures import FIXTURES, fixture_dir

from omni_tts.errors import CheckpointError, InputError
from omni_tts.models.checkpoint import load_checkpoint
from omni_tts.models.codec.encoder import CodecEncoder

BASE = FIXTURES / "base"


@pytest.fixture(scope="module")
def ckpt():
    return load_checkpoint(fixture_dir("base"))


@pytest.fixture(scope="module")
def encoder(ckpt):
    return CodecEncoder.from_checkpoint(ckpt)


@pytest.fixture(scope="module")
def ref_audio() -> torch.Tensor:
    return torch.from_numpy(np.load(BASE / "golden_ref_audio.npy"))


def test_codes_equal_golden(encoder, ref_audio):
    want = np.load(BASE / "golden/ref_codes.npy")
    got = encoder.encode(ref_audio[None])
    assert got.dtype == torch.long and tuple(got.shape) == (1, *want.shape)
    assert np.array_equal(got[0].numpy(), want), f"{int((got[0].numpy() != want).sum())} codes differ"


def test_only_valid_quantizers_and_sizes_from_config(ckpt, encoder):
    assert encoder.n_valid == ckpt.codec_config["encoder_valid_num_quantizers"]
    assert encoder.frame_hop == ckpt.codec_config["encode_downsample_rate"]
    cfg = dict(ckpt.codec_config, encoder_valid_num_quantizers=5)
    small = CodecEncoder(cfg)
    small.load_state_dict(encoder.state_dict())
    small.refresh_codebooks()
    audio = torch.from_numpy(np.load(BASE / "golden_ref_audio.npy"))[None]
    assert torch.equal(small.encode(audio), encoder.encode(audio)[..., :5])


def test_frames_are_ceil_of_length_and_causal(encoder, ref_audio):
    noise = torch.from_numpy(np.random.default_rng(3).standard_normal(3000).astype(np.float32) * 0.3)
    longer = torch.cat([ref_audio, noise])  # 51000 samples -> ceil(51000 / 1920) = 27 frames
    codes = encoder.encode(longer[None])[0]
    assert codes.shape[0] == -(-longer.numel() // encoder.frame_hop) == 27
    # Causal stack: appending audio leaves the codes of the first 2 s unchanged.
    assert np.array_equal(codes[:25].numpy(), np.load(BASE / "golden/ref_codes.npy"))


def test_batch_trims_each_clip(encoder, ref_audio):
    short = ref_audio[:30001]
    out = encoder.encode_batch([ref_audio, short])
    assert [tuple(c.shape) for c in out] == [(25, 16), (16, 16)]
    assert np.array_equal(out[0].numpy(), np.load(BASE / "golden/ref_codes.npy"))


def test_bad_input_shape(encoder, ref_audio):
    with pytest.raises(InputError, match="batch, samples"):
        encoder.encode(ref_audio)
    with pytest.raises(InputError, match="batch, samples"):
        encoder.encode(torch.zeros(1, 0))


@pytest.mark.parametrize("change", ["missing", "unexpected", "shape"])
def test_strict_loading_names_the_key(ckpt, change):
    weights = dict(ckpt.codec_weights)
    key = "encoder.encoder_transformer.layers.0.self_attn.q_proj.weight"
    if change == "missing":
        del weights[key]
    elif change == "unexpected":
        key = "encoder.quantizer.extra.weight"
        weights[key] = torch.zeros(1)
    else:
        weights[key] = torch.zeros(3, 3)
    broken = type(ckpt)(**{**ckpt.__dict__, "codec_weights": weights})
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        CodecEncoder.from_checkpoint(broken)


def test_missing_encoder_config_is_checkpoint_error(ckpt):
    with pytest.raises(CheckpointError, match="encoder_config"):
        CodecEncoder({k: v for k, v in ckpt.codec_config.items() if k != "encoder_config"})
