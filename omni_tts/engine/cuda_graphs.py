"""CUDA graph capture: one graph per batch-size bucket, all in ONE shared memory pool.

Owns: the shared pool (vLLM's global graph pool when vllm is importable on a CUDA host, else one
the engine owns; a fresh one after every release, see `GraphPool.renew`), bucket selection, static
input/output buffers, the cuBLAS workspace a capture bakes in (made inside its pool, see
`_forget_cublas_workspaces`), cuDNN's attention inside captures only (`graph_attention`), padded replay,
and release. This is the only file that calls torch.cuda.graph.
Knows nothing about what the captured function computes: it takes a callable over tensors.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

Tensors = tuple[torch.Tensor, ...]
_attention_lock = threading.Lock()
_attention_captures = 0  # captures now running (in any thread) that want cuDNN's attention


@contextmanager
def graph_attention() -> Iterator[None]:
    """cuDNN's attention on while graphs are captured: it builds a kernel at run time per shape, which a
    graph's fixed shapes pay once, here; outside captures the model loader keeps it off (every new shape
    would build one on a request's path). A frame of another thread meanwhile may use it too: correct,
    only slower to start."""
    global _attention_captures
    with _attention_lock:
        _attention_captures += 1
        torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        yield
    finally:
        with _attention_lock:
            _attention_captures -= 1
            if not _attention_captures:
                torch.backends.cuda.enable_cudnn_sdp(False)


def pick_bucket(n: int, buckets: Sequence[int]) -> int | None:
    """Smallest bucket >= n, or None when n exceeds the largest (run ungraphed)."""
    for b in sorted(buckets):
        if b >= n:
            return b
    return None


def _forget_cublas_workspaces() -> None:
    """Drop cuBLAS's cached per-(handle, stream) workspaces (torch keeps them outside every graph pool).

    The warm-up runs before a capture leave one for the capture stream, and a capture that reuses it bakes
    in memory the graph does not own: Inductor's graph trees (reduce-overhead) clear this cache on every
    warm-up and recording, and torch.cuda.graph's empty_cache then unmaps the freed workspace, so the next
    replay faults (cudaErrorIllegalAddress). Called before a capture, the capture makes its workspace
    inside its own pool, which lives as long as its graphs; called after, that workspace goes back to the
    pool like any other temporary of the capture, and eager calls make a fresh one."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def graph_tree_pool_bytes() -> int:
    """Bytes held by the calling thread's Inductor CUDA graph trees (reduce-overhead's private pool;
    the trees are per thread), 0 where it has none."""
    from torch._inductor import cudagraph_trees

    manager = cudagraph_trees.get_manager(torch.cuda.current_device(), create_if_none_exists=False)
    pool = getattr(manager, "cuda_graphs_thread_pool", None)
    if pool is None:
        return 0
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot()
               if tuple(s.get("segment_pool_id") or ()) == tuple(pool))


def _vllm_pool():  # pragma: no cover - needs vllm + CUDA
    try:
        from vllm.platforms import current_platform

        return current_platform.get_global_graph_pool()
    except Exception:
        return None


class GraphPool:
    """The one memory pool every graph of the engine is captured into."""

    def __init__(self, use_vllm: bool = True) -> None:
        self.use_vllm = use_vllm
        self.handle = None
        self.source = ""
        self.generation = 0
        self.used = False  # graphs were captured into the current handle
        self.renew(first=True)

    def begin_capture(self) -> None:
        """Call before a mode's captures: a pool that already held graphs (released by now) is
        replaced by a fresh one, so nothing is ever captured into a pool whose graphs were freed."""
        if self.used:
            self.renew()
        self.used = True

    def renew(self, first: bool = False) -> None:
        """Take a fresh pool. Capturing into a pool whose graphs were all freed hit an INTERNAL
        ASSERT (use_count > 0) on torch 2.11, so after a release we never reuse the old handle;
        vLLM's global pool is only used for the first capture of a process."""
        self.generation += 1
        handle = _vllm_pool() if (self.use_vllm and first) else None
        if handle is not None:  # pragma: no cover - needs vllm
            self.handle, self.source = handle, "vllm global graph pool"
        else:
            self.handle, self.source = torch.cuda.graph_pool_handle(), f"engine pool #{self.generation}"


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    outputs: Tensors


@dataclass
class CaptureReport:
    buckets: list[int] = field(default_factory=list)
    seconds: float = 0.0
    pool_bytes: int = 0  # reserved-memory growth while capturing (the graphs' share of the pool)


class BucketedGraph:
    """One CUDA graph per bucket of `make_fn(bucket)`, a zero-argument callable over static buffers.

    The callable reads and writes the first `bucket` rows of buffers the caller owns (slot state)
    and returns its outputs. `run(n)` replays the smallest bucket >= n and returns the first n rows
    of each output (views into the static outputs: consume them before the next replay). Rows
    n..bucket-1 compute on stale data: the callable must be row-independent so they cannot
    affect rows < n. Batches above the largest bucket call make_fn(n) ungraphed.
    """

    def __init__(self, name: str, make_fn: Callable[[int], Callable[[], Tensors]],
                 buckets: Sequence[int], pool: GraphPool, warmup: int = 2) -> None:
        self.name, self.make_fn = name, make_fn
        self.buckets = sorted(set(int(b) for b in buckets))
        self.pool, self.warmup = pool, warmup
        self.graphs: dict[int, _Captured] = {}

    def capture(self, before_each: Callable[[int], None] | None = None) -> CaptureReport:
        """Capture every bucket (largest first, so smaller graphs reuse its pool blocks)."""
        with graph_attention():
            return self._capture(before_each)

    def _capture(self, before_each: Callable[[int], None] | None) -> CaptureReport:
        torch.cuda.synchronize()
        reserved0 = torch.cuda.memory_reserved()
        t0 = time.perf_counter()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        for b in sorted(self.buckets, reverse=True):
            fn = self.make_fn(b)
            if before_each is not None:
                before_each(b)
            with torch.cuda.stream(stream):
                for _ in range(self.warmup):  # compile / autotune / lazy init outside the capture
                    fn()
            stream.synchronize()
            g = torch.cuda.CUDAGraph()
            _forget_cublas_workspaces()
            # thread_local: another thread's CUDA calls meanwhile (the code-to-wave thread decoding, or
            # the scheduler stepping while it captures) must not invalidate this capture
            with torch.cuda.graph(g, pool=self.pool.handle, stream=stream, capture_error_mode="thread_local"):
                outputs = fn()
            _forget_cublas_workspaces()
            self.graphs[b] = _Captured(g, tuple(outputs))
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        return CaptureReport(list(self.buckets), time.perf_counter() - t0,
                             max(0, torch.cuda.memory_reserved() - reserved0))

    def run(self, n: int) -> Tensors:
        b = pick_bucket(n, self.graphs.keys())
        if b is None:  # above the largest bucket: ungraphed, still correct
            return tuple(self.make_fn(n)())
        cap = self.graphs[b]
        cap.graph.replay()
        return tuple(o[:n] for o in cap.outputs)

    def release(self) -> None:
        for cap in self.graphs.values():
            cap.graph.reset()
        self.graphs.clear()
