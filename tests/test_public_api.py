"""The public API: what `omni_tts` exports, and README's "Use it from Python" example run as written."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys

import pytest
from _fixtures import REPO

from omni_tts import EngineError


def _readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## Use it from Python", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the section holds one Python example"
    return blocks[0]


def test_the_public_names_import_from_the_package_and_the_engine_only_when_asked():
    """`import omni_tts` does not pull in torch; naming `Engine` does (a fresh interpreter for each)."""
    code = ("import sys, omni_tts; assert 'torch' not in sys.modules, 'torch at import'; "
            "from omni_tts import (Engine, SynthesisParams, CompileMode, load_preset, OmniTTSError, InputError, "
            "EngineError, Cancelled, CheckpointError, EngineSnapshot, MODES, Overloaded, DeadlineExceeded); "
            "assert Engine.__module__ == 'omni_tts.engine.engine' and 'torch' in sys.modules; "
            "assert issubclass(Cancelled, EngineError) and issubclass(InputError, OmniTTSError); "
            "assert issubclass(Overloaded, EngineError) and issubclass(DeadlineExceeded, EngineError); "
            "assert set(MODES) == set(CompileMode); "
            "assert set(dir(omni_tts)) == set(omni_tts.__all__) | {'__version__'}; "
            "print(sorted(omni_tts.__all__))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    for name in ("Engine", "SynthesisParams", "CompileMode", "load_preset", "EngineSnapshot"):
        assert f"'{name}'" in out.stdout


def test_the_readme_example_runs_and_streams_the_whole_clip(monkeypatch):
    monkeypatch.chdir(REPO)  # the example names the fixture by a path relative to the repository
    printed = io.StringIO()
    scope: dict = {}
    with contextlib.redirect_stdout(printed):
        exec(compile(_readme_example(), "README.md", "exec"), scope)  # noqa: S102
    lines = printed.getvalue().splitlines()
    chunks = [line for line in lines if line.startswith("chunk ")]
    assert chunks and lines[-1].startswith("done "), lines
    result = scope["result"]
    # the streamed chunks add up to the finished clip; the engine that made it, out of its with block, serves no more
    assert sum(int(line.split()[2]) for line in chunks) == result.wav.size > 0
    with pytest.raises(EngineError, match="shut down"):
        scope["engine"].submit(scope["SynthesisParams"](text="After the end."))
