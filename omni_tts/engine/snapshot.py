"""What the engine tells dashboards and tools about itself: `EngineSnapshot` and `ModeStatus`.

Owns the record types of `Engine.snapshot()` and `Engine.modes()`, each field documented, frozen
(a snapshot is a reading, never a handle). Knows nothing about how the figures are gathered.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModeStatus:
    """One compile mode as the engine holds it now."""

    state: str  # ready | warming | queued (waits for its warm-up turn) | failed | unavailable
    serving: bool  # requests run now (ready, or warming on a path that needs no warm-up)
    progress: tuple[int, int]  # warm steps done, of how many
    reason: str  # why it failed or is unavailable ('' otherwise)
    note: str  # what the mode runs (MODES' note)
    seconds: float | None  # how long its warm-up took, once done
    is_default: bool  # requests that name no mode run it
    kernels: str  # what runs its CodePredictor's layers

    @property
    def usable(self) -> bool:
        """Requests can name it: it serves now or will once warm."""
        return self.state in ("ready", "warming", "queued")


@dataclass(frozen=True)
class EngineSnapshot:
    """Engine-wide figures for dashboards (cheap to take). Counters only grow: the difference of two
    snapshots covers what happened between them."""

    mode: str  # the default mode: what requests that name none run
    modes: dict[str, ModeStatus]  # every CompileMode by value, in enum order
    device: str  # e.g. 'cpu', 'cuda:0'
    dtype: str  # the model's, e.g. 'bfloat16'
    active: int  # requests generating now, all modes
    active_by_mode: dict[str, int]
    waiting: int  # requests queued for a slot or a warm-up, all modes
    waiting_by_mode: dict[str, int]
    max_num_seqs: int  # slots per mode
    steps_per_s: float  # frames per second across requests, recent
    mean_occupancy: float  # mean batch per frame step (requests per frame), recent
    chunk_decodes: int  # audio chunks decoded so far
    decode_calls: int  # batched code-to-wave calls that decoded them
    decode_seconds: float  # time in those calls
    layer_kernels: str  # what runs the default mode's CodePredictor layers
    kernels: str  # the Triton kernels: on | off | failed: why
    enforce_eager: bool  # the all-eager baseline: nothing compiled or captured
    codec_precision: str  # the codec's matmul precision, or 'not built'
    codec_fused: str  # on | off | failed: why
    first_chunk_graphs: str  # on | off | failed: why
    carried_chunk_graphs: str  # on | off | failed: why
    steps: int  # frames run so far, all modes
    busy_slots_sum: int  # rows over all those frames (occupancy between two snapshots)
    memory: dict[str, float]  # GiB figures (metrics.gpu_memory); {} without CUDA
    capture: dict[str, dict[str, Any]]  # per warmed mode: seconds, pool_bytes, tree_pool_bytes
    model: str  # what the loaded model is

    def as_dict(self) -> dict[str, Any]:
        """Plain dicts all the way down (for JSON)."""
        return dataclasses.asdict(self)
