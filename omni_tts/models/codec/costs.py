"""What one carried-state chunk decode costs, for a roofline: its FLOPs and the bytes it moves, from the
decoder's config alone.

Owns: `chunk_costs(codec_config, rows, frames, dtype)`: builds the decoder on the meta device (no memory,
no weights, no device), decodes one chunk after another (so the state is carried, as in a stream) and
counts the second with torch's FlopCounterMode (matmuls, convolutions, attention) and a dispatch mode
summing the bytes every non-view op reads and writes: an upper bound on the memory traffic, as if
every op's inputs and outputs went through memory (unfused eager ops do; fused kernels move less; a
codebook lookup counts its whole table).
Does not know: devices, timings, the engine or which kernels run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from omni_tts.models.codec.decoder import CodecDecoder
from omni_tts.models.codec.layers import Carry


@dataclass
class ChunkCosts:
    rows: int
    frames: int
    flops: int  # matmuls, convolutions and attention (2 per multiply-add)
    bytes_moved: int  # every op's tensor inputs and outputs, weights included
    weight_bytes: int  # the decoder's parameters: each read at least once per call

    def per_frame(self) -> dict[str, float]:
        n = self.rows * self.frames
        return {"flops": self.flops / n, "bytes_moved": self.bytes_moved / n, "weight_bytes": self.weight_bytes / n}


class _Bytes(TorchDispatchMode):
    """Sums the bytes of the tensors each op reads and writes (views move nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            self.total += sum(t.numel() * t.element_size() for t in tree_leaves((args, kwargs, out))
                              if isinstance(t, torch.Tensor))
        return out


def chunk_costs(codec_config: dict[str, Any], rows: int, frames: int, dtype: torch.dtype = torch.bfloat16
                ) -> ChunkCosts:
    """The costs of decoding `frames` new frames of `rows` streams with carried state (a stream's state
    has the same size at any point, so the history does not change them)."""
    with torch.device("meta"):
        codec = CodecDecoder(codec_config).to(dtype).eval()
        codes = torch.zeros(rows, frames, codec.num_quantizers, dtype=torch.long)
    weights = sum(p.numel() * p.element_size() for p in codec.parameters())
    with torch.inference_mode():
        carry: Carry = {}
        codec.decode_carried(codes, carry)
        moved = _Bytes()
        with FlopCounterMode(display=False) as flops, moved:
            codec.decode_carried(codes, carry)
    return ChunkCosts(rows, frames, int(flops.get_total_flops()), moved.total, weights)
