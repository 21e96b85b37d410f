"""What a result JSON records about its run: the command, when, the code that ran and the machine.

The code is named twice. git's HEAD of the work tree the package sits in, with whether the package's
sources differ from HEAD's at the same place (`commit_dirty`): a copied tree or another commit's archive
unpacked in a subfolder reports the HEAD of whatever repository encloses it, and differs. And a digest
of the package's own source files (`source_digest`), which names the code that ran wherever it ran;
`omni-tts source-digest [REV ...]` prints this tree's digest, or each commit's, to match a result to its
commit.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import shlex
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from omni_tts.errors import OmniTTSError

PACKAGE = Path(__file__).resolve().parents[1]
ROOT = PACKAGE.parent  # the directory holding the omni_tts package
SOURCE_SUFFIXES = (".py", ".yaml")  # the code and the presets shipped inside the package


def digest(files: Iterable[tuple[str, bytes]]) -> str:
    """A digest of (path relative to the package, contents) pairs, in any order."""
    h = hashlib.sha256()
    for rel, data in sorted(f for f in files if f[0].endswith(SOURCE_SUFFIXES)):
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:16]


def tree_digest(package: Path = PACKAGE) -> str:
    """The digest of the package folder as it is on disk (caches and bytecode left out)."""
    return digest((p.relative_to(package).as_posix(), p.read_bytes()) for p in package.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


def archive(rev: str, repo: Path = ROOT, name: str = "omni_tts") -> bytes:
    """`git archive` of the folder `name` as commit `rev` of `repo` has it: a tar (CalledProcessError with
    git's stderr for a revision git does not know)."""
    return subprocess.run(["git", "archive", rev, name], cwd=repo, capture_output=True, check=True, timeout=60).stdout


def rev_digest(rev: str, repo: Path = ROOT, name: str = "omni_tts") -> str:
    """The digest of the package folder `name` as commit `rev` of `repo` has it."""
    with tarfile.open(fileobj=io.BytesIO(archive(rev, repo, name))) as t:
        return digest((m.name[len(name) + 1:], t.extractfile(m).read()) for m in t.getmembers() if m.isfile())


def _git(package: Path, *args: str) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=package, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def _head_digest(package: Path, commit: str) -> str | None:
    """The digest of the package's folder as `commit` has it at the same place (None: it has none there)."""
    top = _git(package, "rev-parse", "--show-toplevel")
    try:
        return rev_digest(commit, Path(top), package.resolve().relative_to(Path(top).resolve()).as_posix())
    except (TypeError, ValueError, OSError, subprocess.SubprocessError):
        return None


def provenance(package: Path = PACKAGE) -> dict[str, Any]:
    """The run's record: command, UTC start, git HEAD and whether the package differs from it, the
    package's source digest, Python, torch and the GPU."""
    commit = _git(package, "rev-parse", "HEAD")
    source = tree_digest(package)
    try:
        import torch
    except ImportError:  # an HTTP client's record: no torch needed
        torch = None
    gpu = torch.cuda.get_device_name() if torch is not None and torch.cuda.is_available() else None
    # `gpu` keeps the machine's GPU where a tool's own `device` (the run's: "cuda", "cpu") replaces ours
    return {"command": shlex.join(sys.argv), "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "commit": commit, "commit_dirty": None if commit is None else source != _head_digest(package, commit),
            "source_digest": source, "python": sys.version.split()[0],
            "torch": torch.__version__ if torch else None, "gpu": gpu, "device": gpu or "cpu"}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("revs", nargs="*", metavar="REV", help="commits to digest (default: this tree)")


def main(args: argparse.Namespace) -> int:
    if not args.revs:
        print(f"{tree_digest()}  (this tree: {PACKAGE})")
    for rev in args.revs:
        try:
            print(f"{rev_digest(rev)}  {rev}")
        except (OSError, subprocess.SubprocessError) as e:
            raise OmniTTSError(f"cannot read commit {rev!r} of {ROOT} with git: {e}") from None
    return 0
