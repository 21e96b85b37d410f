"""Step implementations per compile mode: builds what runs each part of a frame, as `MODES` says.

A mode changes only the CodePredictor. The talker (decode step and prefill) runs the same way in
every mode: on CUDA as TALKER_MODE's compiled units with the hand-written Triton kernels where
enabled, captured as CUDA graphs by the runner, as vLLM runs its model; on CPU, or with
`enforce_eager`, as the reference modules. `MODES` (omni_tts.config) says what each mode runs;
`StepImpls` builds the shared implementations once per engine and answers, per mode, which one
serves the CodePredictor and whether the runner captures it as graphs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from omni_tts.config import MODES, TALKER_MODE, CompileMode, EngineConfig, ModeSpec
from omni_tts.engine import compile_cache
from omni_tts.models.compiled import kernel_choice
from omni_tts.models.compiled.fast_path import FastPath


class StepImpls:
    """The talker's implementation and one CodePredictor implementation per Inductor mode, shared by
    every mode's runner (the compiled units and their packed weights are built once)."""

    def __init__(self, model: Any, config: EngineConfig) -> None:
        self.model, self.config = model, config
        self.cuda = model.device.type == "cuda"
        self.eager_only = config.enforce_eager
        self._fast: dict[str, FastPath] = {}
        self._lock = threading.Lock()
        self.kernel_notice = ""
        # the talker: compiled + graphed on CUDA, the reference modules elsewhere
        self.talker_graphs = self.cuda and not self.eager_only

    @property
    def talker(self) -> FastPath | None:
        """The talker's implementation (built on first use: it imports Dynamo and Inductor)."""
        return self._fast_path(MODES[TALKER_MODE]) if self.talker_graphs else None

    def unavailable(self, mode: CompileMode) -> str | None:
        """None when `mode` can run here, else why not."""
        if self.eager_only and mode.compiled:
            return "this engine runs all-eager (enforce_eager)"
        if MODES[mode].needs_cuda and not self.cuda:
            return "needs a CUDA GPU (CUDA graphs); this engine runs on CPU"
        return None

    def predictor(self, mode: CompileMode) -> FastPath | None:
        """The compiled path that serves the CodePredictor in `mode` (None: the reference modules)."""
        spec = MODES[mode]
        return None if spec.inductor is None else self._fast_path(spec)

    def predict_fn(self, mode: CompileMode) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        """The CodePredictor's frame function in `mode` (CodePredictor.predict_frame's contract)."""
        fast = self.predictor(mode)
        if fast is None:
            return self.model.code_predictor.predict_frame
        return fast.whole_frame if self.whole_frame(mode) else fast.predict_frame

    def whole_frame(self, mode: CompileMode) -> bool:
        """Whether `mode`'s CodePredictor runs as one compiled frame (reduce-overhead's)."""
        return MODES[mode].whole_frame

    def compiles(self, mode: CompileMode) -> bool:
        """Whether warming `mode` runs torch.compile: its talker (on CUDA) or its CodePredictor."""
        return self.talker_graphs or MODES[mode].inductor is not None

    def graphs(self, mode: CompileMode) -> bool:
        """Whether the runner captures the talker (always, on CUDA) and the CodePredictor (per mode)."""
        return self.cuda and not self.eager_only and MODES[mode].graphs

    def configure_kernels(self, batches: list[int], dtype: torch.dtype,
                          between: Callable[[], None] = lambda: None) -> str:
        """Probe and switch on the Triton kernels (`experimental.kernels`) for the talker (every mode) and
        default's and default+cudagraph's CodePredictor; reduce-overhead's whole-frame compile keeps
        Inductor's (ours are launched from Python, outside a traced function). `between`: called
        between two groups of probes.
        -> '' or a notice of what was turned off and why."""
        fast = self.talker
        if fast is None:
            return ""
        if self.config.kernel_configs:
            from omni_tts.kernels import configs

            configs.load_configs(self.config.kernel_configs)
        on = self.cuda and self.config.experimental.kernels
        # a probe's outcome is kept per machine and per the inputs that decide it
        key = compile_cache.probe_key(batches=batches, dtype=dtype, on=on, configs=self.config.kernel_configs,
                                      rows=kernel_choice.limits())
        kept = compile_cache.load_probe(key)
        if kept is not None and set(kept) == {*fast.CHOICE, "notice"}:
            for name in fast.CHOICE:  # the kernels build at their first launch (Triton's cache) instead
                setattr(fast, name, kept[name])
            self.kernel_notice = kept["notice"]
            return self.kernel_notice
        self.kernel_notice = fast.use_kernels(on, batches, [], dtype, between)
        compile_cache.save_probe(key, {**{n: getattr(fast, n) for n in fast.CHOICE}, "notice": self.kernel_notice})
        return self.kernel_notice

    def kernels_report(self, mode: CompileMode) -> str:
        """What runs the CodePredictor's layers in `mode` (never builds anything: the UI asks any time)."""
        inductor = MODES[mode].inductor
        if inductor is None:
            return "reference modules"
        fast = self._fast.get(inductor)
        if self.whole_frame(mode):
            why = self.inlined_why(mode)
            return "Inductor kernels (the whole frame in one compile" + (f"; layers inlined: {why})" if why else ")")
        return fast.kernels_report() if fast is not None else "not built yet (the mode is warming)"

    def inlined_why(self, mode: CompileMode) -> str:
        """Why `mode`'s whole-frame compile inlined every layer instead of reusing its regions ('' if it did not)."""
        if not self.whole_frame(mode):
            return ""
        fast = self._fast.get(MODES[mode].inductor)
        return fast.region_error if fast is not None else ""

    def compile_settings(self) -> None:
        """Dynamo's settings for the calling thread (its config is per thread): call it in every thread
        that compiles or runs the compiled units."""
        import torch._dynamo

        # per bucket: 2 layer units (+1 for the predictor's 2-token start) and 2 sampling units x 2 variants;
        # the whole-frame function: one static and one dynamic batch shape x 2 variants, per Inductor mode
        torch._dynamo.config.recompile_limit = max(64, 6 * len(self.config.resolved_buckets()) + 8)

    def _fast_path(self, spec: ModeSpec) -> FastPath:
        inductor = spec.inductor
        with self._lock:  # one FastPath per Inductor mode, whichever scheduler thread asks first
            if inductor not in self._fast:
                # Inductor's and Triton's caches persist across restarts (and shipped artifacts load first)
                compile_cache.prepare()
                self.compile_settings()
                self._fast[inductor] = FastPath(self.model, spec)
            return self._fast[inductor]
