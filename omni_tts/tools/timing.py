"""What the benchmark tools time, and how: the median of a callable's runs in ms, and callables that decode
one codec chunk of several streams from carried state (eagerly, or through the engine's chunk graphs).

Owns: the timing loop (CUDA events on CUDA, perf_counter on a CPU) and the chunk callables that microbench,
roofline and codec-bench share. Knows nothing about the engine's scheduler or the tools' reports.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from omni_tts.errors import OmniTTSError
from omni_tts.models.codec.streaming import StreamingDecoderState, decode_chunk


def time_ms(fn: Callable[[], Any], iters: int = 20, warmup: int = 3) -> float:
    """Median wall time of fn() in ms (CUDA events on CUDA, perf_counter on CPU)."""
    for _ in range(warmup):
        fn()
    cuda = torch.cuda.is_available()
    times = []
    for _ in range(iters):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1000 * (time.perf_counter() - t0))
    return sorted(times)[len(times) // 2]


def carried_chunk(codec: Any, b: int, history: int, frames: int) -> Callable[[], Any]:
    """A call decoding the next `frames` frames of b streams `history` frames in (their state copied per call)."""
    device = codec.quantizer["rvq_first"].tables.device
    codes = torch.randint(0, 2048, (b, history + frames, codec.num_quantizers), device=device)
    carry: dict = {}
    with torch.inference_mode():
        codec.decode_carried(codes[:, :history], carry)

    def run() -> Any:
        with torch.inference_mode():
            return codec.decode_carried(codes[:, history:], dict(carry))
    return run


def graphed_chunk(graphs: Any, codec: Any, rows: int, history: int, frames: int) -> Callable[[], Any]:
    """A call decoding the next `frames` frames of `rows` streams `history` frames in through `graphs`
    (`codec_graphs.CarriedChunkGraphs`), as the engine hands them over (host codes, one state per row);
    the states are not advanced: each call decodes the same chunk."""
    codes = torch.randint(0, 2048, (rows, history + frames, codec.num_quantizers))
    states = [StreamingDecoderState() for _ in range(rows)]
    decode_chunk(codec, codes[:, :history], states)
    return lambda: _graphed(graphs, codec, codes[:, history:], states)  # the states stay where they were


def _graphed(graphs: Any, codec: Any, codes: torch.Tensor, states: list) -> Any:
    got = graphs(codec, codes, states, False)
    if got is None:
        raise OmniTTSError(f"no carried-chunk graph covers {tuple(codes.shape[:2])} (rows, frames)")
    return got
