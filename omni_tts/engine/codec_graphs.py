"""CUDA graphs of the codec's streamed decode: a chunk is one replay instead of an eager launch per op from
the code-to-wave thread, which would otherwise hold the interpreter lock the scheduler needs between frames.

Owns: `FirstChunkGraphs` (a stream's first chunk: empty state, per batch bucket; it decides TTFP),
`CarriedChunkGraphs` (chunks that continue streams: per chunk length and row bucket, the rows' states
gathered into static buffers and the new states written back into them inside the graph), the codec's
row buckets (`codec_buckets`) and `ChunkGraphs`, both behind the `FastDecode` call `decode_plans` takes.
Does not know: requests, the engine, when chunks are due.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from omni_tts.engine.cuda_graphs import BucketedGraph, GraphPool, pick_bucket
from omni_tts.models.codec.layers import Carry
from omni_tts.models.codec.streaming import StreamingDecoderState

CARRIED_MAX_ROWS = 64  # above this a chunk is bound by the GPU's work, not its launches: eager


def codec_buckets(max_rows: int) -> list[int]:
    """Row buckets of carried chunks: every count to 8, then every second one, and max_rows (at most
    CARRIED_MAX_ROWS). A padded row costs a whole row's decode, which at many rows outweighs what the graph
    saves."""
    top = min(max_rows, CARRIED_MAX_ROWS)
    return sorted({*range(1, min(8, top)), *range(8, top, 2), top})


class FirstChunkGraphs:
    """CUDA graphs of the codec's first-chunk decode (`frames` frames of streams that start: the chunk
    every plain request starts with, so it decides TTFP) per batch bucket, returning the audio and the
    carried state the streams continue from. Their own pool, not the engine's shared one: they replay
    on the code-to-wave stream while the step graphs replay on the scheduler's, and graphs sharing a pool
    must never run at the same time."""

    def __init__(self, codec: Any, frames: int, buckets: list[int], priority: bool = False) -> None:
        """priority: replay on a high-priority stream (as the frame steps run), so a first chunk (TTFP) is
        not queued behind other requests' later chunks."""
        self.codec, self.frames = codec, frames
        device = codec.quantizer["rvq_first"].tables.device
        self.stream = torch.cuda.Stream(device, priority=-1) if priority else None
        self.codes = torch.zeros(max(buckets), frames, codec.num_quantizers, dtype=torch.long, device=device)
        self.keys: list[Any] = []  # the carry's layers, in the order of the graph's outputs after the audio
        self.graph = BucketedGraph("codec first chunk", lambda b: (lambda: self._decode(b)), buckets,
                                   GraphPool(use_vllm=False))
        with torch.no_grad():  # outputs must not require grad (the codec's parameters do)
            self.pool_bytes = self.graph.capture().pool_bytes

    def _decode(self, b: int) -> tuple[torch.Tensor, ...]:
        carry: Carry = {}
        wav = self.codec.decode_carried(self.codes[:b], carry)
        self.keys = list(carry)
        return (wav, *carry.values())

    def __call__(self, codec: Any, rows: torch.Tensor) -> tuple[torch.Tensor, Carry] | None:
        """rows [n, N, Q] host codes of streams that start -> (wav [n, N*upsample] (a view: copy it before the
        next call), their carry), or None when this shape has no graph."""
        n = rows.shape[0]
        if codec is not self.codec or rows.shape[1] != self.frames or pick_bucket(n, self.graph.buckets) is None:
            return None
        if self.stream is None:
            return self._replay(codec, rows)
        current = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            out = self._replay(codec, rows)
        current.wait_stream(self.stream)
        return out

    def _replay(self, codec: Any, rows: torch.Tensor) -> tuple[torch.Tensor, Carry]:
        n = rows.shape[0]
        self.codes[:n].copy_(codec.prepare(rows))
        wav, *state = self.graph.run(n)
        return wav, {k: t.clone() for k, t in zip(self.keys, state)}  # the next replay overwrites the outputs


class CarriedChunkGraphs:
    """Chunks of `lengths` frames that continue streams, one graph per (length, row bucket), all in one pool.

    The rows' states are concatenated into static carry buffers (one per carried layer, `buckets[-1]`
    rows), the graph decodes from them, writes the new states back in place and the audio into one static
    buffer per length, and each row takes a copy of its state. A stream's last chunk, shorter than every
    length it could pad to, decodes padded with code-0 frames at its end: causal, so its audio is the same;
    its state then holds the padding and is dropped. `replays` counts calls per (length, frames).
    `capture(n)` captures one length's buckets (the longest first, so the others reuse its pool blocks);
    until every length is captured, and without CUDA, each call runs the same function eagerly, padded to
    its bucket (what the tests check where there is no GPU)."""

    def __init__(self, codec: Any, lengths: Sequence[int], buckets: Sequence[int]) -> None:
        self.codec, self.lengths, self.buckets = codec, sorted(set(lengths)), sorted(set(buckets))
        device, rows = codec.quantizer["rvq_first"].tables.device, self.buckets[-1]
        with torch.inference_mode(False), torch.no_grad():  # buffers the graphs may write in place
            template: Carry = {}
            codec.decode_carried(torch.zeros(rows, 1, codec.num_quantizers, dtype=torch.long, device=device),
                                 template)
            self.keys = list(template)
            self.carry = {k: torch.zeros_like(v) for k, v in template.items()}  # [rows, ...] each
            self.codes = {n: torch.zeros(rows, n, codec.num_quantizers, dtype=torch.long, device=device)
                          for n in self.lengths}
            self.wav = {n: torch.zeros(rows, n * codec.decode_upsample_rate, device=device) for n in self.lengths}
        self.graphs: dict[int, BucketedGraph] = {}
        self.pool = GraphPool(use_vllm=False) if device.type == "cuda" else None
        self.pool_bytes = 0  # reserved-memory growth over the captures
        self.replays: dict[tuple[int, int], int] = {}

    @classmethod
    def captured(cls, codec: Any, lengths: Sequence[int], buckets: Sequence[int],
                 between: Callable[[Callable[[], Any]], Any] = lambda part: part()) -> CarriedChunkGraphs:
        """Built with every length captured (CUDA), the longest first (the others reuse its pool blocks);
        the buffers and each length's capture run as parts through `between` (the engine's: between an early
        scheduler's frames)."""
        graphs = between(lambda: cls(codec, lengths, buckets))
        for n in reversed(graphs.lengths):
            between(lambda n=n: graphs.capture(n))
        return graphs

    def capture(self, n: int) -> None:
        graph = BucketedGraph(f"codec chunk of {n} frames", lambda b: (lambda: self._decode(n, b)), self.buckets,
                              self.pool)
        with torch.no_grad():
            self.pool_bytes += graph.capture().pool_bytes
        self.graphs[n] = graph

    def _decode(self, n: int, b: int) -> tuple[torch.Tensor]:
        carry = {k: self.carry[k][:b] for k in self.keys}
        wav = self.codec.decode_carried(self.codes[n][:b], carry)
        for k in self.keys:  # every read of the old state is queued before these writes
            self.carry[k][:b].copy_(carry[k])
        return (self.wav[n][:b].copy_(wav),)  # one buffer per length, not one output per graph

    def __call__(self, codec: Any, rows: torch.Tensor, states: Sequence[StreamingDecoderState],
                 final: bool) -> tuple[torch.Tensor, Carry] | None:
        """rows [n, N, Q] host codes continuing `states` -> (wav [n, N*upsample] (a view: copy it before the
        next call), their new carry; empty after a padded last chunk), or None when not covered."""
        n, frames = rows.shape[:2]
        length = next((x for x in self.lengths if x >= frames), None)
        if (codec is not self.codec or length is None or (length != frames and not final)
                or pick_bucket(n, self.buckets) is None or any(len(s.carry) != len(self.keys) for s in states)):
            return None
        with torch.inference_mode(False), torch.no_grad():
            codes = self.codes[length]
            codes[:n, :frames].copy_(codec.prepare(rows))
            if frames < length:
                codes[:n, frames:].zero_()
            for k in self.keys:
                torch.cat([s.carry[k] for s in states], out=self.carry[k][:n])
            wav = self._run(length, n)[:, :frames * codec.decode_upsample_rate]
            carry = {} if frames < length else {k: self.carry[k][:n].clone() for k in self.keys}
        self.replays[length, frames] = self.replays.get((length, frames), 0) + 1
        return wav, carry

    def _run(self, length: int, n: int) -> torch.Tensor:
        if len(self.graphs) == len(self.lengths):
            return self.graphs[length].run(n)[0]
        out = self._decode(length, pick_bucket(n, self.buckets))[0][:n]
        return out if out.is_cuda else out.clone()  # a CPU copy to the host would be the buffer itself


class ChunkGraphs:
    """The audio stage's `FastDecode`: first chunks through `first`, continuing chunks through `carried`
    (either may be None: that kind decodes eagerly)."""

    def __init__(self, first: FirstChunkGraphs | None, carried: CarriedChunkGraphs | None) -> None:
        self.first, self.carried = first, carried

    def __call__(self, codec: Any, rows: torch.Tensor, states: Sequence[StreamingDecoderState],
                 final: bool) -> tuple[torch.Tensor, Carry] | None:
        if not any(states):
            return self.first(codec, rows) if self.first is not None else None
        return self.carried(codec, rows, states, final) if self.carried is not None else None
