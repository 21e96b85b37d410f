"""Copies between the host and a CUDA device that never make the host wait inside the driver.

Owns: host-to-device copies through pinned memory, not waited for (`to_device`, `put`: the caching host
allocator keeps the pinned source until its copy has run, and the copy is ordered before later kernels
on the stream), and device-to-host copies into pinned buffers with an event to wait on (`to_host_async`,
`to_host`). A pageable copy waits inside the driver, where it stalls another engine thread's kernel
launches. On a CPU each is a plain copy. Knows nothing about what the tensors hold.
"""

from __future__ import annotations

from typing import Any

import torch


def _pinned_for(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` in pinned memory when it is on the host and goes to a CUDA device; else `t` itself."""
    return t.pin_memory() if device.type == "cuda" and t.device.type == "cpu" else t


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` on `device`, the copy not waited for."""
    return _pinned_for(t, device).to(device, non_blocking=True)


def put(dst: torch.Tensor, values: Any) -> None:
    """Host values (a list, a tuple) into the tensor `dst`, the copy not waited for."""
    dst.copy_(_pinned_for(torch.tensor(values, dtype=dst.dtype), dst.device), non_blocking=True)


def to_host(t: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`t` on the host, copied (into `out` when given, else a new pinned tensor; a CPU `t` without `out`
    is returned as is) with an event wait."""
    if t.device.type != "cuda" and out is None:
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True) if out is None else out
    done = to_host_async(t, host)
    if done is not None:
        done.synchronize()
    return host


def to_host_async(t: torch.Tensor, out: torch.Tensor) -> Any:
    """Queue the copy of `t` into the host tensor `out` (pinned for a CUDA `t`) without waiting; returns
    the CUDA event to `synchronize()` before reading `out`, or None when the copy is already done (CPU)."""
    if t.device.type != "cuda":
        out.copy_(t)
        return None
    out.copy_(t, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    return done
