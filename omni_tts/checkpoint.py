"""Checkpoint loading in the released Hugging Face layout.

Owns: finding a checkpoint (local dir, or a Hub id fetched with huggingface_hub when there is
network), reading `config.json`, `generation_config.json`, the (possibly sharded) safetensors, and
`speech_tokenizer/`, with one-line errors naming the file and key that is wrong. Also the embedded
tiny random checkpoint (`embedded_checkpoint_dir`) used when no model is given.
Does not know how the tensors are used: model modules read their own sizes from `Checkpoint.config`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omni_tts.errors import CheckpointError

DEFAULT_HUB_MODEL = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
TEXT_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


@dataclass
class Checkpoint:
    """Everything read from one checkpoint directory. Tensors stay on CPU in their stored dtype."""

    path: Path
    config: dict[str, Any]
    generation_config: dict[str, Any]
    weights: dict[str, torch.Tensor]
    codec_config: dict[str, Any]
    codec_weights: dict[str, torch.Tensor]
    name: str = ""
    is_embedded_demo: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def talker_config(self) -> dict[str, Any]:
        return require(self.config, "talker_config", self.path / "config.json")

    @property
    def tts_model_type(self) -> str:
        return str(require(self.config, "tts_model_type", self.path / "config.json"))

    def describe(self) -> str:
        """One line for banners and logs."""
        if self.is_embedded_demo:
            return (f"embedded tiny RANDOM demo checkpoint ({self.tts_model_type}) at {self.path}: it produces "
                    f"noise, not speech. Load a real one with --model {DEFAULT_HUB_MODEL} or a local dir.")
        return f"{self.name or self.path} ({self.tts_model_type}, {self.config.get('tts_model_size', '?')})"


def require(cfg: dict[str, Any], key: str, file: Path | str) -> Any:
    """cfg[key], or a CheckpointError naming the file and the key."""
    if not isinstance(cfg, dict) or key not in cfg:
        raise CheckpointError(f"{file}: missing key '{key}'")
    return cfg[key]


def read_json(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise CheckpointError(f"{file}: file not found (not a Qwen3-TTS checkpoint directory?)")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file}: malformed JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: expected a JSON object")
    return data


def _load_safetensors_file(file: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not file.is_file():
        raise CheckpointError(f"{file}: file not found")
    try:
        return load_file(str(file), device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{file}: corrupt or unreadable safetensors ({str(e).splitlines()[0]})") from None


def load_weights(directory: Path, stem: str = "model") -> dict[str, torch.Tensor]:
    """Load `stem.safetensors` or the shards listed in `stem.safetensors.index.json`."""
    single = directory / f"{stem}.safetensors"
    index = directory / f"{stem}.safetensors.index.json"
    if single.is_file():
        return _load_safetensors_file(single)
    if index.is_file():
        weight_map = require(read_json(index), "weight_map", index)
        weights: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            weights.update(_load_safetensors_file(directory / shard))
        missing = [k for k in weight_map if k not in weights]
        if missing:
            raise CheckpointError(f"{index}: tensor '{missing[0]}' is listed but absent from its shard")
        return weights
    raise CheckpointError(f"{single}: file not found (nor {index.name})")


def _check_layout(directory: Path) -> None:
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory")
    if not (directory / "config.json").is_file():
        raise CheckpointError(f"{directory}: not a Qwen3-TTS checkpoint (no config.json)")
    for name in TEXT_FILES:
        if not (directory / name).is_file():
            raise CheckpointError(f"{directory / name}: file not found (the text tokenizer needs it)")
    if not (directory / "speech_tokenizer" / "config.json").is_file():
        raise CheckpointError(f"{directory / 'speech_tokenizer' / 'config.json'}: file not found")


def resolve_model_path(model: str | os.PathLike, hub_timeout_s: float = 10.0) -> Path:
    """A local directory as is; a Hub id downloaded (or found in the HF cache)."""
    p = Path(model).expanduser()
    if p.exists():
        return p
    s = str(model)
    if not _HUB_ID.match(s):
        raise CheckpointError(f"{s}: no such directory, and not a Hugging Face Hub id (org/name)")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - in requirements
        raise CheckpointError(f"{s}: huggingface_hub is not installed; pass a local checkpoint dir") from None
    try:
        return Path(snapshot_download(s, local_files_only=True))
    except Exception:
        pass
    try:
        os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(int(hub_timeout_s)))
        return Path(snapshot_download(s))
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(
            f"{s}: could not download from the Hugging Face Hub ({first[:160]}). Offline? Pass a local "
            f"checkpoint directory with --model DIR, or omit --model for the embedded demo model") from None


def load_checkpoint(model: str | os.PathLike, *, embedded: bool = False) -> Checkpoint:
    """Read a checkpoint (dir or Hub id) into a `Checkpoint`; raises CheckpointError with one line."""
    directory = resolve_model_path(model)
    _check_layout(directory)
    config = read_json(directory / "config.json")
    talker = require(config, "talker_config", directory / "config.json")
    require(talker, "code_predictor_config", directory / "config.json")
    for key in ("tts_model_type", "tts_bos_token_id", "tts_eos_token_id", "tts_pad_token_id"):
        require(config, key, directory / "config.json")
    gen_file = directory / "generation_config.json"
    generation_config = read_json(gen_file) if gen_file.is_file() else {}
    weights = load_weights(directory)
    if not any(k.startswith("talker.") for k in weights):
        raise CheckpointError(f"{directory / 'model.safetensors'}: no 'talker.*' tensors (not a Qwen3-TTS model)")
    codec_dir = directory / "speech_tokenizer"
    codec_config = read_json(codec_dir / "config.json")
    codec_weights = load_weights(codec_dir)
    return Checkpoint(path=directory, config=config, generation_config=generation_config, weights=weights,
                      codec_config=codec_config, codec_weights=codec_weights, name=str(model),
                      is_embedded_demo=embedded)


# ---------------------------------------------------------------------------------------------
# Making checkpoints: the embedded tiny random default, and random weights at the real sizes.
# ---------------------------------------------------------------------------------------------

# (talker hidden, layers, intermediate, text hidden, predictor hidden, predictor layers, predictor
#  intermediate, heads, kv heads, head dim, codec: decoder hidden, latent, decoder_dim, layers, heads)
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden=64, layers=3, inter=128, text_hidden=48, text_vocab=277, cp_hidden=32, cp_layers=2,
                 cp_inter=64, heads=4, kv=2, head_dim=16, cp_heads=4, cp_kv=2, cp_head_dim=16,
                 dec_hidden=32, dec_latent=32, dec_dim=64, dec_layers=2, dec_heads=2, dec_head_dim=16,
                 dec_inter=64, codebook_dim=16, model_size="tiny"),
    "0.6B": dict(hidden=1024, layers=28, inter=3072, text_hidden=2048, text_vocab=151936, cp_hidden=1024,
                 cp_layers=5, cp_inter=3072, heads=16, kv=8, head_dim=128, cp_heads=16, cp_kv=8, cp_head_dim=128,
                 dec_hidden=512, dec_latent=1024, dec_dim=1536, dec_layers=8, dec_heads=16, dec_head_dim=64,
                 dec_inter=1024, codebook_dim=512, model_size="0b6"),
    "1.7B": dict(hidden=2048, layers=28, inter=6144, text_hidden=2048, text_vocab=151936, cp_hidden=1024,
                 cp_layers=5, cp_inter=3072, heads=16, kv=8, head_dim=128, cp_heads=16, cp_kv=8, cp_head_dim=128,
                 dec_hidden=512, dec_latent=1024, dec_dim=1536, dec_layers=8, dec_heads=16, dec_head_dim=64,
                 dec_inter=1024, codebook_dim=512, model_size="1b7"),
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


def make_configs(size: str, model_type: str = "custom_voice") -> tuple[dict, dict, dict]:
    """(config.json, generation_config.json, speech_tokenizer/config.json) for a size in SIZES."""
    s = SIZES[size]
    sp = _special_ids(size)
    cp = dict(vocab_size=2048, hidden_size=s["cp_hidden"], intermediate_size=s["cp_inter"],
              num_hidden_layers=s["cp_layers"], num_attention_heads=s["cp_heads"],
              num_key_value_heads=s["cp_kv"], head_dim=s["cp_head_dim"], hidden_act="silu",
              max_position_embeddings=65536, rms_norm_eps=1e-6, rope_theta=1000000, rope_scaling=None,
              attention_bias=False, num_code_groups=16, model_type="qwen3_tts_talker_code_predictor")
    speakers = SPEAKERS if model_type == "custom_voice" else {}
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
                  tts_eos_token_id=sp["<tts_text_eod>"], speaker_encoder_config={"enc_dim": s["hidden"]})
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
                 decoder_config=dec, decode_upsample_rate=1920, encode_downsample_rate=1920,
                 encoder_valid_num_quantizers=16, input_sample_rate=24000, output_sample_rate=24000)
    return config, gen, codec


# ---------------------------------------------------------------------------------------------
# Model selection when none is named (owned by the app engineer; used by app.py and the CLI).

from collections.abc import Callable  # noqa: E402  (only this section needs it)


def cached_qwen3_tts_snapshots(cache_dir: str | os.PathLike | None = None) -> list[Path]:
    """Complete Qwen3-TTS-12Hz snapshots in the local HF hub cache, preferred first.

    Preference: the default Hub model, then other CustomVoice checkpoints, then the rest; newest
    first within each group. A snapshot counts only with config.json and speech_tokenizer/config.json.
    """
    if cache_dir is None:
        from huggingface_hub import constants

        cache_dir = constants.HF_HUB_CACHE
    root = Path(cache_dir).expanduser()
    found: list[tuple[int, float, Path]] = []
    default_dir = "models--" + DEFAULT_HUB_MODEL.replace("/", "--")
    for cfg in root.glob("models--Qwen--Qwen3-TTS-12Hz-*/snapshots/*/config.json"):
        snap = cfg.parent
        if not (snap / "speech_tokenizer" / "config.json").is_file():
            continue
        repo_dir = snap.parent.parent.name
        rank = 0 if repo_dir == default_dir else 1 if repo_dir.endswith("CustomVoice") else 2
        try:
            mtime = cfg.stat().st_mtime
        except OSError:
            continue
        found.append((rank, -mtime, snap))
    return [p for _, _, p in sorted(found)]


def hub_reachable(timeout_s: float = 3.0, repo_id: str = DEFAULT_HUB_MODEL) -> tuple[bool, str]:
    """(True, '') when the Hub answers for `repo_id` within `timeout_s`, else (False, why).

    The request runs on a daemon thread joined with a hard deadline, so a resolver or proxy that
    swallows packets cannot make this hang (HTTP timeouts alone do not cover DNS look-ups).
    """
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False, "HF_HUB_OFFLINE is set"
    import threading

    answer: dict[str, Any] = {}

    def ask() -> None:
        try:
            from huggingface_hub import HfApi

            HfApi().model_info(repo_id, timeout=timeout_s)
            answer["ok"] = True
        except Exception as e:  # offline, DNS failure, 404, auth...: all mean "don't download"
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            answer["why"] = f"{type(e).__name__}: {first[:120]}"

    t = threading.Thread(target=ask, name="omni-tts-hub-probe", daemon=True)
    t.start()
    t.join(timeout_s + 0.5)
    if answer.get("ok"):
        return True, ""
    return False, answer.get("why", f"no answer within {timeout_s:g} s")


def select_model(explicit: str | None, hub_timeout_s: float = 3.0,
                 progress: Callable[[str], None] | None = None) -> tuple[str, str]:
    """Which checkpoint to load, and why: (directory or Hub id, one-line reason).

    Order: `explicit` (--model), env OMNI_TTS_MODEL, a Qwen3-TTS-12Hz snapshot already in the local
    HF cache, `DEFAULT_HUB_MODEL` downloaded when the Hub answers within `hub_timeout_s`, and
    otherwise the embedded tiny random checkpoint. Offline returns within about `hub_timeout_s`.
    """
    say = progress or (lambda msg: None)
    if explicit:
        return str(explicit), "given with --model"
    env = os.environ.get("OMNI_TTS_MODEL", "").strip()
    if env:
        return env, "from the OMNI_TTS_MODEL environment variable"
    try:
        cached = cached_qwen3_tts_snapshots()
    except Exception:  # an unreadable cache is no reason to fail start-up
        cached = []
    if cached:
        repo = cached[0].parent.parent.name.replace("models--", "").replace("--", "/")
        return str(cached[0]), f"{repo} found in the local Hugging Face cache"
    ok, why = hub_reachable(hub_timeout_s)
    if ok:
        say(f"downloading {DEFAULT_HUB_MODEL} from the Hugging Face Hub (progress below)...")
        try:
            from huggingface_hub import snapshot_download

            path = snapshot_download(DEFAULT_HUB_MODEL)
            return str(path), f"{DEFAULT_HUB_MODEL} downloaded from the Hugging Face Hub"
        except Exception as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            why = f"download failed: {first[:120]}"
            say(f"{why}; falling back to the embedded demo checkpoint")
    from omni_tts.checkpoint import embedded_checkpoint_dir  # the lead's; late so a partial file still imports

    return (str(embedded_checkpoint_dir()),
            f"no --model, no Qwen3-TTS in the local HF cache, Hub unavailable ({why}): embedded demo checkpoint")
