"""The batched model runner: device-side slot state, prefill, the per-frame step, compile modes.

Owns: the static per-slot buffers (talker KV cache, next input embedding, positions, frame
counters, trailing text, sampling settings, seeds, repetition "seen" sets), the two step
functions of a frame (code predictor + feedback embedding; talker decode + code-0 sampling) in two
sampling variants (top-64 selection, or a full sort when some row's settings need it), how each runs
in the four CompileModes, launching a frame without waiting for it (`launch` / `collect`, two pinned
result buffers), and slot moves (active requests always occupy slots 0..n-1, so a batch of n reads
rows [:n] of every buffer without a gather).
Does not own requests, streaming or timing (engine.py), nor graph capture mechanics (graphs.py).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from omni_tts.models.voice_clone import decoder_prefix
from omni_tts.models.codec.decoder import to_host_async
from omni_tts.config import MODE_NOTES, CompileMode, EngineConfig, SynthesisParams
from omni_tts.errors import InputError, OmniTTSError
from omni_tts.engine.step_impl import FastPath, cpu_fallback_mode, kernel_tuning
from omni_tts.engine.cuda_graphs import BucketedGraph, GraphPool, ReplayStream, pick_bucket
from omni_tts.models.qwen3_tts import TTSModel
from omni_tts.models import sampling


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise OmniTTSError("device cuda requested but CUDA is not available here; use --device cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


class Runner:
    """Static slot state + step functions for up to `max_num_seqs` concurrent requests."""

    def __init__(self, model: TTSModel, config: EngineConfig, mode: CompileMode,
                 progress: Callable[[str], None] | None = None) -> None:
        self.model, self.config = model, config
        self.device, self.dtype = model.device, model.dtype
        model.set_codec_precision(config.codec_precision if config.codec_precision != "auto" else
                                  "tf32" if self.device.type == "cuda" else "float32")
        self.S = config.max_num_seqs
        self.buckets = config.resolved_buckets()
        self.max_len = config.max_seq_len
        self.scratch_pos = self.max_len  # one spare KV column: padded rows and captures write here
        self._alloc_state()
        self.pool: GraphPool | None = None
        self.graphs: list[BucketedGraph] = []  # all of them (release, pool accounting)
        # graphs per sampling variant (`sort`: True = full-sort warp, any settings; False = top-k selection)
        self.cp_graphs: dict[bool, BucketedGraph] = {}
        self.talker_graphs: dict[tuple[int, bool], BucketedGraph] = {}  # (kv_len, sort) -> talker graphs
        self.prefill_graphs: dict[int, BucketedGraph] = {}  # prompts per call -> graphs per length bucket
        self.pool_bytes_ = 0
        self.mode = CompileMode.EAGER
        self.fast: FastPath | None = None  # None: eager, the reference modules as they are
        self._fast_by_mode: dict[str, FastPath] = {}  # compiled units kept across mode switches
        self._stream = ReplayStream(self.device)  # step_stream
        self.set_mode(mode, progress=progress)

    @classmethod
    def from_config(cls, config: EngineConfig, progress: Callable[[str], None] | None = None) -> "Runner":
        from omni_tts.models.checkpoint import open_checkpoint

        config.validate()
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        if config.gpu_memory_limit_gb and device.type == "cuda":  # before anything is allocated
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, config.gpu_memory_limit_gb * (1 << 30) / total),
                                                       device)
        ckpt = open_checkpoint(config.model, progress=progress)
        model = TTSModel.from_checkpoint(ckpt, device=device, dtype=dtype)
        mode = config.mode
        if mode == "auto":
            mode = CompileMode.DEFAULT_CUDAGRAPH if device.type == "cuda" else CompileMode.EAGER
        return cls(model, config, CompileMode.parse(mode), progress=progress)

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
        self.pre_slot = torch.full((P,), S, dtype=torch.long, device=dev)  # padded rows write the spare slot
        self.pre_last = torch.zeros(P, dtype=torch.long, device=dev)  # index of each prompt's last token
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
        # step results come back through these pinned buffers (codec.to_host_async + an event wait), never
        # a pageable .cpu(): that waits inside the driver and stalled the code-to-wave thread's kernel
        # launches on the H200 (TTFP ~590 ms at concurrency 1, 2026-11-30). Two of them, used in turn:
        # the engine launches step t+1 before it reads step t's results (one frame of lookahead).
        self._host = [torch.zeros(S, 17, dtype=torch.long, pin_memory=dev.type == "cuda") for _ in range(2)]
        self._turn = 0

    def pool_bytes(self) -> int:
        return self.pool_bytes_

    # ------------------------------------------------------------------ step functions
    def _cap(self, sort: bool) -> int:
        """The SlotParams.topk_cap hint of a variant (eager mode always runs the reference full sort)."""
        return 0 if sort or not self.fast else sampling.TOPK_CAP

    def _cp_body(self, b: int, sort: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Code predictor for the current frame of rows [:b], then the next talker input."""
        predict = self.fast.predict_frame if self.fast else self.model.code_predictor.predict_frame
        rest, fb = predict(self.h[:b], self.code0[:b], self.cp_sp.rows(b, self._cap(sort)), self.seed[:b],
                           self.frame[:b])  # rest: [b, 15], fb: [b, D]
        codes = torch.cat([self.code0[:b, None], rest], dim=1)  # codes: [b, 16]
        idx = torch.clamp(self.frame[:b], max=self.max_len - 1)  # trailing text index per row
        trail = self.trail[:b].gather(1, idx[:, None, None].expand(-1, 1, self.trail.shape[-1]))[:, 0]
        return codes, fb + trail  # next input: [b, D]

    def _talker_body(self, b: int, x: torch.Tensor, kv_len: int | None = None, sort: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """One talker decode step for rows [:b] from input x [b, D] (attention over the first kv_len cache
        positions, fast path only), then sampling of code 0."""
        m = self.model
        if self.fast:
            h = self.fast.talker_step(x, self.pos[:b], self.cache, b, kv_len)  # h: [b, D]
            sample = self.fast.sample_talker
        else:
            h = m.talker(x[:, None, :], self.pos[:b, None], self.cache, None)[:, 0]  # h: [b, D]
            sample = sampling.sample_talker
        code0 = sample(m.talker.logits(h), self.talker_sp.rows(b, self._cap(sort)), self.seen[:b], self.frame[:b],
                       self.allow_eos[:b], self.seed[:b], m.sampling_constants)  # code0: [b]
        return h, code0

    def _prefill_body(self, nb: int, L: int) -> tuple[torch.Tensor]:
        """Talker over pre_x[:nb, :L] (prompts right-padded to L) into slots pre_slot[:nb]; -> hidden of each
        prompt's last token [nb, D]. Padded positions after a prompt write KV that the decode steps
        overwrite before reading; causal attention keeps them out of the prompt's own rows."""
        pos = self.pre_pos[None, :L].expand(nb, L)  # [nb, L]
        h = self.model.talker(self.pre_x[:nb, :L], pos, self.cache, self.pre_slot[:nb], kv_len=L)  # [nb, L, D]
        return (h[torch.arange(nb, device=h.device), self.pre_last[:nb]],)  # [nb, D]

    def _make_cp_fn(self, sort: bool = True) -> Callable[[int], Callable[[], tuple]]:
        return lambda b: (lambda: self._cp_body(b, sort))

    def _make_talker_fn(self, kv_len: int | None = None, sort: bool = True) -> Callable[[int], Callable[[], tuple]]:
        return lambda b: (lambda: self._talker_body(b, self.x[:b], kv_len, sort))

    def _make_prefill_fn(self, nb: int) -> Callable[[int], Callable[[], tuple]]:
        return lambda L: (lambda: self._prefill_body(nb, L))

    def variant(self, n: int) -> bool:
        """The sampling variant a step of rows [:n] runs: True (full sort) when any row's settings need it."""
        return bool(self.needs_sort[:n].any())

    def step_fns(self, n: int, kv_len: int | None = None, sort: bool | None = None
                 ) -> tuple[Callable[[], tuple], Callable[[], tuple]]:
        """(code predictor step, talker step) for rows [:n] as `launch` runs them (graph replays in
        default+cudagraph), attention over kv_len positions (default: what the rows need)."""
        L = kv_len or self.kv_len(n)
        sort = self.variant(n) if sort is None else sort
        return (lambda: self._run(self.cp_graphs.get(sort), self._make_cp_fn(sort), n),
                lambda: self._run(self.talker_graphs.get((L, sort)), self._make_talker_fn(L, sort), n))

    def kv_len(self, n: int) -> int:
        """The smallest kv bucket covering the positions of rows [:n] (the whole cache if none does)."""
        return pick_bucket(int(self.pos_host[:n].max()) + 1, self.kv_buckets) or self.kv_buckets[-1]

    # ------------------------------------------------------------------ modes
    def available_modes(self) -> dict[str, str | None]:
        """mode -> None when usable here, else why not. Usable is not the same as fast: 'reduce-overhead'
        on CUDA is available but is the comparison mode and slow (see `mode_notes`)."""
        out: dict[str, str | None] = {}
        for m in CompileMode:
            if m.needs_cuda and self.device.type != "cuda":
                out[m.value] = "needs a CUDA GPU (CUDA graphs); this engine runs on CPU"
            else:
                out[m.value] = None
        return out

    def mode_notes(self) -> dict[str, str]:
        """mode -> one line on what it runs and what it costs (for the UI / CLI beside `available_modes`)."""
        notes = dict(MODE_NOTES)
        if self.device.type != "cuda":
            fallback = cpu_fallback_mode()
            for m in CompileMode:
                if m.needs_cuda:
                    notes[m.value] += f"; needs CUDA: on {self.device.type} it runs {fallback.value} instead"
        return notes

    def set_mode(self, mode: CompileMode, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Release old graphs, take a fresh pool, compile and capture for `mode`. Between steps only."""
        say = progress or (lambda s: None)
        notice = ""
        if mode.needs_cuda and self.device.type != "cuda":
            fallback = cpu_fallback_mode()
            notice = f"{mode.value} needs CUDA; running {fallback.value} on {self.device.type} instead"
            say(notice)
            mode = fallback
        for g in self.graphs:
            g.release()
        self.graphs, self.cp_graphs, self.talker_graphs, self.prefill_graphs = [], {}, {}, {}
        self.pool_bytes_ = 0
        t0 = time.perf_counter()
        self.fast = self._fast_path(mode)
        on = mode is CompileMode.DEFAULT_CUDAGRAPH and self.device.type == "cuda"  # the graphed mode only
        kernel_notice = (self.fast.use_kernels(self.config, on, self.buckets, self.kv_buckets, self.dtype)
                         if self.fast else "")
        if kernel_notice:
            say(kernel_notice)
            notice = "; ".join(n for n in (notice, kernel_notice) if n)
        with kernel_tuning():
            self._build(mode, say)
        self.mode = mode
        seconds = time.perf_counter() - t0
        say(f"{mode.value} ready in {seconds:.1f} s")
        self.last_report = {"mode": mode.value, "seconds": seconds, "pool_bytes": self.pool_bytes_, "notice": notice,
                            "pool": self.pool.source if self.graphs else ""}
        return dict(self.last_report)

    def _build(self, mode: CompileMode, say: Callable[[str], None]) -> None:
        """Capture the graphs (default+cudagraph) or warm the compiled shapes (default, reduce-overhead)."""
        if mode is CompileMode.DEFAULT_CUDAGRAPH:
            self.pool = self.pool or GraphPool(self.config.use_vllm_pool)
            self.pool.begin_capture()
            self.pre_slot.fill_(self.S)  # capture warm-ups write the spare slot...
            self.pre_last.zero_()  # ...and read inside the smallest length bucket (stale indices asserted, H200)
            variants = (False, True)
            self.cp_graphs = {v: BucketedGraph(f"code_predictor ({_VARIANT[v]})", self._make_cp_fn(v), self.buckets,
                                               self.pool) for v in variants}
            self.talker_graphs = {(L, v): BucketedGraph(f"talker (kv {L}, {_VARIANT[v]})", self._make_talker_fn(L, v),
                                                        self.buckets, self.pool)
                                  for v in variants for L in self.kv_buckets}
            self.prefill_graphs = {nb: BucketedGraph(f"prefill x{nb}", self._make_prefill_fn(nb), self.prefill_buckets,
                                                     self.pool) for nb in self.prefill_batches}
            self.graphs = [*self.cp_graphs.values(), *self.talker_graphs.values(), *self.prefill_graphs.values()]
            for g in self.graphs:
                say(f"capturing {g.name} graphs for buckets {g.buckets} into {self.pool.source}")
                self.pool_bytes_ += g.capture().pool_bytes
        elif mode.compiled:
            say(f"compiling ({mode.value}) for buckets {self.buckets}")
            for b in self.buckets:  # warm every bucket shape and sampling variant now, not on the first request
                for v in (False, True):
                    self._make_cp_fn(v)(b)()
                    self._make_talker_fn(self.kv_buckets[0], v)(b)()

    def _fast_path(self, mode: CompileMode) -> FastPath | None:
        if mode is CompileMode.EAGER:
            return None
        import torch._dynamo

        # per bucket: 2 layer units (+1 for the predictor's 2-token start) and 2 sampling units x 2 variants
        torch._dynamo.config.recompile_limit = max(64, 6 * len(self.buckets) + 8)
        inductor_mode = "reduce-overhead" if mode is CompileMode.REDUCE_OVERHEAD else "default"
        if inductor_mode not in self._fast_by_mode:
            self._fast_by_mode[inductor_mode] = FastPath(self.model, inductor_mode)
        return self._fast_by_mode[inductor_mode]

    def layer_kernels(self) -> str:
        """What runs the code predictor's and the talker's layers in this mode (for the engine panel)."""
        return "reference modules" if self.fast is None else self.fast.kernels_report()

    def step_stream(self) -> AbstractContextManager:
        """The scheduler thread's stream for one pass of its loop: in default+cudagraph with `priority_streams`
        (CUDA) a high-priority one, so the frame steps' graphs are scheduled ahead of the code-to-wave stage's
        queued kernels, which fill the gaps (H200: +4% audio/s at 32 requests); the other modes wait on the
        host, not the GPU, so they keep the default stream."""
        return self._stream.use(self.config.priority_streams and self.mode is CompileMode.DEFAULT_CUDAGRAPH)

    # ------------------------------------------------------------------ requests
    def prepare(self, params: SynthesisParams) -> Admission:
        """A request's prompt embeddings and settings, checked against this engine (InputError if not)."""
        self._stream.after_default()  # tensors made on other threads (a voice prompt's) come from the default stream
        m = self.model
        pre = m.build_prefill(params)  # embeds: [T, D], trailing: [N, D], pad: [D]
        T = pre.embeds.shape[0]
        settings = m.resolve_settings(params)
        max_frames = settings.max_frames
        if T + max_frames + 1 > self.max_len:
            if settings.fixed:  # a benchmark asking for exactly N frames must not silently get fewer
                raise InputError(f"fixed_frames {max_frames} does not fit this engine (prompt {T} tokens + "
                                 f"{max_frames} frames > max_seq_len {self.max_len}); lower it or raise max_seq_len")
            max_frames = self.max_len - T - 1
            if max_frames < 2:
                raise InputError(_too_long(T, self.max_len, decoder_prefix(params)))
        return Admission(pre, settings, max_frames)

    def prefill(self, slot: int, params: SynthesisParams) -> tuple[int, bool]:
        """Write a request's prompt into `slot` and sample its first code 0. Returns (max frames, fixed)."""
        a = self.prepare(params)
        self.prefill_batch(slot, [a])
        return a.max_frames, a.settings.fixed

    def prefill_batch(self, first: int, items: list[Admission]) -> None:
        """Prefill prepared requests into slots first, first+1, ... (up to P per talker pass) and sample
        each one's first code 0."""
        for c0 in range(0, len(items), len(self.pre_slot)):
            self._prefill_rows(first + c0, items[c0:c0 + len(self.pre_slot)])

    def _prefill_rows(self, first: int, items: list[Admission]) -> None:
        m, k = self.model, len(items)
        T = [a.pre.embeds.shape[0] for a in items]
        L = pick_bucket(max(T), self.prefill_buckets)
        nb = pick_bucket(k, self.prefill_batches)
        for i, a in enumerate(items):
            self.pre_x[i, :T[i]] = a.pre.embeds
        self.pre_slot[:nb] = torch.tensor([first + i for i in range(k)] + [self.S] * (nb - k))  # [nb]
        self.pre_last[:nb] = torch.tensor([t - 1 for t in T] + [0] * (nb - k))  # [nb]
        if self.graphs and L is not None:
            (h,) = self.prefill_graphs[nb].run(L)  # h: [nb, D]
            h = h[:k]
        else:
            (h,) = self._prefill_body(k, L or max(T))  # h: [k, D]
        for i, a in enumerate(items):
            slot = first + i
            N = min(a.pre.trailing.shape[0], self.max_len - 1)
            self.trail[slot, :N] = a.pre.trailing[:N]
            self.trail[slot, N:] = a.pre.pad
            self.talker_sp.set(slot, a.settings.talker)
            self.cp_sp.set(slot, a.settings.subtalker)
            self.seed[slot] = a.settings.seed
            self.allow_eos[slot] = not a.settings.fixed
            self.needs_sort[slot] = not (sampling.fits_topk(a.settings.talker) and sampling.fits_topk(a.settings.subtalker))
        s = slice(first, first + k)
        self.pos[s] = torch.tensor(T)
        self.pos_host[s] = T
        self.frame[s] = 0
        self.seen[s] = False
        sp = self.talker_sp.span(first, k)
        sp.all_greedy = all(a.settings.talker.is_greedy for a in items)
        self.code0[s] = sampling.sample_talker(m.talker.logits(h), sp, self.seen[s], self.frame[s],
                                               self.allow_eos[s], self.seed[s], m.sampling_constants)  # [k]
        sampling.mark_seen(self.seen[s], self.code0[s])
        self.h[s] = h

    def step(self, n: int) -> tuple[Any, Any]:
        """One frame for rows [:n], waited for: `collect(launch(n))`."""
        return self.collect(self.launch(n))

    def launch(self, n: int) -> tuple[int, int, Any]:
        """Queue one frame for rows [:n] on the device and the copy of its results to the host; returns a
        ticket for `collect`. Nothing here waits for the device, so the caller can do host work (or launch
        the next frame: at most two tickets may be outstanding) while it runs."""
        cp_step, talker_step = self.step_fns(n)
        codes, nxt = cp_step()  # codes: [n, 16], nxt: [n, D]
        self.codes[:n] = codes
        self.x[:n] = nxt
        self.frame[:n] += 1
        h, code0 = talker_step()  # h: [n, D], code0: [n]
        self.h[:n] = h
        self.code0[:n] = code0
        self.pos[:n] += 1
        self.pos_host[:n] += 1
        sampling.mark_seen(self.seen[:n], code0)
        k = self._turn
        self._turn ^= 1
        out = torch.cat([self.codes[:n], self.code0[:n, None]], dim=1)  # out: [n, 17]
        return k, n, to_host_async(out, self._host[k][:n])

    def collect(self, ticket: tuple[int, int, Any]) -> tuple[Any, Any]:
        """Wait for a launched frame: (codes [n, 16] of the frame it completed, eos [n]: the next frame's
        code 0 is EOS) as numpy arrays."""
        k, n, done = ticket
        if done is not None:
            done.synchronize()
        out = self._host[k][:n].numpy().copy()
        return out[:, :16], out[:, 16] == self.model.eos_id

    def _run(self, graph: BucketedGraph | None, make: Callable[[int], Callable[[], tuple]], n: int) -> tuple:
        """One step for rows [:n]: the captured graph of n's bucket, else the callable at the bucket size
        (compiled modes: one shape per bucket) or at n (eager)."""
        b = pick_bucket(n, self.buckets)
        if self.graphs and graph is not None and b is not None:
            return graph.run(n)
        return tuple(t[:n] for t in make(b if (b and self.mode.compiled) else n)())

    def move_slot(self, src: int, dst: int) -> None:
        """Move a request's whole state from slot src to slot dst (compaction after a finish)."""
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


_VARIANT = {True: "full sort", False: f"top-{sampling.TOPK_CAP} selection"}

@dataclass
class Admission:
    """A request checked and embedded, ready for `Runner.prefill_batch`."""

    pre: Any  # model.Prefill: embeds [T, D], trailing [N, D], pad [D]
    settings: Any  # model.Settings
    max_frames: int


def _too_long(T: int, max_len: int, ref_codes: Any) -> str:
    """The one-line error for a prompt that leaves no room for 2 frames; names the reference audio for an ICL clone."""
    if ref_codes is None:
        return (f"text is too long for this engine (prompt {T} tokens, max_seq_len {max_len}); "
                f"shorten it or raise max_seq_len")
    return (f"text + reference audio is too long for this engine (prompt {T} tokens incl. {ref_codes.shape[0]} "
            f"reference frames, max_seq_len {max_len}); shorten the text or the reference clip, or raise max_seq_len")
