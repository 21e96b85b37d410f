"""The batched model runner: device-side slot state, prefill, and the one definition of a frame.

Owns: the static per-slot buffers (talker KV cache, next input embedding, positions, frame counters,
trailing text, sampling settings, seeds, repetition "seen" sets), the two step functions of a frame
(CodePredictor + feedback embedding; talker decode + code-0 sampling) in two sampling variants
(top-64 selection, or a full sort when some row's settings need it), launching a frame without
waiting for it (`launch`; `collect_codes` reads a frame's codes once its CodePredictor half is done,
`collect_eos` the rest; two pinned result buffers of each), and slot moves (active requests
occupy slots 0..n-1, so a batch of n reads rows [:n] of every buffer without a gather). A runner
serves one compile mode; `StepImpls` says what runs each step in it, `warm` (runner_warmup) compiles and
captures.
Does not own requests, streaming or timing (scheduler.py), nor graph capture mechanics (cuda_graphs.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from omni_tts.config import CompileMode, EngineConfig, SynthesisParams
from omni_tts.engine.cuda_graphs import BucketedGraph, GraphPool, pick_bucket
from omni_tts.engine.runner_warmup import RunnerWarmUp
from omni_tts.engine.step_impl import StepImpls
from omni_tts.errors import InputError
from omni_tts.models import sampling, transfer
from omni_tts.models.compiled.fast_path import FastPath
from omni_tts.models.qwen3_tts import Prepared, TTSModel


class Runner(RunnerWarmUp):
    """Static slot state + step functions for up to `max_num_seqs` concurrent requests."""

    def __init__(self, model: TTSModel, config: EngineConfig, mode: CompileMode, impls: StepImpls | None = None,
                 pool: GraphPool | None = None) -> None:
        self.model, self.config, self.mode = model, config, mode
        self.device, self.dtype = model.device, model.dtype
        self.impls = impls or StepImpls(model, config)
        why = self.impls.unavailable(mode)
        if why:
            raise InputError(f"mode {mode.value} is not available: {why}")
        self.S = config.max_num_seqs
        self.buckets = config.resolved_buckets()
        self.cp_buckets = config.resolved_predictor_buckets()
        self.max_len = config.max_seq_len
        self.scratch_pos = self.max_len  # one spare KV column: padded rows and captures write here
        self._alloc_state()
        self.pool = pool
        self.graphs: list[BucketedGraph] = []  # all of them (pool accounting)
        # graphs per sampling variant (`sort`: True = full-sort warp, any settings; False = top-k selection)
        self.cp_graphs: dict[bool, BucketedGraph] = {}
        self.talker_graphs: dict[tuple[int, bool], BucketedGraph] = {}  # (kv_len, sort) -> talker graphs
        self.prefill_graphs: dict[int, BucketedGraph] = {}  # prompts per call -> graphs per length bucket
        self.pool_bytes_ = 0
        self.last_report: dict[str, Any] = {}
        # a talker step whose graph is not captured yet runs the reference modules (eager serves from the start)
        self.reference_talker = self.serves_while_warming
        self.cp_pending: set[bool] = set()  # variants whose CodePredictor is not warm yet: the reference runs them
        self.first_steps: int | None = None  # warm steps before the mode serves (None: all of them)
        self._warm_seconds: dict[str, float] = {}  # seconds per kind of warm step

    # ------------------------------------------------------------------ state
    def _alloc_state(self) -> None:
        m, S, dev = self.model, self.S, self.device
        D = m.hidden_size
        # one spare slot (index S): graph warm-up/capture of the prefill writes there, never into a live slot
        self.cache = m.talker.new_cache(S + 1, self.max_len + 1, device=dev, dtype=self.dtype)
        # prefill: up to P prompts at once (one weight pass for all), each right-padded to a length bucket
        P = min(8, S)
        self.prefill_batches = [b for b in (1, 2, 4, 8) if b < P] + [P]
        self.pre_x = torch.zeros(P, self.max_len, D, dtype=self.dtype, device=dev)  # prompts, right-padded
        self.pre_pos = torch.arange(self.max_len, device=dev)
        # per prompt, one host copy each per call (the graphs read them): slot (padded rows: the spare one),
        # index of the last token, top_k, seed, allow_eos; then greedy, temperature, top_p, penalty
        self.pre_i = torch.zeros(5, P, dtype=torch.long, device=dev)
        self.pre_f = torch.ones(4, P, device=dev)
        self.pre_slot, self.pre_last = self.pre_i[0], self.pre_i[1]
        self.pre_slot.fill_(S)
        self.pre_seen = torch.zeros(P, m.vocab_size, dtype=torch.bool, device=dev)  # a new prompt has seen nothing
        self.pre_frame = torch.zeros(P, dtype=torch.long, device=dev)
        self.prefill_buckets = [L for L in (16, 32, 64, 128, 256, 512) if L <= self.max_len]
        f = dict(device=dev)
        self.x = torch.zeros(S, D, dtype=self.dtype, **f)  # next talker input embedding per slot
        self.h = torch.zeros(S, D, dtype=self.dtype, **f)  # talker hidden of the last position
        self.code0 = torch.zeros(S, dtype=torch.long, **f)  # sampled code 0 of the current frame
        self.pos = torch.full((S,), self.scratch_pos, dtype=torch.long, **f)  # next talker position
        self.pos_host = np.full(S, self.scratch_pos, dtype=np.int64)  # its host mirror (picks kv_len)
        # talker attention reads only the first L cache positions, L the smallest of these >= every
        # active row's position + 1 (one talker graph per L and batch bucket; M = whole cache)
        self.kv_buckets = [L for L in (64, 128, 256, 512, 1024, 2048, 4096) if L < self.max_len] + [self.max_len + 1]
        self.frame = torch.zeros(S, dtype=torch.long, **f)  # frames completed so far
        self.trail = torch.zeros(S, self.max_len, D, dtype=self.dtype, **f)  # trailing text, then pad
        self.seen = torch.zeros(S, m.vocab_size, dtype=torch.bool, **f)  # code-0 ids generated
        self.talker_sp = sampling.SlotParams.zeros(S, device=dev)
        self.cp_sp = sampling.SlotParams.zeros(S, device=dev)
        self.seed = torch.zeros(S, dtype=torch.long, **f)
        # per slot: its settings need the full-sort warp (sampling.fits_topk is False for a stage); a step
        # runs the top-k-selection variant when no active row does
        self.needs_sort = np.zeros(S, dtype=bool)
        self.allow_eos = torch.ones(S, dtype=torch.bool, **f)  # False: fixed-frames benchmark rows
        self.codes = torch.zeros(S, 16, dtype=torch.long, **f)
        # step results come back through these pinned buffers (transfer.to_host_async + an event wait), never
        # a pageable .cpu(): that waits inside the driver and stalls the code-to-wave thread's kernel
        # launches. Two of each, used in turn:
        # the engine launches step t+1 before it reads step t's results (one frame of lookahead).
        pin = dev.type == "cuda"
        self._host_codes = [torch.zeros(S, 16, dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self._host_code0 = [torch.zeros(S, dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self._turn = 0
        # a frame's codes are copied out on this stream as soon as the CodePredictor made them, so the
        # audio can start while the talker half of the frame still runs
        self._copies = torch.cuda.Stream(dev, priority=-1) if pin else None

    def pool_bytes(self) -> int:
        return self.pool_bytes_

    # the step implementations, resolved on first use (in the thread that warms this mode): building the
    # compiled path imports Dynamo and Inductor, which the page need not wait for
    @functools.cached_property
    def talker_impl(self) -> FastPath | None:
        return self.impls.talker  # the same in every mode

    @functools.cached_property
    def cp_impl(self) -> FastPath | None:
        return self.impls.predictor(self.mode)

    @functools.cached_property
    def cp_predict(self) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        return self.impls.predict_fn(self.mode)

    @property
    def serves_while_warming(self) -> bool:
        """Whether requests can run before the warm-up ends: eager's CodePredictor needs none, and its
        talker runs as the reference modules until the talker's graphs (if any) are captured."""
        return self.mode.spec.serves_while_warming

    def _talker_now(self) -> FastPath | None:
        """The talker implementation requests run on now (never built while the reference one serves)."""
        return None if self.reference_talker else self.talker_impl

    # ------------------------------------------------------------------ step functions
    @staticmethod
    def _cap(sort: bool, impl: FastPath | None) -> int:
        """The SlotParams.topk_cap hint of a variant (the reference modules always run the full sort)."""
        return 0 if sort or impl is None else sampling.TOPK_CAP

    def _cp_body(self, b: int, sort: bool = True, reference: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Code predictor for the current frame of rows [:b] (on the reference modules if `reference`), then the
        next talker input."""
        impl, predict = self.cp_impl, self.cp_predict
        if reference:
            impl, predict = None, self.model.code_predictor.predict_frame
        sp = self.cp_sp.rows(b, self._cap(sort, impl))
        rest, fb = predict(self.h[:b], self.code0[:b], sp, self.seed[:b], self.frame[:b])  # [b, 15], [b, D]
        codes = torch.cat([self.code0[:b, None], rest], dim=1)  # codes: [b, 16]
        idx = torch.clamp(self.frame[:b], max=self.max_len - 1)  # trailing text index per row
        trail = self.trail[:b].gather(1, idx[:, None, None].expand(-1, 1, self.trail.shape[-1]))[:, 0]
        return codes, fb + trail  # next input: [b, D]

    def _talker_body(self, b: int, x: torch.Tensor, kv_len: int | None, sort: bool, impl: FastPath | None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """One talker decode step for rows [:b] from input x [b, D] on `impl` (None: the reference modules;
        attention over the first kv_len cache positions, fast path only), then sampling of code 0."""
        m = self.model
        if impl:
            h = impl.talker_step(x, self.pos[:b], self.cache, b, kv_len)  # h: [b, D]
            sample = impl.sample_talker
        else:
            h = m.talker(x[:, None, :], self.pos[:b, None], self.cache, None)[:, 0]  # h: [b, D]
            sample = sampling.sample_talker
        code0 = sample(m.talker.logits(h), self.talker_sp.rows(b, self._cap(sort, impl)), self.seen[:b],
                       self.frame[:b], self.allow_eos[:b], self.seed[:b], m.sampling_constants)  # code0: [b]
        return h, code0

    def _prefill_body(self, nb: int, L: int, impl: FastPath | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Talker over pre_x[:nb, :L] (prompts right-padded to L) into slots pre_slot[:nb], on `impl`'s prefill
        unit (None: the reference modules), then each prompt's first code 0 (full-sort variant: any
        settings) -> (hidden of each prompt's last token [nb, D], code 0 [nb]). Padded positions after a
        prompt write KV that the decode steps overwrite before reading; causal attention keeps them out of
        the prompt's own rows."""
        m = self.model
        if impl is not None:
            h = impl.talker_prefill(self.pre_x[:nb, :L], self.cache, self.pre_slot[:nb])  # [nb, L, D]
        else:
            pos = self.pre_pos[None, :L].expand(nb, L)  # [nb, L]
            h = m.talker(self.pre_x[:nb, :L], pos, self.cache, self.pre_slot[:nb], kv_len=L)  # [nb, L, D]
        h = h[torch.arange(nb, device=h.device), self.pre_last[:nb]]  # [nb, D]
        i = self.pre_i[:, :nb]
        sample = impl.sample_talker if impl is not None else sampling.sample_talker
        code0 = sample(m.talker.logits(h), self._prefill_params(nb), self.pre_seen[:nb], self.pre_frame[:nb],
                       i[4] > 0, i[3], m.sampling_constants)  # [nb]
        return h, code0

    def _prefill_params(self, n: int) -> sampling.SlotParams:
        """The talker's sampling settings of prompts [:n] of a prefill call, as pre_i / pre_f hold them."""
        i, f = self.pre_i[:, :n], self.pre_f[:, :n]
        return sampling.SlotParams(f[0] > 0, f[1], i[2], f[2], f[3])

    def _make_cp_fn(self, sort: bool = True, reference: bool = False) -> Callable[[int], Callable[[], tuple]]:
        return lambda b: (lambda: self._cp_body(b, sort, reference))

    def _make_talker_fn(self, kv_len: int | None = None, sort: bool = True, impl: FastPath | None = None
                        ) -> Callable[[int], Callable[[], tuple]]:
        return lambda b: (lambda: self._talker_body(b, self.x[:b], kv_len, sort, impl))

    def _make_prefill_fn(self, nb: int) -> Callable[[int], Callable[[], tuple]]:
        return lambda L: (lambda: self._prefill_body(nb, L, self.talker_impl))

    def variant(self, n: int) -> bool:
        """The sampling variant a step of rows [:n] runs: True (full sort) when any row's settings need it."""
        return bool(self.needs_sort[:n].any())

    def step_fns(self, n: int, kv_len: int | None = None, sort: bool | None = None
                 ) -> tuple[Callable[[], tuple], Callable[[], tuple]]:
        """(code predictor step, talker step) for rows [:n] as `launch` runs them (graph replays in
        default+cudagraph), attention over kv_len positions (default: what the rows need)."""
        L = kv_len or self.kv_len(n)
        sort = self.variant(n) if sort is None else sort
        talker = self._talker_now()
        ref_cp = sort in self.cp_pending
        return (lambda: self._run(None if ref_cp else self.cp_graphs.get(sort), self._make_cp_fn(sort, ref_cp), n,
                                  self.cp_impl is not None and not ref_cp, self.cp_buckets),
                lambda: self._run(self.talker_graphs.get((L, sort)), self._make_talker_fn(L, sort, talker), n,
                                  talker is not None, self.buckets))

    def kv_len(self, n: int) -> int:
        """The smallest kv bucket covering the positions of rows [:n] (the whole cache if none does)."""
        return pick_bucket(int(self.pos_host[:n].max()) + 1, self.kv_buckets) or self.kv_buckets[-1]

    # ------------------------------------------------------------------ requests
    def after_default_stream(self) -> None:
        """Make the current stream wait for the default stream (tensors other threads made there)."""
        if self.device.type == "cuda":
            current, default = torch.cuda.current_stream(self.device), torch.cuda.default_stream(self.device)
            if current != default:
                current.wait_stream(default)

    def prefill(self, slot: int, prep: Prepared | SynthesisParams) -> Prepared:
        """Write one request's prompt into `slot` and sample its first code 0."""
        if isinstance(prep, SynthesisParams):
            prep = self.model.prepare(prep, self.max_len)
        self.prefill_batch(slot, [prep])
        return prep

    def prefill_batch(self, first: int, items: list[Prepared]) -> None:
        """Prefill prepared requests into slots first, first+1, ... (up to P per talker pass) and sample
        each one's first code 0."""
        for c0 in range(0, len(items), len(self.pre_slot)):
            self._prefill_rows(first + c0, items[c0:c0 + len(self.pre_slot)])

    def _prefill_rows(self, first: int, items: list[Prepared]) -> None:
        """One talker pass over up to P prompts into slots first.., then their slots' settings."""
        k = len(items)
        T = [a.prefill.embeds.shape[0] for a in items]
        L = pick_bucket(max(T), self.prefill_buckets)
        nb = pick_bucket(k, self.prefill_batches)
        for i, a in enumerate(items):
            self.pre_x[i, :T[i]] = a.prefill.embeds
        self._put_prefill_inputs(first, items, T, nb)
        if nb in self.prefill_graphs and L is not None:
            h, code0 = self.prefill_graphs[nb].run(L)  # [nb, D], [nb]
        else:
            h, code0 = self._prefill_body(k, L or max(T))  # [k, D], [k]
        for i, a in enumerate(items):
            slot = first + i
            N = min(a.prefill.trailing.shape[0], self.max_len - 1)
            self.trail[slot, :N] = a.prefill.trailing[:N]
            self.trail[slot, N:] = a.prefill.pad
            fits = sampling.fits_topk(a.settings.talker) and sampling.fits_topk(a.settings.subtalker)
            self.needs_sort[slot] = not fits
        s = slice(first, first + k)
        self.talker_sp.assign(first, self._prefill_params(k))
        self.cp_sp.set_rows(first, [a.settings.subtalker for a in items])
        self.seed[s] = self.pre_i[3, :k]
        self.allow_eos[s] = self.pre_i[4, :k] > 0
        self.pos[s] = self.pre_i[1, :k] + 1
        self.pos_host[s] = T
        self.frame[s] = 0
        self.seen[s] = False
        self.code0[s] = code0[:k]
        sampling.mark_seen(self.seen[s], self.code0[s])
        self.h[s] = h[:k]

    def _put_prefill_inputs(self, first: int, items: list[Prepared], T: list[int], nb: int) -> None:
        """pre_i / pre_f [:, :nb] for prompts of lengths T into slots first..; rows past the prompts are
        padding (the spare slot, greedy)."""
        k, pad = len(items), [0] * (nb - len(items))
        greedy, temperature, top_k, top_p, penalty = sampling.SlotParams.columns([a.settings.talker for a in items])
        transfer.put(self.pre_i[:, :nb], [[first + i for i in range(k)] + [self.S] * (nb - k), [t - 1 for t in T] + pad,
                                           list(top_k) + pad, [a.settings.seed for a in items] + pad,
                                           [int(not a.settings.fixed) for a in items] + pad])  # [5, nb]
        transfer.put(self.pre_f[:, :nb], [[float(g) for g in greedy] + [1.0] * (nb - k)]
                     + [list(c) + [1.0] * (nb - k) for c in (temperature, top_p, penalty)])  # [4, nb]

    def step(self, n: int) -> tuple[Any, Any]:
        """One frame for rows [:n], waited for: `collect(launch(n))`."""
        return self.collect(self.launch(n))

    def launch(self, n: int) -> tuple[int, int, Any, Any]:
        """Queue one frame for rows [:n] on the device and the copies of its results to the host; returns a
        ticket for `collect_codes` and `collect_eos`. Nothing here waits for the device, so the caller can do host
        work (or launch the next frame: at most two tickets may be outstanding) while it runs."""
        cp_step, talker_step = self.step_fns(n)
        codes, nxt = cp_step()  # codes: [n, 16], nxt: [n, D]
        self._after_copies()
        self.codes[:n] = codes
        k = self._turn
        self._turn ^= 1
        codes_out = self._copy_out(self.codes[:n], self._host_codes[k][:n])
        self.x[:n] = nxt
        self.frame[:n] += 1
        h, code0 = talker_step()  # h: [n, D], code0: [n]
        self.h[:n] = h
        self.code0[:n] = code0
        self.pos[:n] += 1
        self.pos_host[:n] += 1
        sampling.mark_seen(self.seen[:n], code0)
        return k, n, codes_out, transfer.to_host_async(self.code0[:n], self._host_code0[k][:n])

    def collect_codes(self, ticket: tuple[int, int, Any, Any]) -> Any:
        """Wait for a launched frame's codes (the CodePredictor's half of it): [n, 16] int64 numpy."""
        k, n, done, _ = ticket
        if done is not None:
            done.synchronize()
        return self._host_codes[k][:n].numpy().copy()

    def collect_eos(self, ticket: tuple[int, int, Any, Any]) -> Any:
        """Wait for the rest of a launched frame: [n] bool numpy, the next frame's code 0 is EOS."""
        k, n, _, done = ticket
        if done is not None:
            done.synchronize()
        return self._host_code0[k][:n].numpy() == self.model.eos_id

    def collect(self, ticket: tuple[int, int, Any, Any]) -> tuple[Any, Any]:
        """Wait for a whole launched frame: (codes [n, 16] of the frame it completed, eos [n]) as numpy."""
        return self.collect_codes(ticket), self.collect_eos(ticket)

    def _copy_out(self, t: torch.Tensor, out: torch.Tensor) -> Any:
        """`transfer.to_host_async(t, out)` on the copy stream once the current stream has made t."""
        if self._copies is None:
            return transfer.to_host_async(t, out)
        self._copies.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._copies):
            return transfer.to_host_async(t, out)

    def _after_copies(self) -> None:
        """Make the current stream wait for the copies queued so far (before it writes what they read)."""
        if self._copies is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._copies)

    def _run(self, graph: BucketedGraph | None, make: Callable[[int], Callable[[], tuple]], n: int,
             compiled: bool, buckets: list[int]) -> tuple:
        """One step for rows [:n]: the captured graph of n's bucket, else the callable at the bucket size
        (compiled units: one shape per bucket) or at n (reference modules)."""
        b = pick_bucket(n, buckets)
        if graph is not None and b is not None:
            return graph.run(n)
        return tuple(t[:n] for t in make(b if (b and compiled) else n)())

    def move_slot(self, src: int, dst: int) -> None:
        """Move a request's whole state from slot src to slot dst (compaction after a finish)."""
        self._after_copies()
        self.cache.move(src, dst)
        for t in (self.x, self.h, self.code0, self.pos, self.frame, self.trail, self.seen, self.seed,
                  self.allow_eos, self.codes):
            t[dst] = t[src]
        self.needs_sort[dst] = self.needs_sort[src]
        self.talker_sp.move(src, dst)
        self.cp_sp.move(src, dst)
        self.pos[src] = self.scratch_pos
        self.pos_host[dst] = self.pos_host[src]
        self.pos_host[src] = self.scratch_pos

