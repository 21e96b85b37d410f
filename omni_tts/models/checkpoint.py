"""Checkpoint loading in the released Hugging Face layout.

Owns: finding a checkpoint (local dir, or a Hub id fetched with huggingface_hub when there is
network), reading `config.json`, `generation_config.json`, the (possibly sharded) safetensors, and
`speech_tokenizer/`, with one-line errors naming the file and key that is wrong (sizes bounded by
omni_tts.models.checkpoint_limits before any tensor is read). Also the embedded
tiny random checkpoint (made by `omni_tts.models.checkpoint_maker`) used when no model is given.
Does not know how the tensors are used: model modules read their own sizes from `Checkpoint.config`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
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
    from omni_tts.models.checkpoint_maker import embedded_checkpoint_dir

    return (str(embedded_checkpoint_dir()),
            f"no --model, no Qwen3-TTS in the local HF cache, Hub unavailable ({why}): embedded demo checkpoint")


def open_checkpoint(model: str | None, progress: Callable[[str], None] | None = None) -> Checkpoint:
    """`select_model` then `load_checkpoint`, with the reason for the choice in `notes` and the
    embedded demo recognised by its directory name (no demo is built unless it is the one chosen); the
    demo this selection chose itself is verified and rebuilt when broken (`load_embedded`)."""
    from omni_tts.models.checkpoint_maker import EMBEDDED_VERSION

    path, reason = select_model(model, progress=progress)
    embedded = Path(path).name == f"embedded-tiny-custom_voice-v{EMBEDDED_VERSION}"
    chosen_here = embedded and not model and not os.environ.get("OMNI_TTS_MODEL", "").strip()
    ckpt = load_embedded(Path(path).parent, progress) if chosen_here else load_checkpoint(path, embedded=embedded)
    ckpt.notes.append(reason)
    return ckpt


def load_embedded(cache_dir: str | os.PathLike | None = None,
                  progress: Callable[[str], None] | None = None) -> Checkpoint:
    """The embedded demo checkpoint (made on first use), verified: every file present and readable and every
    tensor its modules need there with its shape. A broken one (a leftover of an interrupted run, a
    truncated file) is moved aside and made again, said through `progress`."""
    from omni_tts.models.checkpoint_maker import embedded_checkpoint_dir

    say = progress or (lambda msg: None)
    try:
        path = embedded_checkpoint_dir(cache_dir)
    except OSError as e:
        raise CheckpointError(f"cannot make the embedded demo checkpoint ({str(e).splitlines()[0]})") from None
    try:
        return _verified_embedded(path)
    except CheckpointError as e:
        say(f"the embedded demo checkpoint at {path} is broken ({e}); rebuilding it")
    try:
        aside = path.with_name(f".{path.name}.broken{os.getpid()}")
        try:
            os.replace(path, aside)  # atomic: a concurrent run sees either the broken dir or none
        except FileNotFoundError:
            pass  # another run moved it first
        shutil.rmtree(aside, ignore_errors=True)
        return _verified_embedded(embedded_checkpoint_dir(cache_dir))
    except (CheckpointError, OSError) as e:
        raise CheckpointError(f"the embedded demo checkpoint at {path} is broken and could not be rebuilt "
                              f"({str(e).splitlines()[0]}); delete {path} and run again") from None


def _verified_embedded(path: Path) -> Checkpoint:
    """load_checkpoint, then every tensor the maker writes present with its shape (strict loading would
    find a missing one only later, inside the model)."""
    from omni_tts.models.checkpoint_maker import _module_shapes

    ckpt = load_checkpoint(path, embedded=True)
    try:
        model_shapes, speech_shapes = _module_shapes(ckpt.config, ckpt.codec_config)
    except Exception as e:  # a config the modules cannot be built from, whatever the module raises
        raise CheckpointError(f"{path / 'config.json'}: not the embedded demo's config ({e})") from None
    for name, want, have in (("model.safetensors", model_shapes, ckpt.weights),
                             ("speech_tokenizer/model.safetensors", speech_shapes, ckpt.codec_weights)):
        bad = [k for k, shape in want.items() if k not in have or tuple(have[k].shape) != shape]
        if bad:
            raise CheckpointError(f"{path / name}: incomplete ({len(bad)} tensors missing or misshapen, "
                                  f"e.g. '{bad[0]}')")
    return ckpt
