"""Streaming decode of the 12 Hz speech tokenizer: per-request chunks of audio as frames arrive, many
requests' chunks decoded as one batch.

Owns: `StreamingDecoder` (when a chunk is due, how much left context it gets, a voice-clone prefix that
primes the decoder but is never emitted), `ChunkPlan` (a chunk owed, planned apart from decoding) and
`decode_plans` (one batched `CodecDecoder.decode_window` per distinct window shape, a failing batch
retried row by row so one bad request never fails the others). The chunks join to exactly the one-shot
decode, as the decoder is causal with a finite receptive field (see codec/decoder.py).
Does not know: the engine, requests or chunk-size policy (the caller picks those).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omni_tts.models.codec.decoder import CodecDecoder
from omni_tts.models.transfer import to_host


@dataclass
class ChunkPlan:
    """A chunk a StreamingDecoder owes: frames [start, end) of its stream (prefix included), not decoded yet.

    `windows`: the (codes [C+N, Q] int64, C) pieces to run through `CodecDecoder.decode_window` (one
    per official segment touched; their audio, joined, is the chunk). Decode with `decode_plans`, then
    hand the audio to `decoder.account` in the order the plans were made.
    """

    decoder: StreamingDecoder
    start: int
    end: int
    windows: list[tuple[torch.Tensor, int]]


def decode_plans(plans: list[ChunkPlan], fast: Callable[[Any, torch.Tensor, int], torch.Tensor | None] | None = None
                 ) -> tuple[list[torch.Tensor | Exception], int]:
    """Decode every plan's windows with one batched `decode_window` per distinct (codec, C+N, C).
    `fast(codec, rows [B, C+N, Q], C)`, when given, is tried first (e.g. graphed shapes; None: no).

    The decoder is row-independent, so a row decoded in a batch equals its decode alone. Returns, per
    plan, its float32 CPU audio [N*upsample] or the exception its decode raised (a failing batch is
    retried row by row, so one bad request never fails the others), and how many decode calls ran.
    """
    groups: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    for i, plan in enumerate(plans):
        for j, (codes, ctx) in enumerate(plan.windows):
            groups.setdefault((id(plan.decoder.codec), codes.shape[0], ctx), []).append((i, j))
    pieces: list[list[Any]] = [[None] * len(plan.windows) for plan in plans]
    calls = 0
    for (_, _, ctx), members in groups.items():
        codec = plans[members[0][0]].decoder.codec
        rows = [plans[i].windows[j][0] for i, j in members]  # each [C+N, Q]
        try:
            calls += 1
            batch = torch.stack(rows)  # [B, C+N, Q]
            wav = fast(codec, batch, ctx) if fast is not None else None
            wav = wav if wav is not None else codec.decode_window(batch, ctx)
            wavs: list[Any] = list(to_host(wav))  # B x [N*upsample]
        except Exception as e:
            if len(rows) == 1:
                wavs = [e]
            else:
                wavs = []
                for row in rows:  # find the row(s) at fault
                    calls += 1
                    try:
                        wavs.append(to_host(codec.decode_window(row[None], ctx))[0])
                    except Exception as err:
                        wavs.append(err)
        for (i, j), wav in zip(members, wavs):
            pieces[i][j] = wav
    out: list[torch.Tensor | Exception] = []
    for got in pieces:
        err = next((w for w in got if isinstance(w, Exception)), None)
        out.append(err if err is not None else got[0] if len(got) == 1 else torch.cat(got))
    return out, calls


class StreamingDecoder:
    """Per-request incremental decode: `push` frames as they arrive, `flush` at the end.

    The first chunk is emitted once `initial_chunk_frames` frames are in, then one every `chunk_frames` (with
    `grow`, chunk sizes double from the first up to `chunk_frames`); each chunk is decoded with
    max(left_context_frames, the decoder's receptive field) frames of left context, so the concatenated chunks
    equal `CodecDecoder.decode` of all frames.
    Chunks are 1-D float32 numpy arrays of frames * decode_upsample_rate samples.
    `prefix_codes` [P, Q] (voice-clone reference codes) prime the decoder: they are left context of the
    pushed frames but never emitted, so the chunks equal `decode([prefix; pushed])` minus its first
    P * decode_upsample_rate samples.

    Planning is split from decoding so that many decoders' chunks can be decoded in one batch:
    `plan_push` / `plan_flush` return the ChunkPlan that became due (frames [planned_frames, ...) are
    then promised to it), `decode_plans` decodes plans of many decoders, `account` takes each chunk's
    audio back in order. `push` / `flush` do all three for this decoder alone.
    """

    def __init__(self, codec: CodecDecoder, initial_chunk_frames: int = 2, chunk_frames: int = 12,
                 left_context_frames: int | None = None, prefix_codes: torch.Tensor | np.ndarray | None = None,
                 grow: bool = False):
        if initial_chunk_frames < 1 or chunk_frames < 1:
            raise ValueError("initial_chunk_frames and chunk_frames must be >= 1")
        self.codec = codec
        self.initial_chunk_frames, self.chunk_frames = initial_chunk_frames, chunk_frames
        self.grow = grow  # chunks after the first double in size up to chunk_frames
        self._last_chunk = 0  # frames in the last planned chunk
        wanted = codec.sliding_window if left_context_frames is None else left_context_frames
        self.left_context_frames = max(wanted, codec.receptive_field_frames)
        self._codes: list[torch.Tensor] = []
        self.total_frames = 0  # frames in (prefix included)
        self.planned_frames = 0  # frames promised to a ChunkPlan
        self.emitted_frames = 0  # frames whose audio has been accounted
        if prefix_codes is not None:
            prefix = torch.as_tensor(prefix_codes).reshape(-1, codec.num_quantizers).long()  # prefix: [P, Q]
            self._codes.append(prefix)
            self.total_frames = self.planned_frames = self.emitted_frames = prefix.shape[0]
        self.prefix_frames = self.total_frames

    def plan_push(self, codes_new: torch.Tensor | np.ndarray) -> ChunkPlan | None:
        """Add [n, Q] (or [Q]) frames; return the plan of the chunk that became due, or None."""
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
        return min(self.chunk_frames, 2 * self._last_chunk) if self.grow else self.chunk_frames

    def plan_flush(self) -> ChunkPlan | None:
        """The plan of every frame not planned yet (None if there is none)."""
        return self._plan() if self.total_frames > self.planned_frames else None

    def _plan(self) -> ChunkPlan:
        codes = torch.cat(self._codes)  # codes: [T, Q]
        self._codes = [codes]
        windows = self.codec.windows(codes, self.planned_frames, self.total_frames, self.left_context_frames)
        plan = ChunkPlan(self, self.planned_frames, self.total_frames, windows)
        self._last_chunk = self.total_frames - self.planned_frames
        self.planned_frames = self.total_frames
        return plan

    def account(self, plan: ChunkPlan, wav: torch.Tensor) -> np.ndarray:
        """Take back a plan's decoded audio [N*upsample]; plans must come back in the order they were made."""
        if plan.decoder is not self or plan.start != self.emitted_frames:
            raise ValueError(f"chunk [{plan.start}, {plan.end}) accounted out of order "
                             f"(emitted {self.emitted_frames} frames)")
        self.emitted_frames = plan.end
        return wav.reshape(-1).float().cpu().numpy()

    def push(self, codes_new: torch.Tensor | np.ndarray) -> np.ndarray | None:
        """Add [n, Q] (or [Q]) frames; return the audio of the frames that became due, or None."""
        plan = self.plan_push(codes_new)
        return None if plan is None else self._decode(plan)

    def flush(self) -> np.ndarray | None:
        """Audio of every frame not emitted yet (None if there is none)."""
        plan = self.plan_flush()
        return None if plan is None else self._decode(plan)

    def _decode(self, plan: ChunkPlan) -> np.ndarray:
        wav = decode_plans([plan])[0][0]
        if isinstance(wav, Exception):
            self.planned_frames = plan.start  # nothing was emitted: the frames are owed again
            raise wav
        return self.account(plan, wav)
