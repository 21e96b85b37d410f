"""Where the tiny reference checkpoints live (../shared beside the repo) and how tests ask for them."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "qwen3_tts_tiny"


def fixture_dir(name: str) -> Path:
    """FIXTURES/name, or skip the test saying where the fixture was expected."""
    d = FIXTURES / name
    if not (d / "config.json").is_file():
        pytest.skip(f"tiny Qwen3-TTS fixture not found: expected it at {d} (../shared beside the repo)")
    return d
