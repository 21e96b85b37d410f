"""Launch configs of omni_tts.kernels.layers' projection kernel, per (rows, output width, input width).

Owns: the table swept on an H200 (`TUNED`), extra entries from the JSON that the preset key kernel_configs
names (what `python -m omni_tts.tools.kernel_sweep` writes for the GPU at hand), the lookup with its
fallbacks (`config`) and entries set for a block only (`override`, a sweep's). Knows nothing about the
kernels' code, models or devices.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

# Triton's CPU interpreter: its cost is per program, so fewer, larger programs there
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


# Launch configs: (BN rows of the weight per program, BK columns per loop step, pipeline stages, warps, multiply-
# and-sum instead of tensor cores) by (rows rounded up to a power of two, output width, input width), from `python -m
# omni_tts.tools.kernel_sweep --quick --rows 1 8 32` on the H200 (weights cold in L2) for the code predictor's shapes
# (both sizes) and the 1.7B talker's (the 0.6B talker's are the predictor's). One-row entries use whole-row tiles (BK
# >= K: under programmatic dependent launch a program's weights all load before it waits for the previous kernel) or,
# for the widest rows, a pipelined loop over pieces of them, and were swept with PDL on, as the engine launches
# one-row steps. Two rows of the predictor's shapes take those entries too; other 2..16 rows their own or the 8-row
# entry (the same 16-row tensor-core tile), 17..32 the 32-row one, 33..128 their own or the 64-row one; untuned
# shapes `config`'s default. The preset key kernel_configs names a JSON of more entries ("rows,n,K": [...]).
Config = tuple[int, int, int, int, bool]
# (n, K): one row (BN, BK, stages, warps), multiply-and-sum; 8 rows and 32 rows (BN, BK, stages), tensor
# cores, 4 warps. The 1.7B talker's gate|up and down one-row entries come from an H100's sweep of the
# one-weight-row and pieced candidates (an H200's may pick others: `kernel-sweep --parts talker --rows 1`), its
# o one-row entry and the predictor's q|k|v 8-row one (whole rows) from an H100's sweeps inside layer steps
_SWEPT: dict[tuple[int, int], tuple[tuple[int, ...], ...]] = {
    (1024, 2048): ((8, 2048, 1, 4), (16, 256, 4), (16, 256, 4)),
    (1024, 3072): ((2, 4096, 1, 8), (16, 256, 4), (16, 256, 4)),
    (2048, 2048): ((4, 2048, 1, 4), (16, 256, 4), (16, 256, 4)),
    (2048, 6144): ((2, 2048, 2, 4), (16, 256, 4), (16, 256, 4)),
    (3072, 1024): ((4, 1024, 1, 4), (32, 256, 3), (16, 256, 3)),
    (4096, 1024): ((8, 1024, 1, 4), (32, 1024, 1), (32, 256, 4)),
    (4096, 2048): ((8, 2048, 1, 4), (32, 256, 4), (32, 256, 3)),
    (6144, 2048): ((2, 2048, 1, 8), (32, 256, 3), (16, 128, 3)),
}
# picked inside whole layer steps (`kernel-sweep --in-layer --rows 2 4 8 16`, an H100), where a frame runs
# them: the isolated sweep misranks candidates there both ways. The predictor's q|k|v from 3 rows on tensor-core
# tiles of whole rows (a program's weights all load before the PDL wait; 8 rows: _SWEPT's entry); the talker's
# two rows each row in turn against whole-row tiles, as at one row
_IN_LAYER: dict[tuple[int, int, int], Config] = {
    (2, 4096, 1024): (4, 1024, 1, 4, True),
    (2, 1024, 2048): (8, 2048, 1, 8, True),
    (4, 4096, 1024): (32, 1024, 1, 4, False),
    (16, 4096, 1024): (32, 1024, 1, 4, False),
    (16, 1024, 2048): (16, 256, 3, 4, False),
    (16, 1024, 3072): (32, 256, 4, 4, False),
    (2, 4096, 2048): (2, 2048, 1, 4, True),
    (2, 2048, 2048): (2, 2048, 1, 4, True),
    (2, 6144, 2048): (2, 2048, 1, 4, True),
    (2, 2048, 6144): (2, 8192, 1, 4, True),
}
# the code predictor's shapes at 64 and 128 rows (BN, BK, stages), tensor cores, 4 warps (`--rows 64 128`, with
# the norms as kernels of their own from NORM_KERNEL_ROWS rows; 128 rows run as two 64-row program columns)
_SWEPT_WIDE: dict[tuple[int, int], tuple[tuple[int, int, int], ...]] = {
    (1024, 2048): ((32, 128, 4), (16, 128, 4)),
    (1024, 3072): ((32, 128, 4), (32, 128, 4)),
    (3072, 1024): ((32, 128, 3), (64, 128, 3)),
    (4096, 1024): ((32, 256, 3), (32, 128, 3)),
}
# the one-row entries also serve two rows of the code predictor's shapes (_SWEPT_WIDE's: each row in turn against
# the whole-row tile, omni_tts.kernels.layers' ROWS; a frame's first step at one request is two positions) unless
# _IN_LAYER has its own; from 4 rows tensor cores win. Keyed by shape, so a 0.6B talker takes the predictor's
TUNED: dict[tuple[int, int, int], Config] = {
    **{(rows, n, k): (bn, bk, st, w, True) for (n, k), ((bn, bk, st, w), _, _) in _SWEPT.items()
       for rows in ((1, 2) if (n, k) in _SWEPT_WIDE else (1,))},
    **{(rows, n, k): (*cfg[i], 4, False) for (n, k), cfg in _SWEPT.items() for rows, i in ((8, 1), (32, 2))},
    **{(rows, n, k): (*cfg[i], 4, False) for (n, k), cfg in _SWEPT_WIDE.items() for rows, i in ((64, 0), (128, 1))},
    **_IN_LAYER,
}


# warps of the sampling kernel (omni_tts.kernels.heads: one program per row; the JSON's "choose_warps" key)
# and the bits of the top-k cut's key it finds per round ("choose_bits": 1, 2, 4 or 8, the same key in
# 32 / bits rounds); each (warps, bits) of 4, 8, 16 x 1, 2 draws what omni_tts.models.sampling.choose draws
CHOOSE_WARPS = 8
CHOOSE_BITS = 2
# rows with top-p 1 find top-k's cut as the k-th largest value (no sort); False: the top-64 sort for every
# row (the JSON's "choose_sort_free" key)
CHOOSE_SORT_FREE = True


def load_configs(path: str) -> None:
    """Add a kernel sweep's JSON (tools/kernel_sweep.py) to the table: the preset key `kernel_configs`."""
    global CHOOSE_WARPS, CHOOSE_SORT_FREE, CHOOSE_BITS
    with open(path) as f:
        for key, value in json.load(f).items():
            if key == "choose_warps":
                CHOOSE_WARPS = int(value)
                continue
            if key == "choose_bits":
                CHOOSE_BITS = int(value)
                continue
            if key == "choose_sort_free":
                CHOOSE_SORT_FREE = bool(value)
                continue
            m, n, k = (int(v) for v in key.split(","))
            TUNED[(m, n, k)] = (int(value[0]), int(value[1]), int(value[2]), int(value[3]), bool(value[4]))


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

