"""The engine's one seam for measurement tools and tests: what they may reach below the public API.

Owns: building the parts an engine is made of without an engine (`mode_runner`: one mode's runner
over shared step implementations, as the engine builds them; `warmed_runner`: the same, warmed, over
a model loaded from a config), a runner's step callables as `launch` runs them (`step_fns`: graph
replays where captured) or launched kernel by kernel (`launched_step_fns`), and what runs its
CodePredictor's layers (`layer_kernels`); and the pieces tools measure or drive on their own: the
audio stage's codec set-up (`fuse_codec`, `FirstChunkGraphs`), the figures of a list of finished
requests (`summarize`) and of device memory (`gpu_memory`), rows moved to a talker position for a block
(`rows_at`: a step of rows that long), the engine's host work by phase (`recording_phases`; a garbage
collection's named from `GC_PHASE`), the compile caches (`compile_cache`) and the plain single-request path
(`offline`). Kernel sweeps use omni_tts.kernels'
public names directly. Requests, scheduling and streaming stay behind `omni_tts.Engine`. Knows nothing about the tools.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from omni_tts.config import CompileMode, EngineConfig
from omni_tts.engine import compile_cache, offline
from omni_tts.engine.audio_stage import fuse_codec
from omni_tts.engine.codec_graphs import FirstChunkGraphs
from omni_tts.engine.metrics import GC_PHASE, gpu_memory, recording_phases, summarize
from omni_tts.engine.model_runner import Runner
from omni_tts.engine.step_impl import StepImpls
from omni_tts.models.loading import load_model

__all__ = ["GC_PHASE", "FirstChunkGraphs", "StepImpls", "compile_cache", "fuse_codec", "gpu_memory",
           "launched_step_fns", "layer_kernels", "load_model", "mode_runner", "offline", "recording_phases",
           "rows_at", "step_fns", "summarize", "warmed_runner"]


def mode_runner(model: Any, config: EngineConfig, mode: CompileMode, impls: StepImpls | None = None) -> Runner:
    """An unwarmed runner of `mode` over `model`; pass one StepImpls to share compiled units between modes,
    as an engine does (`StepImpls(model, config)`)."""
    return Runner(model, config, mode, impls)


def warmed_runner(config: EngineConfig, mode: CompileMode | None = None) -> Runner:
    """A warmed runner of `mode` (default: the config's) over the model `config` loads."""
    model = load_model(config)
    runner = Runner(model, config, mode or config.default_mode(model.device.type == "cuda"))
    runner.impls.compile_settings()
    runner.warm()
    return runner


def step_fns(runner: Runner, n: int, kv_len: int | None = None, sort: bool | None = None
             ) -> tuple[Callable[[], tuple], Callable[[], tuple]]:
    """(code predictor step, talker step) for rows [:n] as `Runner.launch` runs them (graph replays
    where captured), the talker's attention over kv_len positions (default: what the rows need)."""
    return runner.step_fns(n, kv_len, sort)


def launched_step_fns(runner: Runner, b: int) -> tuple[Callable[[], tuple], Callable[[], tuple]]:
    """`step_fns(runner, b)`'s callables called directly at size b, launched kernel by kernel (profiling)."""
    sort = runner.variant(b)  # this seam may reach the runner's step bodies: it is the engine's own module
    return (runner._make_cp_fn(sort)(b),
            runner._make_talker_fn(runner.kv_len(b), sort, runner._talker_now())(b))


@contextlib.contextmanager
def rows_at(runner: Runner, n: int, pos: int) -> Iterator[None]:
    """Rows [:n] at talker position `pos` for the block, as rows that long would be (the cache past their
    prompts holds whatever is there: timings, not outputs), their positions restored after."""
    saved = runner.pos[:n].clone(), runner.pos_host[:n].copy()
    runner.pos[:n], runner.pos_host[:n] = pos, pos
    try:
        yield
    finally:
        runner.pos[:n], runner.pos_host[:n] = saved


def layer_kernels(runner: Runner) -> str:
    """What runs the CodePredictor's layers in the runner's mode (as the engine panel says it)."""
    return runner.impls.kernels_report(runner.mode)
