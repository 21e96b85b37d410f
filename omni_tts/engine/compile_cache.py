"""Where the compile caches live, the kernel-probe outcomes, and the portable compile artifacts that let
a fresh machine skip compiling.

Owns: the cache root (env OMNI_TTS_CACHE_DIR; else a Hugging Face Space's persistent storage `/data`
when the Space has one, so a restart finds its caches; else ~/.cache/omni_tts), Inductor's and
Triton's cache folders under it (set before the first compile), the kernel probes' outcomes keyed by
GPU, torch and Triton versions and the probe's own inputs, and an artifacts folder: `manifest.json`
(the machine it was made on), `torch_artifacts.bin` (`torch.compiler.save_cache_artifacts`),
`kernel_probes.json` and `triton_cache.tar.gz` (Triton's cache folder: the kernels of omni_tts.kernels,
launched from Python, are not in torch's artifacts). An import refuses artifacts made for another GPU or
build. Knows nothing about models, modes or the UI.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from omni_tts.errors import OmniTTSError

log = logging.getLogger("omni_tts.compile_cache")
ARTIFACTS_ENV = "OMNI_TTS_ARTIFACTS"
CACHE_ENV = "OMNI_TTS_CACHE_DIR"
MANIFEST, TORCH_BLOB, PROBES = "manifest.json", "torch_artifacts.bin", "kernel_probes.json"
TRITON_ARCHIVE = "triton_cache.tar.gz"  # our own Triton kernels: torch's artifacts hold only Inductor's
MATCH_KEYS = ("gpu", "torch", "cuda", "triton")  # what an import must find equal on this machine
_lock = threading.Lock()  # the probe cache file
_prepare_lock = threading.Lock()
_prepared: dict[str, str] = {}


class ArtifactMismatch(OmniTTSError):
    """The artifacts were made on another GPU or torch / CUDA / Triton build."""


def cache_root(env: Mapping[str, str] = os.environ, data: Path = Path("/data")) -> Path:
    """OMNI_TTS_CACHE_DIR; on a Space with persistent storage (SPACE_ID and a writable `data`, the
    Space's /data) data/omni_tts; else ~/.cache/omni_tts."""
    if env.get(CACHE_ENV):
        return Path(env[CACHE_ENV])
    if env.get("SPACE_ID") and data.is_dir() and os.access(data, os.W_OK):
        return data / "omni_tts"
    return Path(env.get("HOME") or Path.home()) / ".cache" / "omni_tts"


def use_cache_dirs(env: Any = os.environ) -> Path:
    """Point Inductor's and Triton's caches under cache_root (unless already set) -> the root."""
    root = cache_root(env)
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    env.setdefault("TRITON_CACHE_DIR", str(root / "triton"))
    return root


def machine() -> dict[str, str]:
    """This machine as an artifact depends on it: GPU name ('cpu' without one), torch, CUDA, Triton."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    try:
        import triton

        triton_version = str(triton.__version__)
    except Exception:  # no Triton: artifacts then hold no Triton kernels
        triton_version = "none"
    return {"gpu": gpu, "torch": str(torch.__version__), "cuda": str(torch.version.cuda or "none"),
            "triton": triton_version}


def mismatch(manifest: Mapping[str, Any], here: Mapping[str, str] | None = None) -> list[str]:
    """The keys where `manifest` differs from this machine, as 'key: made for X, here Y'."""
    here = here or machine()
    return [f"{k}: made for {manifest.get(k)!s}, here {here[k]}" for k in MATCH_KEYS if manifest.get(k) != here[k]]


# ------------------------------------------------------------------ kernel probes
def _probe_file(root: Path | None = None) -> Path:
    return (root or cache_root()) / PROBES


def probe_key(**inputs: Any) -> str:
    """One probe's key: this machine plus the probe's inputs (buckets, dtype, the tuning it ran under)."""
    return json.dumps({**machine(), **{k: str(v) for k, v in inputs.items()}}, sort_keys=True)


def _read_probes(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _made_on(key: str) -> dict[str, Any]:
    try:
        return {k: json.loads(key).get(k) for k in MATCH_KEYS}
    except (ValueError, AttributeError):
        return {}


def load_probe(key: str) -> dict[str, Any] | None:
    """A probe outcome saved on this machine (or imported) for `key`, else None."""
    with _lock:
        found = _read_probes(_probe_file()).get(key)
    return found if isinstance(found, dict) else None


def save_probe(key: str, outcome: Mapping[str, Any]) -> None:
    """Keep a probe's outcome; a cache that cannot be written only costs the next start its probes."""
    path = _probe_file()
    with _lock:
        data = _read_probes(path)
        data[key] = dict(outcome)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            tmp.replace(path)
        except OSError as e:
            log.warning("kernel probe outcome not cached (%s)", e)


# ------------------------------------------------------------------ artifacts
def export_artifacts(folder: str | Path) -> dict[str, Any]:
    """Write this process's compile artifacts, the probe outcomes and a manifest into `folder` -> the
    manifest ('torch_artifacts' says whether torch had any to give)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    blob = None
    if hasattr(torch.compiler, "save_cache_artifacts"):
        saved = torch.compiler.save_cache_artifacts()
        blob = saved[0] if saved else None
    if blob:
        (out / TORCH_BLOB).write_bytes(blob)
    here = machine()
    mine = {k: v for k, v in _read_probes(_probe_file()).items() if _made_on(k) == here}
    (out / PROBES).write_text(json.dumps(mine, indent=1, sort_keys=True))
    triton_files = _pack_triton_cache(out / TRITON_ARCHIVE)
    manifest = {**machine(), "torch_artifacts": bool(blob), "torch_artifacts_bytes": len(blob or b""),
                "kernel_probes": len(mine), "triton_cache_files": triton_files}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def read_manifest(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ArtifactMismatch(f"{folder}: no {MANIFEST}; export one with `omni-tts warm-cache --export`") from None
    except (OSError, ValueError) as e:
        raise ArtifactMismatch(f"{path}: not a readable manifest ({e})") from None
    if not isinstance(manifest, dict):
        raise ArtifactMismatch(f"{path}: not a manifest (a JSON object)")
    return manifest


def import_artifacts(folder: str | Path) -> dict[str, Any]:
    """Load `folder`'s artifacts into this process and its probe outcomes into the cache -> the manifest.
    Raises ArtifactMismatch (naming every difference) when they were made for another machine."""
    manifest = read_manifest(folder)
    wrong = mismatch(manifest)
    if wrong:
        raise ArtifactMismatch(f"{folder}: the artifacts do not fit this machine ({'; '.join(wrong)}); "
                               "export them again here with `omni-tts warm-cache --export DIR`")
    blob_path = Path(folder) / TORCH_BLOB
    if blob_path.is_file():
        if not hasattr(torch.compiler, "load_cache_artifacts"):
            raise ArtifactMismatch(f"torch {torch.__version__} cannot load compile artifacts")
        torch.compiler.load_cache_artifacts(blob_path.read_bytes())
    _unpack_triton_cache(Path(folder) / TRITON_ARCHIVE)
    probes = _read_probes(Path(folder) / PROBES)
    for key, outcome in probes.items():
        if isinstance(outcome, dict):
            save_probe(key, outcome)
    return manifest


def _triton_dir() -> Path:
    return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def _pack_triton_cache(archive: Path) -> int:
    """Triton's cache folder into `archive` -> files packed (0, and no archive, when it has none)."""
    import tarfile

    src = _triton_dir()
    files = sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else []
    if not files:
        archive.unlink(missing_ok=True)
        return 0
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        for path in files:
            tar.add(path, arcname=str(path.relative_to(src)))
    return len(files)


def _unpack_triton_cache(archive: Path) -> None:
    """`archive` into Triton's cache folder, keeping files already there; members are plain files only."""
    import tarfile

    if not archive.is_file():
        return
    dest = _triton_dir()
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = [m for m in tar.getmembers() if m.isfile() and not (dest / m.name).exists()]
            tar.extractall(dest, members=members, filter="data")  # "data" refuses paths that leave dest
    except (OSError, tarfile.TarError) as e:
        raise ArtifactMismatch(f"{archive}: not a readable Triton cache archive ({e})") from None


def prepare(say: Any = None) -> str:
    """Once per process, before the first compile: the cache folders, then the artifacts of
    OMNI_TTS_ARTIFACTS or <cache root>/artifacts when present. -> a one-line report ('' when none);
    artifacts that do not fit are skipped with a warning (the engine then compiles as usual)."""
    with _prepare_lock:
        if "report" in _prepared:
            return _prepared["report"]
        root = use_cache_dirs()
        folder = os.environ.get(ARTIFACTS_ENV) or (root / "artifacts" if (root / "artifacts").is_dir() else None)
        report = ""
        if folder:
            try:
                manifest = import_artifacts(folder)
                report = f"compile artifacts imported from {folder} ({manifest.get('gpu')})"
                log.info(report)
            except OmniTTSError as e:
                report = f"compile artifacts not used: {e}"
                log.warning(report)
        _prepared["report"] = report
    if report and say:
        say(report)
    return report
