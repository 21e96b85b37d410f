"""Making checkpoints in the released layout: the embedded tiny random default, and random weights
at the real 0.6B / 1.7B sizes for GPU speed work where real weights are absent.

Owns: the size table, config.json / generation_config.json / speech_tokenizer config, a small
byte-level tokenizer with the special tokens at the ids the config names, and deterministic random
weights for every tensor the released checkpoints hold, with their names and shapes (`shape_table`,
derived from our own modules, so our loaders accept them; the speech tokenizer's encoder included, so
loaders that want the whole released layout do too). Weight values don't change speed; the audio of
such a model is noise.
Knows nothing about serving or requests.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import torch

# (talker hidden, layers, intermediate, text hidden, predictor hidden, predictor layers, predictor
#  intermediate, heads, kv heads, head dim, codec decoder: hidden, latent, decoder_dim, layers, heads;
#  codec encoder: hidden, conv filters, layers, heads, head dim, intermediate, codebook dim, quantizers)
_RELEASED_ENCODER = dict(enc_hidden=512, enc_filters=64, enc_layers=8, enc_heads=8, enc_head_dim=64, enc_inter=2048,
                         enc_codebook_dim=256, enc_quantizers=32)  # one speech tokenizer for both sizes
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden=64, layers=3, inter=128, text_hidden=48, text_vocab=277, cp_hidden=32, cp_layers=2,
                 cp_inter=64, heads=4, kv=2, head_dim=16, cp_heads=4, cp_kv=2, cp_head_dim=16,
                 dec_hidden=32, dec_latent=32, dec_dim=64, dec_layers=2, dec_heads=2, dec_head_dim=16,
                 dec_inter=64, codebook_dim=16, model_size="tiny", enc_hidden=32, enc_filters=4, enc_layers=1,
                 enc_heads=2, enc_head_dim=16, enc_inter=64, enc_codebook_dim=16, enc_quantizers=16,
                 speaker_encoder=dict(enc_channels=[64, 64, 64, 64, 192], enc_attention_channels=32,
                                      enc_se_channels=32)),
    "0.6B": dict(hidden=1024, layers=28, inter=3072, text_hidden=2048, text_vocab=151936, cp_hidden=1024,
                 cp_layers=5, cp_inter=3072, heads=16, kv=8, head_dim=128, cp_heads=16, cp_kv=8, cp_head_dim=128,
                 dec_hidden=512, dec_latent=1024, dec_dim=1536, dec_layers=8, dec_heads=16, dec_head_dim=64,
                 dec_inter=1024, codebook_dim=512, model_size="0b6", **_RELEASED_ENCODER),
    "1.7B": dict(hidden=2048, layers=28, inter=6144, text_hidden=2048, text_vocab=151936, cp_hidden=1024,
                 cp_layers=5, cp_inter=3072, heads=16, kv=8, head_dim=128, cp_heads=16, cp_kv=8, cp_head_dim=128,
                 dec_hidden=512, dec_latent=1024, dec_dim=1536, dec_layers=8, dec_heads=16, dec_head_dim=64,
                 dec_inter=1024, codebook_dim=512, model_size="1b7", **_RELEASED_ENCODER),
}
SPEAKERS = {"vivian": 3065, "serena": 3066, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861,
            "ono_anna": 2873, "sohee": 2864, "eric": 2875, "dylan": 2878}
DIALECTS = {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}
LANGUAGES = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
             "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
             "beijing_dialect": 2074, "sichuan_dialect": 2062}


def _special_ids(size: str) -> dict[str, int]:
    if size == "tiny":
        return {"<|endoftext|>": 261, "<|im_start|>": 262, "<|im_end|>": 263, "assistant": 264, "user": 265,
                "<tts_pad>": 266, "<tts_text_bos>": 267, "<tts_text_eod>": 268}
    return {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "assistant": 77091,
            "user": 872, "<tts_pad>": 151671, "<tts_text_bos>": 151672, "<tts_text_eod>": 151673}


def _byte_symbols() -> list[str]:
    """The 256 printable stand-ins byte-level BPE uses for bytes (GPT-2 scheme)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def write_tokenizer_files(out: Path, size: str) -> None:
    """A small byte-level BPE tokenizer (every byte a token, a few merges) with the special tokens
    at the ids the config names. Real checkpoints ship Qwen's full tokenizer instead."""
    specials = _special_ids(size)
    symbols = _byte_symbols()
    merges = [("t", "h"), ("e", "r"), ("i", "n"), ("Ġ", "t"), ("Ġ", "a")]
    vocab = {s: i for i, s in enumerate(symbols)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab.update({k: v for k, v in specials.items() if k in ("assistant", "user")})
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for t, i in specials.items()}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "model_max_length": 32768, "errors": "replace",
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "clean_up_tokenization_spaces": False, "split_special_tokens": False,
        "added_tokens_decoder": added}, indent=1))
    (out / "preprocessor_config.json").write_text(json.dumps({
        "padding_side": "left", "padding_value": 0.0, "processor_class": "Qwen3TTSProcessor",
        "return_attention_mask": True}))


def _encoder_config(s: dict[str, Any]) -> dict[str, Any]:
    """speech_tokenizer/config.json's encoder_config (a Mimi-style encoder) for a row of SIZES."""
    return dict(_frame_rate=12.5, attention_bias=False, attention_dropout=0.0, audio_channels=1,
                codebook_dim=s["enc_codebook_dim"], codebook_size=2048, compress=2, dilation_growth_rate=2,
                head_dim=s["enc_head_dim"], hidden_act="gelu", hidden_size=s["enc_hidden"], initializer_range=0.02,
                intermediate_size=s["enc_inter"], kernel_size=7, last_kernel_size=3, layer_scale_initial_scale=0.01,
                max_position_embeddings=8000, model_type="mimi", norm_eps=1e-5, num_attention_heads=s["enc_heads"],
                num_filters=s["enc_filters"], num_hidden_layers=s["enc_layers"], num_key_value_heads=s["enc_heads"],
                num_quantizers=s["enc_quantizers"], num_residual_layers=1, num_semantic_quantizers=1,
                pad_mode="constant", residual_kernel_size=3, rope_theta=10000.0, sampling_rate=24000,
                sliding_window=250, trim_right_ratio=1.0, upsample_groups=s["enc_hidden"],
                upsampling_ratios=[8, 6, 5, 4], use_cache=False, use_causal_conv=True, use_conv_shortcut=False,
                use_streaming=False, vector_quantization_hidden_dimension=s["enc_codebook_dim"])


def _speaker_config(s: dict[str, Any], model_type: str) -> dict[str, Any]:
    """speaker_encoder_config: a Base checkpoint's spells out what its speaker encoder is built with (the
    ECAPA defaults at the real sizes, smaller channels for tiny)."""
    if model_type != "base":
        return {"enc_dim": s["hidden"]}
    return {"enc_dim": s["hidden"], "sample_rate": 24000, **s.get("speaker_encoder", {})}


def make_configs(size: str, model_type: str = "custom_voice") -> tuple[dict, dict, dict]:
    """(config.json, generation_config.json, speech_tokenizer/config.json) for a size in SIZES."""
    s = SIZES[size]
    sp = _special_ids(size)
    cp = dict(vocab_size=2048, hidden_size=s["cp_hidden"], intermediate_size=s["cp_inter"],
              num_hidden_layers=s["cp_layers"], num_attention_heads=s["cp_heads"],
              num_key_value_heads=s["cp_kv"], head_dim=s["cp_head_dim"], hidden_act="silu",
              max_position_embeddings=65536, rms_norm_eps=1e-6, rope_theta=1000000, rope_scaling=None,
              attention_bias=False, num_code_groups=16, model_type="qwen3_tts_talker_code_predictor")
    speakers = SPEAKERS if model_type == "custom_voice" else {}  # Base and VoiceDesign have no built-in voices
    talker = dict(code_predictor_config=cp, vocab_size=3072, hidden_size=s["hidden"], intermediate_size=s["inter"],
                  num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv"],
                  head_dim=s["head_dim"], hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6,
                  rope_theta=1000000, attention_bias=False, num_code_groups=16, text_hidden_size=s["text_hidden"],
                  text_vocab_size=s["text_vocab"], position_id_per_seconds=13,
                  rope_scaling={"interleaved": True, "mrope_section": [24, 20, 20] if s["head_dim"] == 128
                                else [4, 2, 2], "rope_type": "default"},
                  codec_eos_token_id=2150, codec_think_id=2154, codec_nothink_id=2155, codec_think_bos_id=2156,
                  codec_think_eos_id=2157, codec_pad_id=2148, codec_bos_id=2149,
                  codec_language_id=dict(LANGUAGES), spk_id=dict(speakers),
                  spk_is_dialect={k: DIALECTS.get(k, False) for k in speakers}, model_type="qwen3_tts_talker")
    config = dict(architectures=["Qwen3TTSForConditionalGeneration"], model_type="qwen3_tts",
                  tokenizer_type="qwen3_tts_tokenizer_12hz", tts_model_size=s["model_size"],
                  tts_model_type=model_type, talker_config=talker, im_start_token_id=sp["<|im_start|>"],
                  im_end_token_id=sp["<|im_end|>"], assistant_token_id=sp["assistant"],
                  tts_pad_token_id=sp["<tts_pad>"], tts_bos_token_id=sp["<tts_text_bos>"],
                  tts_eos_token_id=sp["<tts_text_eod>"], speaker_encoder_config=_speaker_config(s, model_type))
    gen = dict(do_sample=True, top_k=50, top_p=1.0, temperature=0.9, repetition_penalty=1.05,
               subtalker_dosample=True, subtalker_top_k=50, subtalker_top_p=1.0, subtalker_temperature=0.9,
               max_new_tokens=8192)
    dec = dict(codebook_size=2048, codebook_dim=s["codebook_dim"], hidden_size=s["dec_hidden"],
               latent_dim=s["dec_latent"], decoder_dim=s["dec_dim"], num_hidden_layers=s["dec_layers"],
               num_attention_heads=s["dec_heads"], num_key_value_heads=s["dec_heads"], head_dim=s["dec_head_dim"],
               intermediate_size=s["dec_inter"], hidden_act="silu", layer_scale_initial_scale=0.01,
               max_position_embeddings=8000, rms_norm_eps=1e-5, rope_theta=10000, sliding_window=72,
               attention_bias=False, attention_dropout=0.0, num_quantizers=16, upsample_rates=[8, 5, 4, 3],
               upsampling_ratios=[2, 2])
    codec = dict(architectures=["Qwen3TTSTokenizerV2Model"], model_type="qwen3_tts_tokenizer_12hz",
                 decoder_config=dec, encoder_config=_encoder_config(s), decode_upsample_rate=1920,
                 encode_downsample_rate=1920, encoder_valid_num_quantizers=16, input_sample_rate=24000,
                 output_sample_rate=24000)
    return config, gen, codec


def module_shapes(config: dict, codec_config: dict) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """Checkpoint key -> shape for model.safetensors and speech_tokenizer/model.safetensors: every tensor
    the released checkpoints hold, read off our own modules built on the meta device (no memory, no init
    cost), plus what the released files keep beyond what our modules hold (the decoder's codebooks as
    running sums, its quantizers' encoder-side input projections)."""
    from omni_tts.models.code_predictor import CodePredictor
    from omni_tts.models.codec.decoder import CodecDecoder
    from omni_tts.models.codec.encoder import CodecEncoder
    from omni_tts.models.talker import Talker

    tc = config["talker_config"]
    with torch.device("meta"):
        talker = Talker(tc)
        predictor = CodePredictor(tc["code_predictor_config"], talker.hidden_size, talker.codec_embedding)
        codec = CodecDecoder(codec_config)
        encoder = CodecEncoder(codec_config)
        speaker = _speaker_encoder(config) if config["tts_model_type"] == "base" else None
    model: dict[str, tuple] = {}
    for k, v in talker.state_dict().items():
        top = k.startswith(("text_projection.", "codec_head."))
        model[("talker." if top else "talker.model.") + k] = tuple(v.shape)
    for k, v in predictor.state_dict().items():
        top = k.startswith(("lm_head.", "small_to_mtp_projection."))
        model[("talker.code_predictor." if top else "talker.code_predictor.model.") + k] = tuple(v.shape)
    for k, v in (speaker.state_dict() if speaker is not None else {}).items():
        model["speaker_encoder." + k] = tuple(v.shape)
    speech: dict[str, tuple] = {"decoder." + k: tuple(v.shape) for k, v in codec.state_dict().items()}
    speech.update({"encoder." + k: tuple(v.shape) for k, v in encoder.state_dict().items()})
    for name, group in codec.quantizer.items():
        n, size, dim = group.tables.shape
        speech[f"decoder.quantizer.{name}.input_proj.weight"] = (dim, group.output_proj.out_channels, 1)
        for i in range(n):
            speech[f"decoder.quantizer.{name}.vq.layers.{i}._codebook.embedding_sum"] = (size, dim)
            speech[f"decoder.quantizer.{name}.vq.layers.{i}._codebook.cluster_usage"] = (size,)
    return model, speech


def _speaker_encoder(config: dict) -> Any:
    from omni_tts.models.speaker import SpeakerEncoder  # here: it reads audio files, so it needs soundfile

    return SpeakerEncoder(config["speaker_encoder_config"])


def shape_table(size: str, model_type: str = "custom_voice") -> dict[str, dict[str, tuple]]:
    """File (relative to the checkpoint) -> tensor name -> shape, as make_checkpoint writes them; builds
    no weights, so it is cheap at every size."""
    config, _, codec_config = make_configs(size, model_type)
    model, speech = module_shapes(config, codec_config)
    return {"model.safetensors": model, "speech_tokenizer/model.safetensors": speech}


def _random_tensors(shapes: dict[str, tuple], gen: torch.Generator, device: torch.device,
                    dtype: torch.dtype, std: float, fan_in: bool = False) -> dict[str, torch.Tensor]:
    """Norms and scales 1, biases 0, other tensors normal with `std`; with `fan_in`, weights that are not
    codebooks get std 0.5/sqrt(their inputs per output) instead (each layer about halves its input's scale),
    so activations stay bounded through many layers as in a trained network, without the chaotic growth that
    would magnify float rounding (see make_checkpoint)."""
    out = {}
    for key in sorted(shapes):
        shape = shapes[key]
        if key.endswith("cluster_usage") or (len(shape) == 1 and not key.endswith("bias")):
            t = torch.ones(shape, device=device, dtype=dtype)  # norms, scales, codebook usage
        elif len(shape) == 1:
            t = torch.zeros(shape, device=device, dtype=dtype)  # biases
        else:
            scale = 0.5 / math.sqrt(math.prod(shape[1:])) if fan_in and "codebook." not in key else std
            t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32).mul_(scale).to(dtype)
        out[key] = t.contiguous()
    return out


def _save(tensors: dict[str, torch.Tensor], file: Path, metadata: dict[str, str]) -> None:
    """save_file, then the header's metadata put in sorted order in place: safetensors keeps it in a
    hash map, so without this the file's bytes would change from run to run."""
    from safetensors.torch import save_file

    save_file(tensors, str(file), metadata=metadata)
    with open(file, "r+b") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) > size:  # same content, so only a different escaping could do this
            raise RuntimeError(f"{file}: cannot canonicalise the safetensors header")
        f.seek(8)
        f.write(text.ljust(size))


def make_checkpoint(out: str | os.PathLike, size: str = "tiny", model_type: str = "custom_voice",
                    seed: int = 0, device: str = "cpu", dtype: str = "float32",
                    max_new_tokens: int | None = None) -> Path:
    """Write a random-weight checkpoint in the released layout to `out` (created; must not exist
    or be empty). Deterministic, to the byte, for a (size, seed, device)."""
    if size not in SIZES:
        raise ValueError(f"unknown size '{size}'; valid: {', '.join(SIZES)}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty")
    (out / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    config, gen_cfg, codec_cfg = make_configs(size, model_type)
    if max_new_tokens:
        gen_cfg["max_new_tokens"] = max_new_tokens
    dev, dt = torch.device(device), getattr(torch, dtype)
    gen = torch.Generator(dev).manual_seed(seed)
    model_shapes, speech_shapes = module_shapes(config, codec_cfg)
    meta = {"format": "pt", "made_by": "omni_tts.models.checkpoint_maker", "note": "random weights: noise"}
    _save({k: v.cpu() for k, v in _random_tensors(model_shapes, gen, dev, dt, 0.02).items()},
          out / "model.safetensors", meta)
    # the speech tokenizer's weights by fan-in: with a flat std its vocoder's activations grow to ~1e7, where
    # sin() (SnakeBeta) takes its slow argument-reduction path and the codec decodes several times slower
    # than a trained one (docs/benchmarks.md); weight values must not change speed
    _save({k: v.cpu() for k, v in _random_tensors(speech_shapes, gen, dev, dt, 0.05, fan_in=True).items()},
          out / "speech_tokenizer" / "model.safetensors", meta)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=1))
    (out / "speech_tokenizer" / "config.json").write_text(json.dumps(codec_cfg, indent=1))
    (out / "speech_tokenizer" / "preprocessor_config.json").write_text(json.dumps(
        {"feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1, "padding_side": "right",
         "padding_value": 0.0, "return_attention_mask": True, "sampling_rate": 24000}))
    write_tokenizer_files(out, size)
    return out


EMBEDDED_VERSION = 3


def embedded_checkpoint_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The embedded tiny random CustomVoice checkpoint, made once (seed 0) in ~/.cache/omni_tts/."""
    root = Path(cache_dir or os.environ.get("OMNI_TTS_CACHE", Path.home() / ".cache" / "omni_tts"))
    target = root / f"embedded-tiny-custom_voice-v{EMBEDDED_VERSION}"
    if (target / "config.json").is_file():
        return target
    tmp = root / f".{target.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    make_checkpoint(tmp, "tiny", "custom_voice", seed=0, max_new_tokens=120)
    try:
        os.replace(tmp, target)  # atomic: a concurrent maker's identical copy may win
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
