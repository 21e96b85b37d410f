"""A runner's warm-up: what it compiles and captures, in which order, and from which step its mode serves.

`RunnerWarmUp` is the warm-up half of `model_runner.Runner` (which owns the slot state and step functions
it captures). On CUDA every mode captures the talker's decode graphs (per kv length and sampling variant)
and prefill graphs (per prompts per call), and default+cudagraph the CodePredictor's graphs; default and
reduce-overhead compile their CodePredictor per batch bucket instead. Each set is used from its capture on.
A mode serves once what top-k sampling runs is warm; the full-sort variant and the batched prefills follow
between requests, and a step that needs what is not warm yet runs the reference modules meanwhile.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from omni_tts.engine.cuda_graphs import BucketedGraph, GraphPool, graph_tree_pool_bytes
from omni_tts.models import sampling


class RunnerWarmUp:
    """Warm-up methods of `Runner` (its state is defined there)."""

    def warm(self, say: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Compile and capture what this mode runs: on CUDA the talker's decode and prefill graphs (every
        mode) and the CodePredictor's graphs (default+cudagraph); the compiled CodePredictor's shapes
        otherwise. Call once, before the first request."""
        t0 = time.perf_counter()
        for step in self.warm_steps(say):
            step()
        return self.warmed(time.perf_counter() - t0, say)

    def warm_steps(self, say: Callable[[str], None] | None = None) -> list[Callable[[], None]]:
        """`warm` as steps run in turn, each a whole capture set (or a CodePredictor compile), each used from
        its end on. The first `first_steps` warm what requests with top-k sampling run (on CUDA: their
        CodePredictor and talker graphs and the one-prompt prefill); the mode serves after them, and the
        rest (full-sort variants, batched prefill) run between requests. Meanwhile a step whose variant is
        not warm runs the reference modules. Eager serves from the start; a mode that records graph trees
        serves after every step. A capture syncs the device first, so no frame is in flight."""
        say = say or (lambda s: None)
        steps: list[tuple[bool, Callable[[], None]]] = []  # (before serving, step)
        self._warm_seconds = {}
        cp_graphed = self.impls.talker_graphs and self.impls.graphs(self.mode)
        if self.cp_impl is not None:
            self.cp_pending = {False, True}
        if self.impls.talker_graphs:
            self.pool = self.pool or GraphPool(self.config.experimental.use_vllm_pool)
            self.pool.begin_capture()
            self.reference_talker = True
            # before serving: the top-k variant (key: sort, or (kv_len, sort)) and the one-prompt prefill (key: nb)
            first = (lambda sort: not sort, lambda key: not key[1], lambda nb: nb == self.prefill_batches[0])
            for kind, live, planned, is_first in zip(("CodePredictor graphs", "talker graphs", "prefill graphs"),
                                                     (self.cp_graphs, self.talker_graphs, self.prefill_graphs),
                                                     self._plan_graphs(cp_graphed), first):
                steps += [(is_first(key), self._timed(kind, functools.partial(self._capture_one, g, live, key, say)))
                          for key, g in planned.items()]
        if self.cp_impl is not None and not cp_graphed:
            say(f"compiling the CodePredictor ({self.mode.value}) for buckets {self.cp_buckets}")
            steps += [(not v, self._timed("CodePredictor compile", functools.partial(self._compile_predictor, b, v)))
                      for v in (False, True) for b in self.cp_buckets]
        if self.cp_impl is not None and self.cp_impl.records_graph_trees:
            steps = [(True, step) for _, step in steps]  # no capture while it serves: it records graph trees
        steps.sort(key=lambda fs: not fs[0])  # stable: each kind keeps its order
        self.first_steps = sum(first for first, _ in steps)
        return [step for _, step in steps]

    def steps_before_serving(self, total: int) -> int:
        """How many of `total` warm steps run before the mode serves requests."""
        if self.serves_while_warming:
            return 0
        return total if self.first_steps is None else min(self.first_steps, total)

    def _timed(self, kind: str, step: Callable[[], None]) -> Callable[[], None]:
        """`step`, adding its seconds to its kind's (the ready line's breakdown: where a warm-up goes)."""
        def run() -> None:
            t0 = time.perf_counter()
            try:
                step()
            finally:
                self._warm_seconds[kind] = self._warm_seconds.get(kind, 0.0) + time.perf_counter() - t0
        return run

    def warmed(self, seconds: float, say: Callable[[str], None] | None = None) -> dict[str, Any]:
        """After every warm step: -> the warm-up report."""
        self.reference_talker = False
        self.cp_pending = set()
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in self._warm_seconds.items())
        say = say or (lambda s: None)
        say(f"{self.mode.value} ready in {seconds:.1f} s" + (f" ({parts})" if parts else ""))
        why = self.impls.inlined_why(self.mode)
        if why:  # a far slower compile than through the regions: worth an operator's attention
            say(f"{self.mode.value} compiled its frame with every layer inlined (its compile regions failed: {why})")
        trees = graph_tree_pool_bytes() if self.cp_impl is not None and self.cp_impl.records_graph_trees else 0
        self.last_report = {"mode": self.mode.value, "seconds": seconds, "pool_bytes": self.pool_bytes_,
                            "pool": self.pool.source if self.graphs else "", "tree_pool_bytes": trees,
                            "parts_s": dict(self._warm_seconds)}
        return dict(self.last_report)

    def _plan_graphs(self, cp_graphed: bool) -> tuple[dict, dict, dict]:
        """(CodePredictor graphs where the mode graphs it, talker graphs, prefill graphs), not yet captured;
        the talker's capture its compiled path, whatever serves requests meanwhile."""
        variants = (False, True)
        cp = ({v: BucketedGraph(f"code_predictor ({_VARIANT[v]})", self._make_cp_fn(v), self.cp_buckets,
                                 self.pool)
               for v in variants} if cp_graphed else {})
        talker = {(L, v): BucketedGraph(f"talker (kv {L}, {_VARIANT[v]})",
                                        self._make_talker_fn(L, v, self.talker_impl), self.buckets, self.pool)
                  for v in variants for L in self.kv_buckets}
        prefill = {nb: BucketedGraph(f"prefill x{nb}", self._make_prefill_fn(nb), self.prefill_buckets, self.pool)
                   for nb in self.prefill_batches}
        return cp, talker, prefill

    def _capture_one(self, g: BucketedGraph, live: dict, key: Any, say: Callable[[str], None]) -> None:
        """Capture one set of graphs; requests use it from now on."""
        say(f"capturing {g.name} graphs for buckets {g.buckets} into {self.pool.source}")
        self._park_prefill()  # before the capture stream waits for this one
        self.pool_bytes_ += g.capture().pool_bytes
        self.graphs.append(g)
        live[key] = g
        if live is self.cp_graphs:
            self.cp_pending.discard(key)

    def _park_prefill(self) -> None:
        """Prefill captures write the spare slot and read inside the smallest length bucket (a request
        admitted between two warm steps set these for its own rows)."""
        self.pre_slot.fill_(self.S)
        self.pre_last.zero_()

    def _compile_predictor(self, b: int, sort: bool) -> None:
        """One bucket shape and sampling variant now, not on the first request (a warm step each, so
        serving schedulers get their turns between them); Inductor's graph trees run a shape once to warm
        up, record it on the next call, replay it after that."""
        for _ in range(3 if self.cp_impl.records_graph_trees else 1):
            self._make_cp_fn(sort)(b)()
        if b == self.cp_buckets[-1]:  # every bucket of this variant is compiled (warm_steps' order)
            self.cp_pending.discard(sort)


_VARIANT = {True: "full sort", False: f"top-{sampling.TOPK_CAP} selection"}
