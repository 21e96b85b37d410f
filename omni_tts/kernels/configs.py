"""Launch configs of omni_tts.kernels.layers' projection kernel, per (rows, output width, input width).

Owns: the table swept on an H200 (`TUNED`), extra entries from the JSON that OMNI_TTS_KERNEL_CONFIGS
names (what `python -m omni_tts.tools.kernel_sweep` writes for the GPU at hand), and the lookup with its
fallbacks (`config`). Knows nothing about the kernels' code, models or devices.
"""

from __future__ import annotations

import json
import os

# Triton's CPU interpreter: its cost is per program, so fewer, larger programs there
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


# Launch configs: (BN rows of the weight per program, BK columns per loop step, pipeline stages, warps,
# multiply-and-sum instead of tensor cores) by (rows rounded up to a power of two, output width, input
# width): `python -m omni_tts.tools.kernel_sweep --quick --rows ...` on the H200 (weights cold in L2), the code
# predictor's shapes (both sizes) and the 1.7B talker's (the 0.6B talker's are the predictor's). One row:
# seventh session (2026-11-30, `--rows 1`) with whole-row tiles (BK >= K: under programmatic dependent
# launch a program's weights all load before it waits for the previous kernel), every launch with PDL as
# the engine launches one-row steps: predictor projections 22-43 % faster than the configs they replace,
# talker ones 15-39 % faster than its launches without PDL. 8 and 32 rows: fifth session (`--rows 1 8
# 32`). 2..16 rows take the 8-row entry (the same 16-row tensor-core tile), 17..32 the 32-row one; untuned
# shapes `config`'s default. OMNI_TTS_KERNEL_CONFIGS names a JSON of more entries ("rows,n,K": [...]).
Config = tuple[int, int, int, int, bool]
TUNED: dict[tuple[int, int, int], Config] = {
    (1, 1024, 2048): (8, 2048, 1, 4, True), (1, 1024, 3072): (2, 4096, 1, 8, True),
    (1, 3072, 1024): (4, 1024, 1, 4, True), (1, 4096, 1024): (8, 1024, 1, 4, True),
    (1, 2048, 2048): (4, 2048, 1, 4, True), (1, 2048, 6144): (4, 8192, 1, 8, True),
    (1, 4096, 2048): (8, 2048, 1, 4, True), (1, 6144, 2048): (2, 2048, 1, 4, True),
    (8, 1024, 2048): (16, 256, 4, 4, False), (8, 1024, 3072): (16, 256, 4, 4, False),
    (8, 2048, 2048): (16, 256, 4, 4, False), (8, 2048, 6144): (16, 256, 4, 4, False),
    (8, 3072, 1024): (32, 256, 3, 4, False), (8, 4096, 1024): (32, 256, 3, 4, False),
    (8, 4096, 2048): (32, 256, 4, 4, False), (8, 6144, 2048): (32, 256, 3, 4, False),
    (32, 1024, 2048): (16, 256, 4, 4, False), (32, 1024, 3072): (16, 256, 4, 4, False),
    (32, 2048, 2048): (16, 256, 4, 4, False), (32, 2048, 6144): (16, 256, 4, 4, False),
    (32, 3072, 1024): (16, 256, 3, 4, False), (32, 4096, 1024): (32, 256, 4, 4, False),
    (32, 4096, 2048): (32, 256, 3, 4, False), (32, 6144, 2048): (16, 128, 3, 4, False),
}


# warps of the sampling kernel (omni_tts.kernels.heads: one program per row); the JSON's "choose_warps" key.
# 4: on the H200 (2026-11-30) it drew what omni_tts.models.sampling.choose draws in 1640 of 1640 sampled rows;
# 8 and 16 warps were ~18% faster but drew differently from it, so they are not used
CHOOSE_WARPS = 4
# rows with top-p 1 find top-k's cut as the k-th largest value (no sort); False: the top-64 sort for every
# row (the JSON's "choose_sort_free" key)
CHOOSE_SORT_FREE = True


def _load_configs() -> None:
    global CHOOSE_WARPS, CHOOSE_SORT_FREE
    path = os.environ.get("OMNI_TTS_KERNEL_CONFIGS")
    if path:
        with open(path) as f:
            for key, value in json.load(f).items():
                if key == "choose_warps":
                    CHOOSE_WARPS = int(value)
                    continue
                if key == "choose_sort_free":
                    CHOOSE_SORT_FREE = bool(value)
                    continue
                m, n, k = (int(v) for v in key.split(","))
                TUNED[(m, n, k)] = (int(value[0]), int(value[1]), int(value[2]), int(value[3]), bool(value[4]))


def config(M: int, n: int, K: int) -> Config:
    """Launch config for an [M, K] x [n, K]^T projection: the tuned entry, else a default."""
    if _INTERPRET:
        return max(16, min(128, _next_pow2(n))), 128, 1, 4, M <= 2
    rows = _next_pow2(M)
    for r in (rows, 1 if rows == 1 else 8 if rows <= 16 else 32):
        if (r, n, K) in TUNED:
            return TUNED[(r, n, K)]
    return (8, 512, 3, 4, True) if rows == 1 else (16, 256, 3, 4, False)


_load_configs()
