"""Checkpoint loading in the released Hugging Face layout.

Owns: finding a checkpoint (local dir, or a Hub id fetched with huggingface_hub when there is
network), reading `config.json`, `generation_config.json`, the (possibly sharded) safetensors, and
`speech_tokenizer/`, with one-line errors naming the file and key that is wrong (sizes bounded by
omni_tts.models.checkpoint_limits before any tensor is read). Which checkpoint to open when none is
named is omni_tts.models.selection's. Does not know how the tensors are used: model modules read
their own sizes from `Checkpoint.config`.
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
from omni_tts.models.checkpoint_limits import check_configs

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


def read_json(file: Path, missing: str = "not a Qwen3-TTS checkpoint directory?") -> dict[str, Any]:
    """The JSON object in `file`, or a one-line CheckpointError (`missing` says why a missing file matters)."""
    if not file.is_file():
        raise CheckpointError(f"{file}: file not found ({missing})")
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
    codec_dir = directory / "speech_tokenizer"
    codec_config = read_json(codec_dir / "config.json")
    check_configs(config, codec_config, generation_config, directory)  # before any tensor is read or built
    weights = load_weights(directory)
    if not any(k.startswith("talker.") for k in weights):
        raise CheckpointError(f"{directory / 'model.safetensors'}: no 'talker.*' tensors (not a Qwen3-TTS model)")
    codec_weights = load_weights(codec_dir)
    return Checkpoint(path=directory, config=config, generation_config=generation_config, weights=weights,
                      codec_config=codec_config, codec_weights=codec_weights, name=str(model),
                      is_embedded_demo=embedded)
