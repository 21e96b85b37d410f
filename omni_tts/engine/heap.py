"""Freed heap pages handed back to the OS now and then (glibc's malloc_trim): requests of many sizes on
several threads fragment the allocator's arenas, and RSS would otherwise creep up under varied load.
Owns the trimming thread's loop; knows nothing of the engine beyond the event that stops it."""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable
from typing import Any

from omni_tts.engine.metrics import phase

HEAP_TRIM_INTERVAL_S = 5.0


def malloc_trim() -> Any:
    """glibc's malloc_trim, or None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def trim_until(stop: threading.Event, trimmed: Callable[[], None]) -> None:
    """Trim every HEAP_TRIM_INTERVAL_S until `stop` is set (at once then), calling `trimmed` after each."""
    trim = malloc_trim()
    while trim is not None and not stop.wait(HEAP_TRIM_INTERVAL_S):
        with phase("heap trim"):  # it holds the allocator's locks: other threads' mallocs wait
            trim(0)
        trimmed()
