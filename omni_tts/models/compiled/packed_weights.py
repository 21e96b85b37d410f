"""Packed q|k|v and gate|up weights whose row blocks ARE the reference modules' parameters, and weights with
an RMSNorm's weight folded in.

The compiled units and the Triton kernels run one matmul for q|k|v and one for gate|up; `fuse_rows`
packs the parameters into one tensor and re-points each parameter at its block, so the reference
modules and the fast paths share storage (no second copy; checkpoints and names unchanged). The
predictor's Triton kernels take its normed projections' weights with the norm's weight folded into their
columns (`fold_norm`: a copy).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _adjacent(params: list[torch.Tensor]) -> bool:
    """True when the tensors are contiguous and lie back to back in one storage (already fused)."""
    ptr, off = params[0].untyped_storage().data_ptr(), params[0].storage_offset()
    for p in params:
        if not p.is_contiguous() or p.untyped_storage().data_ptr() != ptr or p.storage_offset() != off:
            return False
        off += p.numel()
    return True


def fuse_rows(params: list[torch.Tensor]) -> torch.Tensor:
    """One tensor stacking `params` along dim 0 ([sum rows, ...]) whose row blocks ARE the parameters:
    each is re-pointed (`p.data = view`) at its block, so the reference modules and the fast path share
    storage (no second copy of the weights; values and module objects unchanged). Idempotent: already
    fused parameters give back a view over their shared storage. Anything that later re-points a
    parameter (`p.data = ...`, e.g. cast_parameters or Module.to) breaks the sharing: build FastPath after."""
    first = params[0]
    shape = (sum(p.shape[0] for p in params), *first.shape[1:])
    if _adjacent(params):
        packed = first.detach().as_strided(shape, first.stride(), first.storage_offset())
    else:
        with torch.no_grad():
            packed = torch.cat([p.detach() for p in params])
        off = 0
        for p in params:
            p.data = packed[off:off + p.shape[0]]
            off += p.shape[0]
    return nn.Parameter(packed, requires_grad=False)  # a parameter, as the module weights are to dynamo


def fuse_layer(layer: Any) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """-> (w_qkv [(H + 2 Hkv) hd, D], b_qkv [(H + 2 Hkv) hd] or None, w_gate_up [2 I, D]) of a DecoderLayer."""
    a, m = layer.self_attn, layer.mlp
    assert a.q_norm.eps == a.k_norm.eps and m.gate_proj.bias is None and m.up_proj.bias is None
    lins = [a.q_proj, a.k_proj, a.v_proj]
    b_qkv = fuse_rows([lin.bias for lin in lins]) if a.q_proj.bias is not None else None
    return fuse_rows([lin.weight for lin in lins]), b_qkv, fuse_rows([m.gate_proj.weight, m.up_proj.weight])


def fold_norm(w: torch.Tensor, norm: Any) -> torch.Tensor:
    """A copy of w [n, K] with the RMSNorm `norm`'s weight [K] folded into its columns (in float32, then w's dtype):
    norm(x) @ w^T is then (x @ fold_norm(w)^T) times each row's 1/rms (`kernels.projection.projection(folded=True)`)."""
    return (w.float() * norm.weight.float()[None, :]).to(w.dtype)
