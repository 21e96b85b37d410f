"""The TF32 switches of cuDNN and cuBLAS, which torch keeps per process, changed only here under one lock.

Owns: `exact` (both switches off for a block: the voice-clone encoders, the float32 codec; blocks on several
threads may overlap, the switches come back when the last one ends) and `tf32` (cuBLAS TF32 on for a block
that launches kernels, the tf32 codec's decode: unless an exact block is open, then in IEEE float32; no
exact block opens until it ends). Without the lock, one thread restoring what it saw could leave TF32 on
under another thread's exact block, or off for good. Knows nothing about models; a no-op off CUDA.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_lock = threading.RLock()  # re-entrant: an exact block may open inside a tf32 block on its thread
_open = 0  # exact blocks open now, all threads
_saved: tuple[bool, bool] = (True, False)  # the switches before the first of them


def _switches() -> tuple[bool, bool]:
    return torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32


def _set(cudnn: bool, matmul: bool) -> None:
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = cudnn, matmul


@contextlib.contextmanager
def exact(device: torch.device) -> Iterator[None]:
    """TF32 off (cuDNN convs and cuBLAS matmuls) for the block; a no-op off CUDA."""
    global _open, _saved
    if device.type != "cuda":
        yield
        return
    with _lock:
        if _open == 0:
            _saved = _switches()
            _set(False, False)
        _open += 1
    try:
        yield
    finally:
        with _lock:
            _open -= 1
            if _open == 0:
                _set(*_saved)


@contextlib.contextmanager
def tf32(device: torch.device) -> Iterator[None]:
    """cuBLAS TF32 on for the block (cuDNN's is on unless an exact block is open), or IEEE float32 while an
    exact block is open on another thread. Kernels read the switch at launch (or capture), so holding it
    while the block launches them is enough; the lock is held throughout, so no exact block opens
    under it. A no-op off CUDA."""
    if device.type != "cuda":
        yield
        return
    with _lock:
        saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = not _open
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved
