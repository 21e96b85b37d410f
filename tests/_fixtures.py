"""The tiny reference checkpoints and golden outputs made by the official qwen-tts 0.1.1 (tests/fixtures/),
and a free local port for tests that start a server."""

from __future__ import annotations

import socket
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "qwen3_tts_tiny"


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
