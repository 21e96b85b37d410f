"""What an engine takes from its process: CPU threads, heap that stays flat under varied load, a clean exit."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _fixtures import REPO, fixture_dir
from test_warmup import until

from omni_tts.config import EngineConfig, SynthesisParams
from omni_tts.engine.engine import Engine
from omni_tts.engine.heap import HEAP_TRIM_INTERVAL_S
from omni_tts.engine.metrics import recording_phases


def _rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_a_cpu_engine_leaves_cores_to_its_own_threads() -> None:
    saved = torch.get_num_threads()
    torch.set_num_threads(max(2, os.cpu_count() or 2))  # torch's default: every core
    try:
        engine = Engine.from_config(EngineConfig(model=str(fixture_dir("custom_voice")), device="cpu"))
        engine.shutdown()
        assert torch.get_num_threads() <= max(1, (os.cpu_count() or 2) // 2)
    finally:
        torch.set_num_threads(saved)


def test_leaving_the_interpreter_with_a_live_engine_is_clean() -> None:
    code = ("from omni_tts.config import EngineConfig, SynthesisParams\n"
            "from omni_tts.engine.engine import Engine\n"
            f"e = Engine.from_config(EngineConfig(model={str(fixture_dir('custom_voice'))!r}, device='cpu'))\n"
            "e.submit(SynthesisParams(text='Still going when we leave.', speaker='ryan', max_new_tokens=40))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "terminate called" not in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads RSS from /proc")
def test_memory_stays_flat_over_bursts_of_varied_requests() -> None:
    # max_waiting 0: each burst of 25 overfills 8 slots and 16 waiting places on purpose (memory, not backpressure)
    engine = Engine.from_config(EngineConfig(model=str(fixture_dir("custom_voice")), device="cpu", max_num_seqs=8,
                                             max_waiting=0))
    rng = random.Random(0)

    def bursts(n: int) -> None:
        for _ in range(n):
            handles = [engine.submit(SynthesisParams(text="Words to say. " * rng.randint(1, 8), speaker="ryan",
                                                     max_new_tokens=rng.randint(2, 6), seed=i))
                       for i in range(25)]
            for h in handles:
                h.result(120)

    def trimmed() -> None:
        """Wait for a whole heap trim of the engine's to run after the last burst ended."""
        first = engine.stats.heap_trims
        until(lambda: engine.stats.heap_trims >= first + 2, "a heap trim", timeout=10 * HEAP_TRIM_INTERVAL_S)

    try:
        bursts(4)  # warm-up
        trimmed()
        before = _rss_mb()
        bursts(12)
        with recording_phases() as log:
            trimmed()
        grown = _rss_mb() - before
    finally:
        engine.shutdown()
    assert grown < 40, f"RSS grew {grown:.1f} MB over 300 requests"
    assert "heap trim" in {p[2] for p in log}  # a busy profile can tell a trim's gaps from the rest


def test_compile_settings_reach_the_threads_that_compile() -> None:
    """Dynamo's config is per thread: the limit on recompiles (one compile per bucket shape and variant)
    must be set in the warm-up and scheduler threads, not only where the engine was built."""
    import threading

    import torch._dynamo

    from omni_tts.engine.step_impl import StepImpls
    from omni_tts.models.loading import load_model

    cfg = EngineConfig(model=str(fixture_dir("custom_voice")), device="cpu", max_num_seqs=64)
    impls = StepImpls(load_model(cfg), cfg)
    seen: list[int] = []

    def worker() -> None:
        seen.append(torch._dynamo.config.recompile_limit)  # a new thread starts from the default
        impls.compile_settings()
        seen.append(torch._dynamo.config.recompile_limit)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen[1] >= 6 * len(cfg.resolved_buckets()) + 8 > seen[0]
