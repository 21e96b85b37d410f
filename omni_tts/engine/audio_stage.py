"""The engine's code-to-wave stage: per-request streaming decoders' chunks, batched across requests.

Owns: the code-to-wave thread (and its CUDA stream, so decoding audio overlaps the next frames'
talker / predictor work), its job queue, turning codec codes into `AudioChunk`s delivered to request
handles, and completing requests once their audio is out. Each pass drains every job queued at that moment,
plans the chunks that became due (`StreamingDecoder.plan_push` / `plan_flush`), decodes all of them
with one batched carried-state decode per chunk length (`codec.decode_plans`: each frame decoded once;
chunks of requests that started together share a length), then emits chunks and completions in job
order, so each request's chunks and its completion stay in order. A request that completes (done,
failed or cancelled) drops its decoder state (`live_states` counts those held). On CUDA the first
chunk of a plain request (the TTFP path) and the chunks that continue streams replay CUDA graphs
(`engine/codec_graphs.py`); `drain()` lets the scheduler wait for an idle stage. Does not know: the
runner, slots, sampling, or how the codec computes a chunk.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch

from omni_tts.engine.codec_graphs import CarriedChunkGraphs, ChunkGraphs, FirstChunkGraphs, codec_buckets
from omni_tts.engine.metrics import EngineStats, now, phase
from omni_tts.engine.request import AudioChunk
from omni_tts.errors import EngineError, OmniTTSError, as_engine_error, one_line
from omni_tts.models.codec.layers import Carry
from omni_tts.models.codec.streaming import ChunkPlan, chunk_lengths, decode_plans


def _error(e: Exception) -> OmniTTSError:
    return as_engine_error(e, "audio decoding failed")


def fuse_codec(codec: Any) -> str:
    """Turn on the codec's fused activations (`CodecDecoder.set_fused`) and compile them now, so no request
    pays the compile: on CUDA the Triton kernel's variants (which sums it takes over) compile once for
    every shape; the CPU's Inductor function compiles per batch-size class, hence a 1-row and a 2-row
    decode. On any failure (no Triton, a compile
    error) the codec goes back to eager ops. -> '' or why it is off."""
    try:
        codec.set_fused(True)
        for b in (1, 2):
            codes = torch.zeros(b, 3, codec.num_quantizers, dtype=torch.long)
            with torch.inference_mode():
                carry: Carry = {}
                for _ in range(2):  # a stream's first chunk, then one with carried state
                    codec.decode_carried(codec.prepare(codes), carry)
        return ""
    except Exception as e:
        codec.set_fused(False)
        return one_line(e)


class AudioStage:
    """Jobs, each a tuple about one request record `a` (engine._Active: handle, decoder, codes, chunks,
    failed): ("push", a, codes [n, 16]), ("flush", a), ("finish", a, status, error).

    `put(jobs)` queues a list of jobs as one item (the scheduler puts one step's pushes at once, so the
    chunks that step made due are always decoded together, then that step's flushes and completions)."""

    def __init__(self, device: torch.device, stats: EngineStats, priority: bool = False) -> None:
        """priority: first-chunk graphs (`capture_first_chunks`) replay on a high-priority stream; the
        other windows decode on this stage's own normal-priority stream."""
        self.device, self.stats, self.priority = device, stats, priority
        self.first: FirstChunkGraphs | None = None
        self.carried: CarriedChunkGraphs | None = None
        self.first_error = self.carried_error = ""
        # False: decode every chunk eagerly (a switch for isolating GPU issues)
        self.graphs_on = True
        self._jobs: queue.Queue[list[tuple] | None] = queue.Queue()
        self._live: dict[int, Any] = {}  # id -> request record whose decoder may hold carried state
        self._thread = threading.Thread(target=self._loop, name="omni-tts-code2wav", daemon=True)
        self._thread.start()

    def capture_chunk_graphs(self, codec: Any, config: Any, between: Callable[[Callable[[], Any]], Any]) -> None:
        """Graph the first chunks (per batch bucket of the EngineConfig `config`) and the chunks that continue
        streams (per length its chunk schedule takes and row bucket); CUDA only. Each part runs through
        `between` (the engine's: between an early scheduler's frames, so serving pauses one part at a time)
        while nothing decodes and no other thread captures: two captures at once fail with 'operation not
        permitted when stream is capturing'. A failure is never fatal: that kind of chunk decodes eagerly."""
        buckets = config.resolved_buckets()
        try:
            self.first = between(lambda: FirstChunkGraphs(codec, config.initial_chunk_frames, buckets,
                                                          priority=self.priority))
        except EngineError:
            raise
        except Exception as e:
            self.first_error = one_line(e)
        lengths = chunk_lengths(config.initial_chunk_frames, config.chunk_frames, config.chunk_growth)
        try:
            self.carried = CarriedChunkGraphs.captured(codec, lengths, codec_buckets(max(buckets)), between)
        except EngineError:
            raise
        except Exception as e:
            self.carried_error = one_line(e)

    def graph_pool_bytes(self) -> int:
        """GPU memory the chunk graphs' pools took at their capture."""
        return sum(g.pool_bytes for g in (self.first, self.carried) if g is not None)

    def live_states(self) -> int:
        """Requests whose decoder state this stage holds (each is dropped when its request completes)."""
        return len(self._live)

    def put(self, jobs: list[tuple]) -> None:
        if jobs:
            self._jobs.put(jobs)

    def drain(self, timeout: float = 60) -> None:
        """Wait until every job queued so far is decoded (before a graph capture on another thread)."""
        done = threading.Event()
        self._jobs.put([("barrier", done)])
        done.wait(timeout)

    def stop(self, timeout: float = 30) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=timeout)

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        cuda = self.device.type == "cuda"
        with torch.cuda.stream(torch.cuda.Stream(self.device)) if cuda else nullcontext():
            while True:
                batch = [self._jobs.get()]
                while batch[-1] is not None and not self._jobs.empty():  # drain what is queued now
                    batch.append(self._jobs.get_nowait())
                jobs = [job for item in batch if item is not None for job in item if job[0] != "barrier"]
                barriers = [job[1] for item in batch if item is not None for job in item if job[0] == "barrier"]
                try:
                    with phase("audio"):
                        self._run(jobs)
                except Exception as e:  # a bug here must not leave these requests hanging
                    for a in {id(job[1]): job[1] for job in jobs}.values():
                        if not a.failed and not a.handle.done:
                            a.failed = True
                            self._complete(a, "error", _error(e))
                for done in barriers:
                    done.set()
                if batch[-1] is None:
                    return

    def _run(self, jobs: list[tuple]) -> None:
        """Plan every job's chunk in order, decode all the plans batched, then emit in order."""
        steps: list[tuple] = []  # ("chunk", a, plan) | ("fail", a, error) | ("finish", a, status, error)
        broken: set[int] = set()  # requests whose planning failed in this pass: skip their later jobs
        for job in jobs:
            a = job[1]
            if a.failed or id(a) in broken:
                continue
            if job[0] == "finish":
                steps.append(job)
                continue
            try:
                plan = (a.decoder.plan_push(torch.from_numpy(job[2])) if job[0] == "push"
                        else a.decoder.plan_flush(final=True))
            except Exception as e:
                broken.add(id(a))
                steps.append(("fail", a, _error(e)))
                continue
            if plan is not None:
                self._live[id(a)] = a
                steps.append(("chunk", a, plan))
        plans = [s[2] for s in steps if s[0] == "chunk"]
        t0 = now()
        fast = ChunkGraphs(self.first, self.carried) if self.graphs_on else None
        wavs, calls = decode_plans(plans, fast) if plans else ([], 0)
        self.stats.on_decode(sum(p.keep for plan in plans for p in plan.pieces), calls, now() - t0)
        results = iter(wavs)
        for step in steps:
            self._apply(step, next(results) if step[0] == "chunk" else None)

    def _apply(self, step: tuple, wav: Any) -> None:
        a = step[1]
        if a.failed:  # a decode error already finished this request
            return
        if step[0] == "finish":
            self._complete(a, step[2], step[3])
        elif step[0] == "fail" or isinstance(wav, Exception):
            a.failed = True
            self._complete(a, "error", step[2] if step[0] == "fail" else _error(wav))
        else:
            try:
                self._emit(a, step[2], a.decoder.account(step[2], wav))
            except Exception as e:
                a.failed = True
                self._complete(a, "error", _error(e))

    def _emit(self, a: Any, plan: ChunkPlan, wav: np.ndarray) -> None:
        """`plan.start` / `plan.end`: decoder frame counts, which include any voice-clone prefix."""
        samples = np.asarray(wav, dtype=np.float32).reshape(-1)
        if samples.size == 0:
            return
        m = a.handle.metrics
        if m.first_audio_at is None:
            m.first_audio_at = now()
        m.audio_samples += samples.size
        first = plan.start - a.decoder.prefix_frames  # frame index within this request's audio
        a.handle.deliver(AudioChunk(a.handle.id, a.chunks, samples, m.sample_rate, first, plan.end - plan.start))
        a.chunks += 1

    def _complete(self, a: Any, status: str, error: OmniTTSError | None = None) -> None:
        if self._live.pop(id(a), None) is not None:  # before the handle completes: its waiter sees it freed
            a.decoder.release()
        a.handle.complete(a.codes, status, error)
