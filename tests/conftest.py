"""Shared test set-up: one intra-op thread per test module (tiny matrices run several times faster
on one thread than on contended OpenMP threads on a 2-core machine); without CUDA, Triton in its
interpreter (set before anything imports triton); the `gpu`, `browser` and `slow` markers (registered
in pyproject.toml) put on the tests they describe, and the `interpreter` tests skipped where Triton
compiles; the engine tests' `engine` fixture; under CI, a check that no test wrote a tracked file."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # omni_tts.kernels.layers' Triton kernels run in Triton's CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parent.parent
BROWSER_DIR = Path(__file__).resolve().parent / "browser"
NO_CUDA = not torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # on a CUDA machine only when asked for
_GPU_REASON = re.compile(r"\b(CUDA|GPU)\b", re.IGNORECASE)
_TRACKED = pytest.StashKey[dict]()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def engine(_one_thread):
    """An eager CPU engine on custom_voice (tests/_engine.py's make_engine: 3 slots, first chunk after 1
    frame then every 4), one per test module; a module may define its own `engine` instead."""
    from _engine import make_engine
    from _fixtures import fixture_dir

    eng = make_engine(fixture_dir("custom_voice"))
    yield eng
    eng.shutdown()


def _marks_for(item: pytest.Item) -> set[str]:
    """Markers implied by where a test lives and by its skip conditions, so `-m 'not gpu'` etc. select
    the right tests without every file repeating them."""
    names = set()
    if BROWSER_DIR in Path(str(item.path)).resolve().parents:
        names.add("browser")
    for m in item.iter_markers("skipif"):
        cond = m.args[0] if m.args else m.kwargs.get("condition")
        reason = str(m.kwargs.get("reason", ""))
        # a skip that fires exactly when CUDA is missing marks a GPU test (not "checks the refusal without CUDA")
        if isinstance(cond, bool) and _GPU_REASON.search(reason) and cond == NO_CUDA:
            names.add("gpu")
        if "OMNI_TTS_TEST_COMPILE" in reason:  # opt-in torch.compile on CPU: minutes
            names.add("slow")
    return names


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for name in sorted(_marks_for(item)):
            item.add_marker(name)
        if NO_CUDA and item.get_closest_marker("gpu") and not item.get_closest_marker("skipif"):
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))  # an explicit @pytest.mark.gpu
        if item.get_closest_marker("interpreter") and not item.get_closest_marker("gpu") and not INTERPRETED:
            item.add_marker(pytest.mark.skip(reason="CPU tensors for Triton's interpreter: TRITON_INTERPRET=1"))


def _tracked_files() -> dict[str, tuple[int, int] | None] | None:
    """{path: (mtime_ns, size)} of every file git tracks, or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    state: dict[str, tuple[int, int] | None] = {}
    for name in filter(None, out.decode("utf-8", "replace").split("\0")):
        try:
            st = (ROOT / name).stat()
            state[name] = (st.st_mtime_ns, st.st_size)
        except OSError:
            state[name] = None
    return state


def _ci() -> bool:
    # Only under CI: in a shared working copy other people's edits during a local run would count too.
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_sessionstart(session: pytest.Session) -> None:
    if _ci() and (state := _tracked_files()) is not None:
        session.config.stash[_TRACKED] = state


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A test that writes into the checkout (a screenshot, a cache, a result file) fails the run here."""
    before = session.config.stash.get(_TRACKED, None)
    after = _tracked_files() if before is not None else None
    if before is None or after is None:
        return
    changed = sorted(name for name, st in before.items() if after.get(name) != st)
    if changed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        msg = f"the test run changed {len(changed)} tracked file(s): {', '.join(changed[:20])}"
        if reporter is not None:
            reporter.write("\n")  # after the progress line
            reporter.write_sep("!", f"error: {msg}", red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
