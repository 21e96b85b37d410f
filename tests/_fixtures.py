"""The tiny reference checkpoints and golden outputs made by the official qwen-tts 0.1.1 (tests/fixtures/),
a free local port for tests that start a server, and the `omni-tts` command run in this process or in a
fresh one."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "qwen3_tts_tiny"


def fixture_dir(name: str) -> Path:
    """FIXTURES/name; a missing fixture is a broken checkout, so it fails instead of skipping."""
    d = FIXTURES / name
    assert (d / "config.json").is_file(), f"tiny Qwen3-TTS fixture missing at {d} (is the checkout complete?)"
    return d


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """`omni-tts ARGS` through its entry function, as the console script runs it: exit status, stdout, stderr."""
    from omni_tts.tools.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse: --help, and a bad argument (after its one error line)
            code = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(["omni-tts", *args], code, out.getvalue(), err.getvalue())


def cli_env(**env: str | None) -> dict[str, str]:
    """The environment of a fresh `python -m omni_tts` process importing this checkout, one thread per op;
    `env`: variables to set for it (None: unset)."""
    environ = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    for k, v in env.items():
        environ.pop(k, None) if v is None else environ.__setitem__(k, v)
    return environ


def run_cli_process(*args: str | bytes, text: bool = True, **env: str | None) -> subprocess.CompletedProcess:
    """`python -m omni_tts ARGS` in a fresh process importing this checkout (`cli_env(**env)`); text=False
    keeps stdout and stderr as bytes."""
    return subprocess.run([sys.executable, "-m", "omni_tts", *args], capture_output=True, text=text, env=cli_env(**env),
                          cwd=REPO, timeout=300)
