"""Sane bounds on a checkpoint's configs, checked when they are read, before any module or tensor exists.

Owns the bounds per size key of config.json (talker, code predictor, speaker encoder),
speech_tokenizer/config.json (decoder, encoder) and generation_config.json (the request limits of
omni_tts.config), the ranges of the special token ids, and an estimate of the parameter count refused
above MAX_PARAMETERS. So a negative, string or absurd size is one CheckpointError line instead of
minutes of allocation, an allocator error, or an out-of-range id that would fail every request.
Knows nothing about modules: the estimate follows the released architecture's shapes roughly.
"""

from __future__ import annotations

from typing import Any

from omni_tts.errors import CheckpointError, InputError
from omni_tts.limits import LIMITS, check_number

# About 6x the largest released model (1.7B parameters): float32 weights of this many take 40 GB.
MAX_PARAMETERS = 10_000_000_000
_WIDTH, _VOCAB, _LAYERS, _HEADS, _SMALL = (1, 1 << 15), (1, 1 << 20), (1, 256), (1, 256), (1, 64)
# Bounds of every size key, wherever it appears (a key a section lacks is left to the module reading it).
INT_BOUNDS: dict[str, tuple[int, int]] = {
    "hidden_size": _WIDTH, "intermediate_size": (1, 1 << 17), "text_hidden_size": _WIDTH, "head_dim": (1, 1024),
    "num_hidden_layers": _LAYERS, "num_attention_heads": _HEADS, "num_key_value_heads": _HEADS,
    "vocab_size": _VOCAB, "text_vocab_size": _VOCAB, "num_code_groups": _SMALL, "max_position_embeddings": (1, 1 << 24),
    "codebook_size": (1, 1 << 16), "codebook_dim": _WIDTH, "latent_dim": _WIDTH, "decoder_dim": _WIDTH,
    "num_quantizers": _SMALL, "num_semantic_quantizers": (0, 64), "sliding_window": (1, 1 << 16),
    "num_filters": _WIDTH, "num_residual_layers": _SMALL, "kernel_size": _SMALL, "residual_kernel_size": _SMALL,
    "last_kernel_size": _SMALL, "dilation_growth_rate": _SMALL, "compress": _SMALL,
    "vector_quantization_hidden_dimension": _WIDTH, "audio_channels": _SMALL,
    "enc_dim": _WIDTH, "enc_attention_channels": _WIDTH, "enc_res2net_scale": _SMALL, "enc_se_channels": _WIDTH,
}
LIST_BOUNDS: dict[str, tuple[int, int]] = {  # per item; at most 16 items
    "upsample_rates": _SMALL, "upsampling_ratios": _SMALL, "enc_channels": _WIDTH, "enc_kernel_sizes": _SMALL,
    "enc_dilations": _SMALL,
}
TEXT_IDS = ("tts_bos_token_id", "tts_eos_token_id", "tts_pad_token_id", "im_start_token_id", "im_end_token_id",
            "assistant_token_id")
CODEC_IDS = ("codec_eos_token_id", "codec_pad_id", "codec_bos_id", "codec_think_id", "codec_nothink_id",
             "codec_think_bos_id", "codec_think_eos_id")
GENERATION_KEYS = ("temperature", "top_k", "top_p", "repetition_penalty", "subtalker_temperature",
                   "subtalker_top_k", "subtalker_top_p", "max_new_tokens")


def _int(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{where} must be a whole number from {low} to {high} (got {value!r:.40})")
    if not low <= value <= high:
        raise CheckpointError(f"{where} must be from {low} to {high} (got {value})")
    return value


def check_section(section: Any, where: str) -> None:
    """Every bounded key present in one config section (None: not set) within its bounds."""
    if not isinstance(section, dict):
        raise CheckpointError(f"{where} must be a JSON object (got {type(section).__name__})")
    for key, value in section.items():
        if value is None:
            continue
        if key in INT_BOUNDS:
            _int(value, f"{where}.{key}", *INT_BOUNDS[key])
        elif key in LIST_BOUNDS:
            if not isinstance(value, list) or not 1 <= len(value) <= 16:
                raise CheckpointError(f"{where}.{key} must be a list of 1 to 16 whole numbers (got {value!r:.60})")
            for i, item in enumerate(value):
                _int(item, f"{where}.{key}[{i}]", *LIST_BOUNDS[key])


def _ids(values: Any, where: str, vocab: int) -> None:
    """Token ids (an int, or a name -> id mapping) that index an embedding of `vocab` rows."""
    items = values.items() if isinstance(values, dict) else [("", values)]
    for name, v in items:
        _int(v, f"{where}{'.' + str(name) if name else ''}", 0, vocab - 1)


def check_model_config(config: dict[str, Any], file: str) -> None:
    """config.json: sizes, the special ids against their vocabularies, and the parameter estimate."""
    talker = config.get("talker_config")
    check_section(talker, f"{file}: talker_config")
    check_section(talker.get("code_predictor_config"), f"{file}: talker_config.code_predictor_config")
    if config.get("speaker_encoder_config") is not None:
        check_section(config["speaker_encoder_config"], f"{file}: speaker_encoder_config")
    if isinstance(talker.get("text_vocab_size"), int):
        for key in TEXT_IDS:
            if config.get(key) is not None:
                _ids(config[key], f"{file}: {key}", talker["text_vocab_size"])
    if isinstance(talker.get("vocab_size"), int):
        for key in (*CODEC_IDS, "codec_language_id", "spk_id"):
            if talker.get(key) is not None:
                _ids(talker[key], f"{file}: talker_config.{key}", talker["vocab_size"])


def check_codec_config(codec_config: dict[str, Any], file: str) -> None:
    for name in ("decoder_config", "encoder_config"):
        if codec_config.get(name) is not None:
            check_section(codec_config[name], f"{file}: {name}")


def check_generation_config(gen: dict[str, Any], file: str) -> None:
    """Defaults a request falls back on obey the same limits as the request's own values."""
    for key in GENERATION_KEYS:
        try:
            check_number(key, gen.get(key), LIMITS[key])
        except InputError as e:
            raise CheckpointError(f"{file}: {e}") from None


def _decoder_stack(c: dict[str, Any]) -> int:
    """Parameters of a Qwen3-style decoder stack (attention + gated MLP per layer)."""
    h, inter = c.get("hidden_size") or 0, c.get("intermediate_size") or 0
    heads = c.get("num_attention_heads") or 1
    hd = c.get("head_dim") or h // heads
    kv = c.get("num_key_value_heads") or heads
    return (c.get("num_hidden_layers") or 0) * (2 * h * heads * hd + 2 * h * kv * hd + 3 * h * inter)


def estimate_parameters(config: dict[str, Any], codec_config: dict[str, Any]) -> int:
    """A rough parameter count of talker + code predictor + codec decoder (bounded sections assumed)."""
    t = config.get("talker_config") or {}
    cp = t.get("code_predictor_config") or {}
    h, th, v = t.get("hidden_size") or 0, t.get("text_hidden_size") or 0, t.get("vocab_size") or 0
    n = _decoder_stack(t) + 2 * v * h + (t.get("text_vocab_size") or 0) * th + th * th + th * h
    groups = (cp.get("num_code_groups") or t.get("num_code_groups") or 1) - 1
    n += _decoder_stack(cp) + groups * (cp.get("vocab_size") or 0) * (h + (cp.get("hidden_size") or 0))
    d = codec_config.get("decoder_config") or {}
    codebooks = (d.get("num_quantizers") or 0) * (d.get("codebook_size") or 0) * (d.get("codebook_dim") or 0)
    n += _decoder_stack(d) + codebooks
    width = d.get("decoder_dim") or 0
    n += (d.get("latent_dim") or 0) * width * 7
    for rate in d.get("upsample_rates") or []:  # each vocoder stage: a transposed conv, then residual convs
        n += width * (width // 2) * 2 * rate + 3 * 8 * (width // 2) ** 2
        width //= 2
    return n


def check_configs(config: dict[str, Any], codec_config: dict[str, Any], generation: dict[str, Any],
                  directory: Any) -> None:
    """All of the above for one checkpoint directory; raises CheckpointError with one line."""
    check_model_config(config, f"{directory}/config.json")
    check_codec_config(codec_config, f"{directory}/speech_tokenizer/config.json")
    check_generation_config(generation, f"{directory}/generation_config.json")
    n = estimate_parameters(config, codec_config)
    if n > MAX_PARAMETERS:
        raise CheckpointError(f"{directory}/config.json: about {n / 1e9:.3g} billion parameters, more than the "
                              f"{MAX_PARAMETERS / 1e9:.0f} billion this loader accepts (sizes absurd or corrupt?)")
