"""Launch configs of omni_tts.kernels.projection's kernel, per (rows, output width, input width).

Owns: the swept table (`TUNED`, by shape then rows), the launch options beside it (the choice kernel's
warps and search; the talker's rows on these kernels, and under programmatic dependent launch), extra
entries and options from the JSON that the preset key kernel_configs names (what `omni-tts kernel-sweep`
writes for the GPU at hand), the lookup with its fallbacks (`config`) and entries set for a block only
(`override`, a sweep's). Knows nothing about the kernels' code, models or devices.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

# Triton's CPU interpreter: its cost is per program, so fewer, larger programs there
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


# Launch configs: (BN rows of the weight per program, BK columns per loop step, pipeline stages, warps, multiply-
# and-sum instead of tensor cores[, at most this many input rows a tensor-core program: 16 or 32, more programs
# for the same weights, default MAX_BM]) by output and input width (n, K), then by rows rounded up to a power of
# two.
# Whole-row tiles (BK >= K) load all of a program's weights before it waits for the previous kernel under
# programmatic dependent launch; from 2 rows a multiply-and-sum one takes each input row in turn against them.
# Rows without an entry take the next one up that `config` tries (2..16 the 8-row entry, 17..32 the 32-row one,
# 33..128 the 64-row one); untuned shapes its default. The preset key kernel_configs names a JSON of more
# entries ("rows,n,K": [...]), what `omni-tts kernel-sweep` writes for the GPU at hand.
Config = tuple[int, int, int, int, bool] | tuple[int, int, int, int, bool, int]
# Where each entry comes from: `kernel-sweep --quick` on an H200 (one projection's launches back to back,
# weights cold in L2, PDL on at one row as the engine launches it), except those marked "H100" (the same sweep
# on an H100) and "H100 in-layer" (`--in-layer`: each candidate timed inside whole layer steps, which ranks
# some candidates otherwise than launches alone; an H200's may pick others; the talker's up to 8 rows under
# PDL, as TALKER_PDL_ROWS launches them). The predictor's shapes are both sizes', and the 0.6B talker's too.
_BY_SHAPE: dict[tuple[int, int], dict[int, Config]] = {
    (4096, 1024): {  # the predictor's q|k|v
        1: (2, 1024, 1, 4, True),  # H100 in-layer
        2: (4, 1024, 1, 4, True),  # H100 in-layer
        4: (32, 1024, 1, 4, False),  # H100 in-layer
        8: (32, 1024, 1, 4, False),  # H100
        16: (32, 1024, 1, 4, False),  # H100 in-layer
        32: (32, 256, 4, 4, False, 16),  # H100 in-layer
        64: (32, 128, 4, 4, False),  # H100 in-layer
        128: (64, 128, 4, 4, False)},  # H100 in-layer
    (1024, 2048): {  # the predictor's o
        1: (2, 2048, 1, 4, True),  # H100 in-layer
        2: (8, 2048, 1, 8, True),  # H100 in-layer
        8: (16, 256, 4, 4, False),
        16: (16, 256, 3, 4, False),  # H100 in-layer
        32: (16, 256, 4, 4, False),
        64: (16, 256, 4, 4, False, 32),  # H100 in-layer
        128: (16, 256, 4, 4, False)},  # H100 in-layer
    (3072, 1024): {  # the predictor's gate|up
        1: (2, 1024, 1, 2, True),  # H100 in-layer
        2: (4, 1024, 1, 4, True), 8: (32, 256, 3, 4, False), 32: (16, 256, 3, 4, False),
        64: (32, 128, 4, 4, False),  # H100 in-layer
        128: (64, 64, 4, 4, False)},  # H100 in-layer
    (1024, 3072): {  # the predictor's down
        1: (4, 4096, 1, 4, True),  # H100 in-layer
        2: (2, 4096, 1, 8, True), 8: (16, 256, 4, 4, False),
        16: (32, 256, 4, 4, False),  # H100 in-layer
        32: (16, 256, 4, 4, False),
        64: (16, 256, 4, 4, False),  # H100 in-layer
        128: (16, 256, 4, 4, False)},  # H100 in-layer
    (4096, 2048): {  # the 1.7B talker's q|k|v
        1: (2, 2048, 1, 1, True),  # H100 in-layer
        2: (2, 2048, 1, 4, True),  # H100 in-layer
        4: (32, 256, 3, 4, False),  # H100 in-layer
        8: (32, 256, 4, 4, False), 32: (32, 256, 3, 4, False)},
    (2048, 2048): {  # the 1.7B talker's o
        1: (8, 2048, 1, 4, True),  # H100 in-layer
        2: (8, 2048, 1, 8, True),  # H100 in-layer
        4: (32, 256, 4, 4, False),  # H100 in-layer
        8: (32, 256, 4, 4, False),  # H100 in-layer
        32: (16, 256, 4, 4, False)},
    (6144, 2048): {  # the 1.7B talker's gate|up
        1: (2, 2048, 1, 8, True),  # H100
        2: (2, 2048, 1, 4, True),  # H100 in-layer
        8: (32, 256, 3, 4, False), 32: (16, 128, 3, 4, False)},
    (2048, 6144): {  # the 1.7B talker's down
        1: (2, 2048, 2, 4, True),  # H100: a pipelined loop over three pieces of a row
        2: (2, 8192, 1, 8, True),  # H100 in-layer
        4: (32, 256, 4, 4, False),  # H100 in-layer
        8: (32, 256, 4, 4, False),  # H100 in-layer
        32: (16, 256, 4, 4, False)},
}
TUNED: dict[tuple[int, int, int], Config] = {
    (rows, n, k): cfg for (n, k), by_rows in _BY_SHAPE.items() for rows, cfg in by_rows.items()}


# warps of the sampling kernel (omni_tts.kernels.heads: one program per row; the JSON's "choose_warps" key)
CHOOSE_WARPS = 8
# rows with top-p 1 find top-k's cut as the k-th largest value (no sort); False: the top-64 sort for every
# row (the JSON's "choose_sort_free" key)
CHOOSE_SORT_FREE = True
# talker steps of at most this many rows run its Triton layers, Inductor's compiled units above (the JSON's
# "talker_kernel_rows" key); of those, steps of at most TALKER_PDL_ROWS rows launch with programmatic dependent
# launch ("talker_pdl_rows"): the next kernel's launch and weight loads overlap the previous kernel's tail
TALKER_KERNEL_ROWS = 8
TALKER_PDL_ROWS = 8
# from this many rows a normed projection takes the norm folded into a copy of its weight (the JSON's
# "fold_rows" key): the input tiles then stream unchanged into the tensor-core pipeline, which pays there;
# below, the prologue's pass over the rows costs less
FOLD_ROWS = 33
# programs of the talker's attention an SM is given where rows x heads alone leave SMs idle (the JSON's
# "attend_waves" key): a row and head's cache positions split over more programs, whose softmaxes a small
# kernel joins; more than one lets an SM hide one program's loads behind another's, which long caches pay for
ATTEND_WAVES = 4
# the JSON's keys that set one of the values above, and their types
_SCALARS = {"choose_warps": int, "choose_sort_free": bool, "talker_kernel_rows": int, "talker_pdl_rows": int,
            "fold_rows": int, "attend_waves": int}


def load_configs(path: str) -> None:
    """Add a kernel sweep's JSON (tools/kernel_sweep.py) to the table: the preset key `kernel_configs`."""
    with open(path) as f:
        data = json.load(f)
    entries: dict[tuple[int, int, int], Config] = {}
    for key, value in data.items():  # every key read before any is set: a bad file changes nothing
        if key not in _SCALARS:
            shape = _shape(path, key)
            cfg = (int(value[0]), int(value[1]), int(value[2]), int(value[3]), bool(value[4]))
            entries[shape] = cfg + (int(value[5]),) if len(value) > 5 else cfg
    set_options({key: value for key, value in data.items() if key in _SCALARS})
    TUNED.update(entries)


def _shape(path: str, key: str) -> tuple[int, int, int]:
    """An entry's key "rows,n,K" as integers; any other key is refused by name (an option no longer read, a typo)."""
    try:
        m, n, k = (int(v) for v in key.split(","))
    except ValueError:
        raise ValueError(f"kernel_configs {path}: '{key}' is neither an option ({', '.join(_SCALARS)}) "
                         f"nor a 'rows,n,K' entry") from None
    return m, n, k


def set_options(values: dict[str, Any]) -> None:
    """Set the launch options above by their JSON keys (choose_warps, talker_pdl_rows, ...)."""
    for key, value in values.items():
        globals()[key.upper()] = _SCALARS[key](value)


@contextlib.contextmanager
def override(entries: dict[tuple[int, int, int], Config]) -> Iterator[None]:
    """The table with these entries for the block's duration (a sweep timing candidates where they run)."""
    saved = {key: TUNED[key] for key in entries if key in TUNED}
    TUNED.update(entries)
    try:
        yield
    finally:
        for key in entries:
            TUNED.pop(key, None)
        TUNED.update(saved)


def config(M: int, n: int, K: int) -> Config:
    """Launch config for an [M, K] x [n, K]^T projection: the tuned entry, else a default."""
    if _INTERPRET:
        return max(16, min(128, next_pow2(n))), 128, 1, 4, M <= 2
    rows = next_pow2(M)
    for r in (rows, 1 if rows == 1 else 8 if rows <= 16 else 32 if rows <= 32 else 64):
        if (r, n, K) in TUNED:
            return TUNED[(r, n, K)]
    return (8, 512, 3, 4, True) if rows == 1 else (16, 256, 3, 4, False)

