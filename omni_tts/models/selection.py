"""Which checkpoint to open when none is named: the HF cache, the Hub, or the embedded tiny checkpoint.

Owns model selection (`select_model`, `open_checkpoint`) and the embedded demo checkpoint the package
makes itself (`load_embedded`: verified on load, rebuilt when broken). Reading a checkpoint directory
is omni_tts.models.checkpoint's; making one is omni_tts.models.checkpoint_maker's.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omni_tts.errors import CheckpointError
from omni_tts.models.checkpoint import DEFAULT_HUB_MODEL, Checkpoint, load_checkpoint
from omni_tts.models.checkpoint_maker import EMBEDDED_VERSION, embedded_checkpoint_dir, module_shapes


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

    return (str(embedded_checkpoint_dir()),
            f"no --model, no Qwen3-TTS in the local HF cache, Hub unavailable ({why}): embedded demo checkpoint")


def open_checkpoint(model: str | None, progress: Callable[[str], None] | None = None) -> Checkpoint:
    """`select_model` then `load_checkpoint`, with the reason for the choice in `notes` and the
    embedded demo recognised by its directory name (no demo is built unless it is the one chosen); the
    demo this selection chose itself is verified and rebuilt when broken (`load_embedded`)."""

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

    ckpt = load_checkpoint(path, embedded=True)
    try:
        model_shapes, speech_shapes = module_shapes(ckpt.config, ckpt.codec_config)
    except Exception as e:  # a config the modules cannot be built from, whatever the module raises
        raise CheckpointError(f"{path / 'config.json'}: not the embedded demo's config ({e})") from None
    for name, want, have in (("model.safetensors", model_shapes, ckpt.weights),
                             ("speech_tokenizer/model.safetensors", speech_shapes, ckpt.codec_weights)):
        bad = [k for k, shape in want.items() if k not in have or tuple(have[k].shape) != shape]
        if bad:
            raise CheckpointError(f"{path / name}: incomplete ({len(bad)} tensors missing or misshapen, "
                                  f"e.g. '{bad[0]}')")
    return ckpt
