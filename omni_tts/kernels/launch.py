"""How the hand-written Triton kernels launch: whether Triton (and its grid dependency control) is here,
programmatic dependent launch (`pdl_available`, the in-kernel `after_previous`) and the launch options.

Owns nothing else; every kernel module (omni_tts.kernels.layers, .attention, .talker, .heads) takes these
from here. Runs on CUDA; in Triton's CPU interpreter (TRITON_INTERPRET=1) programmatic dependent launch is off.
"""

from __future__ import annotations

import os
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the engine uses the Inductor path
    triton = None
try:  # grid dependency control (programmatic dependent launch), Triton >= 3.4
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:
    gdc_wait = gdc_launch_dependents = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:
    @triton.jit
    def after_previous(PDL: tl.constexpr):
        """With programmatic dependent launch: wait until the previous kernel is done (its writes visible),
        then let the next kernel launch. Everything before this call may only read what no kernel writes."""
        if PDL:
            gdc_wait()
            gdc_launch_dependents()


def pdl_available(device: torch.device) -> bool:
    """True where programmatic dependent launch can run: a Hopper-or-newer CUDA GPU and a Triton with grid
    dependency control (never in the CPU interpreter)."""
    return (triton is not None and gdc_wait is not None and not INTERPRET and device.type == "cuda"
            and torch.cuda.get_device_capability(device)[0] >= 9)


def launch_options(pdl: bool, warps: int, stages: int | None = None) -> dict[str, Any]:
    opts: dict[str, Any] = {"num_warps": warps}
    if stages is not None:
        opts["num_stages"] = stages
    if pdl:
        opts["launch_pdl"] = True
    return opts
