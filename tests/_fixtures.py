"""The tiny reference checkpoints and golden outputs made by the official qwen-tts 0.1.1 (tests/fixtures/)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "qwen3_tts_tiny"


def fixture_dir(name: str) -> Path:
    """FIXTURES/name; a missing fixture is a broken checkout, so it fails instead of skipping."""
    d = FIXTURES / name
    assert (d / "config.json").is_file(), f"tiny Qwen3-TTS fixture missing at {d} (is the checkout complete?)"
    return d
