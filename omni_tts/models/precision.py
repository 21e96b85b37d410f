"""The TF32 switches of cuDNN and cuBLAS, which torch keeps per process, changed only here under one lock.

Owns: `exact` (both switches off for a block: the voice-clone encoders, the float32 codec; blocks on several
threads may overlap, the switches come back when the last one ends) and `tf32_matmul` (a call with cuBLAS
TF32 on while it launches its kernels, unless an exact block is open: then in IEEE float32). Without the
lock, one thread restoring what it saw could leave TF32 on under another thread's exact block, or off for
good. Knows nothing about models; a no-op off CUDA.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

T = TypeVar("T")

_lock = threading.Lock()
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


def tf32_matmul(on: bool, call: Callable[[], T]) -> T:
    """call() with cuBLAS TF32 on if `on` and no exact block is open (kernels read the switch at launch,
    so holding it for the call's launches is enough); otherwise call() as the switches stand."""
    if not on:
        return call()
    with _lock:
        if _open:
            return call()
        saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return call()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved
