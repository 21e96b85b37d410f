"""Streaming decode of the 12 Hz speech tokenizer: per-request chunks of audio as frames arrive, each frame
decoded once, many requests' chunks decoded as one batch.

Owns: `StreamingDecoderState` (one stream's carried decoder state between chunks), `decode_chunk` (the next
frames of several streams as one batched `CodecDecoder.decode_carried`, their states stacked and put
back), `StreamingDecoder` (when a chunk is due; where the stream restarts: its first emitted frame after
a voice-clone prefix, which primes the state but is never emitted, and each official 300-frame segment,
primed with the frames the one-shot decode gives it as context), `ChunkPlan` (a chunk owed, planned
apart from decoding) and `decode_plans` (every plan's pieces, batched per round and chunk length, a
failing batch retried row by row so one bad request never fails the others). The chunks join to the
one-shot decode (see codec/decoder.py).
Does not know: the engine, requests or chunk-size policy (the caller picks those).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omni_tts.models.codec.decoder import CodecDecoder
from omni_tts.models.codec.layers import Carry
from omni_tts.models.transfer import to_host

# fast(codec, rows [B, N, Q] host codes, the rows' states (all empty: the rows start their streams; none
# empty: they continue), final: no row decodes after this) -> (wav [B, N*upsample], the rows' new carry),
# or None (not covered: decode_carried runs)
FastDecode = Callable[[Any, torch.Tensor, "Sequence[StreamingDecoderState]", bool], "tuple[torch.Tensor, Carry] | None"]


class StreamingDecoderState:
    """One stream's carry between decode calls: {layer: tensor [1, ...]}; empty at the stream's start."""

    def __init__(self) -> None:
        self.carry: Carry = {}

    def reset(self) -> None:
        self.carry = {}

    def __bool__(self) -> bool:
        return bool(self.carry)


def _stack(states: Sequence[StreamingDecoderState]) -> Carry:
    """The rows' carries as one batch carry; a row without an entry gets zeros (a stream's start)."""
    out: Carry = {}
    for key in {k: None for s in states for k in s.carry}:
        rows = [s.carry.get(key) for s in states]
        ref = next(r for r in rows if r is not None)
        out[key] = torch.cat([torch.zeros_like(ref) if r is None else r for r in rows])
    return out


def decode_chunk(codec: CodecDecoder, codes: torch.Tensor, states: Sequence[StreamingDecoderState],
                 fast: FastDecode | None = None, final: bool = False) -> torch.Tensor:
    """The next frames codes [B, N, Q] of B streams (row i continues states[i]) -> float32 [B, N*upsample],
    those frames of each stream's one-shot decode. The states advance only if the whole batch decodes.
    `fast` is tried for a batch whose states are all empty or all carried; `final`: no row decodes
    after this call (its new state may be dropped)."""
    started = [bool(s) for s in states]
    got = fast(codec, codes, states, final) if fast is not None and len(set(started)) == 1 else None
    if got is None:
        carry = _stack(states)
        with torch.inference_mode():
            wav = codec.decode_carried(codec.prepare(codes), carry)
    else:
        wav, carry = got
    for i, s in enumerate(states):
        s.carry = {k: v[i: i + 1] for k, v in carry.items()}
    return wav


@dataclass
class Piece:
    """Frames [N, Q] a stream decodes in turn: after a restart (`reset`: an empty state) or where it left
    off; `keep`: its audio is part of the chunk (else it only primes the state); `last`: the stream's
    last piece (its state is never read again)."""

    codes: torch.Tensor
    reset: bool
    keep: bool
    last: bool = False


@dataclass
class ChunkPlan:
    """A chunk a StreamingDecoder owes: frames [start, end) of its stream (prefix included), not decoded yet.

    `pieces`: what its decoder's state decodes, in order (their kept audio, joined, is the chunk). Decode
    with `decode_plans`, then hand the audio to `decoder.account` in the order the plans were made.
    """

    decoder: StreamingDecoder
    start: int
    end: int
    pieces: list[Piece]


def _decode_group(codec: CodecDecoder, rows: list[tuple[Piece, StreamingDecoderState]],
                  fast: FastDecode | None) -> tuple[list[Any], int]:
    """One batched decode of same-length pieces, each row's state advanced -> (per row: its host audio,
    None for a priming piece, or the exception; the decode calls made)."""
    try:
        run = [StreamingDecoderState() if p.reset else s for p, s in rows]
        wav = decode_chunk(codec, torch.stack([p.codes for p, _ in rows]), run, fast, all(p.last for p, _ in rows))
        host = list(to_host(wav)) if any(p.keep for p, _ in rows) else [None] * len(rows)
        for (_, s), r in zip(rows, run):  # only once the whole batch is out: a retry starts where it was
            s.carry = r.carry
        return [w if p.keep else None for (p, _), w in zip(rows, host)], 1
    except Exception as e:
        if len(rows) == 1:
            return [e], 1
    out: list[Any] = []
    for row in rows:  # find the row(s) at fault
        out += _decode_group(codec, [row], None)[0]
    return out, 1 + len(rows)


def decode_plans(plans: list[ChunkPlan], fast: FastDecode | None = None) -> tuple[list[torch.Tensor | Exception], int]:
    """Decode every plan's pieces: a decoder's plans in order, each round one piece of every decoder, as
    one batched decode per (codec, piece length, restart or not). `fast`, when given, is tried for each
    batch first (e.g. CUDA graphs of the engine's chunk lengths).

    The decoder is row-independent, so a row decoded in a batch equals its decode alone. Returns, per
    plan, its float32 CPU audio [N*upsample] or the exception its decode raised (a failing batch is
    retried row by row, so one bad request never fails the others; that decoder's later plans in the
    call fail with it), and how many decode calls ran.
    """
    queues: dict[int, list[tuple[int, Piece]]] = {}
    for i, plan in enumerate(plans):
        queues.setdefault(id(plan.decoder), []).extend((i, p) for p in plan.pieces)
    audio: list[list[torch.Tensor]] = [[] for _ in plans]
    errors: dict[int, Exception] = {}  # plan index -> its error
    calls = 0
    while queues:
        groups: dict[tuple[int, int, bool], list[tuple[int, int, Piece]]] = {}
        for key, queue in queues.items():
            i, piece = queue.pop(0)
            shape = (id(plans[i].decoder.codec), piece.codes.shape[0], piece.reset)
            groups.setdefault(shape, []).append((key, i, piece))
        for members in groups.values():
            codec = plans[members[0][1]].decoder.codec
            wavs, n = _decode_group(codec, [(p, plans[i].decoder.state) for _, i, p in members], fast)
            calls += n
            for (key, i, _), wav in zip(members, wavs):
                if isinstance(wav, Exception):
                    errors.update({j: wav for j in [i, *(j for j, _ in queues[key])]})
                    queues[key] = []
                elif wav is not None:
                    audio[i].append(wav)
        queues = {k: q for k, q in queues.items() if q}
    out: list[torch.Tensor | Exception] = []
    for i, got in enumerate(audio):
        out.append(errors[i] if i in errors else got[0] if len(got) == 1 else torch.cat(got))
    return out, calls


def chunk_after(last: int, chunk_frames: int, grow: bool) -> int:
    """Frames of the chunk after one of `last` frames: chunk_frames, or with `grow` twice `last` up to it."""
    return min(chunk_frames, 2 * last) if grow else chunk_frames


def chunk_lengths(initial_chunk_frames: int, chunk_frames: int, grow: bool) -> list[int]:
    """Every length a stream's chunks take (the last chunk excepted: it takes what is left): the first,
    then each next one as `chunk_after` schedules it, until the lengths repeat."""
    out = [initial_chunk_frames]
    while (n := chunk_after(out[-1], chunk_frames, grow)) not in out:
        out.append(n)
    return sorted(out)


class StreamingDecoder:
    """Per-request incremental decode: `push` frames as they arrive, `flush` at the end.

    The first chunk is emitted once `initial_chunk_frames` frames are in, then one every `chunk_frames` (with
    `grow`, chunk sizes double from the first up to `chunk_frames`); each frame is decoded once, from the
    carried `state`, so the concatenated chunks equal `CodecDecoder.decode` of all frames.
    Chunks are 1-D float32 numpy arrays of frames * decode_upsample_rate samples.
    `prefix_codes` [P, Q] (voice-clone reference codes) prime the decoder: the first chunk first decodes
    the prefix's last frames that reach the pushed ones (at most the receptive field) into the state, so
    the chunks equal `decode([prefix; pushed])` minus its first P * decode_upsample_rate samples.

    Planning is split from decoding so that many decoders' chunks can be decoded in one batch:
    `plan_push` / `plan_flush` return the ChunkPlan that became due (frames [planned_frames, ...) are
    then promised to it), `decode_plans` decodes plans of many decoders, `account` takes each chunk's
    audio back in order. `push` / `flush` do all three for this decoder alone. `release` drops the state.
    A final flush (`plan_flush(final=True)`) ends the stream: its state may be dropped, nothing more
    may be pushed.
    """

    def __init__(self, codec: CodecDecoder, initial_chunk_frames: int = 2, chunk_frames: int = 12,
                 prefix_codes: torch.Tensor | np.ndarray | None = None, grow: bool = False):
        if initial_chunk_frames < 1 or chunk_frames < 1:
            raise ValueError("initial_chunk_frames and chunk_frames must be >= 1")
        self.codec = codec
        self.initial_chunk_frames, self.chunk_frames = initial_chunk_frames, chunk_frames
        self.grow = grow  # chunks after the first double in size up to chunk_frames
        self.state = StreamingDecoderState()
        self._last_chunk = 0  # frames in the last planned chunk
        self._codes: list[torch.Tensor] = []  # frames [_first, total_frames) of the stream
        self._first = 0
        self.total_frames = 0  # frames in (prefix included)
        self.planned_frames = 0  # frames promised to a ChunkPlan
        self.emitted_frames = 0  # frames whose audio has been accounted
        self.ended = False  # a final flush was planned
        if prefix_codes is not None:
            prefix = torch.as_tensor(prefix_codes).reshape(-1, codec.num_quantizers).long()  # prefix: [P, Q]
            self._codes.append(prefix)
            self.total_frames = self.planned_frames = self.emitted_frames = prefix.shape[0]
        self.prefix_frames = self.total_frames

    def plan_push(self, codes_new: torch.Tensor | np.ndarray) -> ChunkPlan | None:
        """Add [n, Q] (or [Q]) frames; return the plan of the chunk that became due, or None."""
        if self.ended:
            raise ValueError("the stream has ended (final flush): nothing more can be pushed")
        new = torch.as_tensor(codes_new).reshape(-1, self.codec.num_quantizers).long()  # new: [n, Q]
        if new.shape[0]:
            self._codes.append(new)
            self.total_frames += new.shape[0]
        return self._plan() if self.total_frames - self.planned_frames >= self.next_chunk_frames() else None

    def next_chunk_frames(self) -> int:
        """Frames the next chunk waits for: initial_chunk_frames first, then chunk_frames; with `grow`,
        twice the last chunk until chunk_frames (1, 2, 4, 8, ...: each chunk's audio lasts longer than
        making the next one takes, so a stream that starts after one frame plays without a gap)."""
        if self.planned_frames == self.prefix_frames:
            return self.initial_chunk_frames
        return chunk_after(self._last_chunk, self.chunk_frames, self.grow)

    def plan_flush(self, final: bool = False) -> ChunkPlan | None:
        """The plan of every frame not planned yet (None if there is none); `final`: the stream ends here."""
        self.ended = self.ended or final
        return self._plan(final) if self.total_frames > self.planned_frames else None

    def _plan(self, final: bool = False) -> ChunkPlan:
        codec, start = self.codec, self.planned_frames
        codes = torch.cat(self._codes)  # codes: [total - _first, Q]
        pieces = []
        for lo, hi in codec.segment_pieces(start, self.total_frames):
            reset = lo == self.prefix_frames or codec.segment_restarts(lo)
            # a restart first decodes what the one-shot decode has before lo that output from lo on reads
            first = max(codec.segment_start(lo), lo - codec.receptive_field_frames) if reset else lo
            if first < lo:
                pieces.append(Piece(codes[first - self._first: lo - self._first], True, False))
            pieces.append(Piece(codes[lo - self._first: hi - self._first], reset and first == lo, True))
        pieces[-1].last = final
        plan = ChunkPlan(self, start, self.total_frames, pieces)
        # a restart reads at most the receptive field back: keep that much before this plan (re-planned on failure)
        keep = max(self._first, start - max(codec.receptive_field_frames, codec.segment_context))
        self._codes, self._first = [codes[keep - self._first:]], keep
        self._last_chunk = self.total_frames - start
        self.planned_frames = self.total_frames
        return plan

    def account(self, plan: ChunkPlan, wav: torch.Tensor) -> np.ndarray:
        """Take back a plan's decoded audio [N*upsample]; plans must come back in the order they were made."""
        if plan.decoder is not self or plan.start != self.emitted_frames:
            raise ValueError(f"chunk [{plan.start}, {plan.end}) accounted out of order "
                             f"(emitted {self.emitted_frames} frames)")
        self.emitted_frames = plan.end
        return wav.reshape(-1).float().cpu().numpy()

    def release(self) -> None:
        """Drop the carried state (the stream ends or is abandoned)."""
        self.state.reset()

    def push(self, codes_new: torch.Tensor | np.ndarray) -> np.ndarray | None:
        """Add [n, Q] (or [Q]) frames; return the audio of the frames that became due, or None."""
        plan = self.plan_push(codes_new)
        return None if plan is None else self._decode(plan)

    def flush(self) -> np.ndarray | None:
        """Audio of every frame not emitted yet (None if there is none)."""
        plan = self.plan_flush()
        return None if plan is None else self._decode(plan)

    def _decode(self, plan: ChunkPlan) -> np.ndarray:
        saved = self.state.carry
        wav = decode_plans([plan])[0][0]
        if isinstance(wav, Exception):
            self.planned_frames, self.state.carry = plan.start, saved  # nothing was emitted: the frames are owed again
            raise wav
        return self.account(plan, wav)
