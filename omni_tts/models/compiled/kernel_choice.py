"""Which hand-written Triton kernels a compiled path runs (`KernelChoice`, a base of FastPath): chosen
once, when the engine sets up the GPU, by building each kernel group for every batch a capture will use.

Owns the row limits per kernel group (predictor layers, predictor heads, talker layers: its rows on the
kernels and under PDL from omni_tts.kernels.configs, which a configs JSON may set) and whether they launch
with programmatic dependent launch; where a group cannot be built on this GPU, Inductor's
kernels serve instead and a notice says why. Knows nothing about requests, graphs or modes.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, MutableMapping
from typing import Any

import torch

from omni_tts.kernels import configs as kernel_configs
from omni_tts.kernels import heads as head_kernels
from omni_tts.kernels import layers as kernels
from omni_tts.kernels import projection as proj_kernels
from omni_tts.kernels import talker as talker_kernels
from omni_tts.models import sampling
from omni_tts.models.compiled.packed_weights import fold_norm
from omni_tts.models.precision import exact

MAX_PREDICTOR_ROWS = kernels.MAX_ROWS  # predictor steps of at most this many rows run the Triton layers
# the talker's attention as a Triton kernel over kv lengths up to TALKER_ATTEND_LEN (SDPA above, where it was
# not measured), for steps of up to TALKER_ATTEND_ROWS rows (past kernel_configs.TALKER_KERNEL_ROWS: after the
# compiled unit)
TALKER_ATTEND_LEN = 1025
TALKER_ATTEND_ROWS = 64


def limits() -> tuple[int, ...]:
    """The limits above, the folded norms' rows and the talker's kernel and PDL rows (kernel_configs', which a
    configs JSON may set): a kept probe outcome holds for the same ones only."""
    return (MAX_PREDICTOR_ROWS, kernel_configs.FOLD_ROWS, kernel_configs.TALKER_KERNEL_ROWS,
            kernel_configs.TALKER_PDL_ROWS, TALKER_ATTEND_LEN, TALKER_ATTEND_ROWS)


_FED: weakref.WeakKeyDictionary[Any, list[torch.Tensor]] = weakref.WeakKeyDictionary()
_FOLDED: weakref.WeakKeyDictionary[Any, list[tuple]] = weakref.WeakKeyDictionary()
_FOLDED_HEADS: weakref.WeakKeyDictionary[Any, list[torch.Tensor]] = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()  # modes warm on threads of their own


def made_once(cache: MutableMapping[Any, Any], key: Any, make: Callable[[], Any], device: torch.device) -> Any:
    """cache[key], made by `make` at the first call (outside any capture: the first call is a warm-up step) and
    shared by every mode's path; `device`: where `make` writes, waited for before another thread may read it."""
    with _SHARED_LOCK:
        if key not in cache:
            value = make()
            if device.type == "cuda":  # written before any stream of another thread reads them
                torch.cuda.current_stream(device).synchronize()
            cache[key] = value
        return cache[key]


def fed_tables(cp: Any) -> list[torch.Tensor]:
    """`heads.fed_table` of every codebook whose code feeds a next step (all but the last)."""
    def make() -> list[torch.Tensor]:
        with exact(cp.norm.weight.device):  # float32 tables as the feed unit computes them, not in TF32
            return [head_kernels.fed_table(e.weight, cp.small_to_mtp_projection) for e in cp.codec_embedding[:-1]]
    return made_once(_FED, cp, make, cp.norm.weight.device)


def folded_layers(cp: Any, packed: list[tuple]) -> list[tuple]:
    """Per predictor layer, its packed q|k|v and gate|up (`packed`: fuse_layer's) with the input and
    post-attention norms' weights folded in (`fold_norm`), as its Triton layers take them from FOLD_ROWS rows."""
    return made_once(_FOLDED, cp, lambda: [
        (fold_norm(w_qkv, layer.input_layernorm), fold_norm(w_gu, layer.post_attention_layernorm))
        for layer, (w_qkv, _, w_gu) in zip(cp.layers, packed)], cp.norm.weight.device)


def folded_heads(cp: Any) -> list[torch.Tensor]:
    """Every codebook head's weight with the final norm's weight folded in, as omni_tts.kernels.heads takes it."""
    return made_once(_FOLDED_HEADS, cp, lambda: [fold_norm(head.weight, cp.norm) for head in cp.lm_head],
                     cp.norm.weight.device)


class KernelChoice:
    """The kernel choice of one compiled path; its subclass provides `model`, `talker_w`, `predictor_w`,
    `cos` and `sin`. All limits 0 (Inductor's kernels everywhere) until `use_kernels`."""

    kernel_rows = 0  # predictor steps of at most this many rows (batch x positions) run omni_tts.kernels.layers
    talker_kernel_rows = 0  # the same for talker steps
    talker_attend_len = 0  # talker steps over at most this many cache positions run the Triton attention
    talker_attend_rows = 0  # ...steps of at most this many rows (or of at most talker_kernel_rows)
    head_kernel_rows = 0  # and for the predictor's per-codebook head, choice and feed (rows = batch)
    kernel_pdl = False  # the predictor's kernels launched with programmatic dependent launch
    talker_pdl_rows = 0  # the talker's, for steps of at most this many rows
    # the choice above, as use_kernels' probes decide it (what a kept probe outcome restores)
    CHOICE = ("kernel_rows", "talker_kernel_rows", "talker_attend_len", "talker_attend_rows", "head_kernel_rows",
              "kernel_pdl", "talker_pdl_rows")
    model: Any
    talker_w: list
    predictor_w: list
    cos: torch.Tensor
    sin: torch.Tensor

    def use_kernels(self, on: bool, batches: list[int], kv_lens: list[int], dtype: torch.dtype,
                    between: Callable[[], None] = lambda: None) -> str:
        """Choose the hand-written Triton kernels when `on` (default+cudagraph on CUDA): predictor layers and
        heads, talker layers, talker attention, and whether the predictor's launch with programmatic
        dependent launch; each group is built now for every batch (and kv length) a capture will use, and
        where one cannot be, Inductor's kernels (or SDPA) do.
        -> '' or a notice saying what was turned off and why."""
        on = on and kernels.available()
        self.kernel_rows = MAX_PREDICTOR_ROWS if on else 0
        self.talker_kernel_rows = kernel_configs.TALKER_KERNEL_ROWS if on else 0
        self.talker_attend_len = TALKER_ATTEND_LEN if on else 0
        self.talker_attend_rows = TALKER_ATTEND_ROWS if on else 0
        self.kernel_pdl = on and proj_kernels.pdl_available(self.model.device)
        self.talker_pdl_rows = kernel_configs.TALKER_PDL_ROWS if self.kernel_pdl else 0
        self.head_kernel_rows = 0
        notices = []
        if self.talker_kernel_rows:
            err, self.talker_pdl_rows = _probe_pdl(lambda pdl: talker_kernels.probe(
                self.model.talker.layers[0], self.talker_w[0], batches, self.talker_kernel_rows,
                dtype, pdl), self.talker_pdl_rows, 0)
            if err:
                self.talker_kernel_rows, self.talker_pdl_rows, self.talker_attend_len = 0, 0, 0
                notices.append(f"Triton talker kernels unavailable on this GPU ({err}); using Inductor's and SDPA")
            elif err := talker_kernels.probe_attend(self.model.talker.layers[0], batches, self.talker_attend_rows,
                                                    dtype):
                self.talker_attend_rows = 0
                notices.append(f"Triton talker attention unavailable past {self.talker_kernel_rows} rows ({err})")
        if self.kernel_rows:
            between()
            notices.append(self._use_predictor_kernels(batches, between))
        return "; ".join(n for n in notices if n)

    def _use_predictor_kernels(self, batches: list[int], between: Callable[[], None]) -> str:
        """Probe the predictor's layer kernels (with PDL, else without), then its head kernels."""
        cp = self.model.code_predictor
        # the folded copies made here, before any capture reads them, and only where a step is that wide (a
        # frame's first step has two positions a row; a head's rows are the batch)
        widest = max(batches, default=0)
        folded = None
        if min(self.kernel_rows, 2 * widest) >= kernel_configs.FOLD_ROWS:
            folded = folded_layers(cp, self.predictor_w)[0]
        if min(self.kernel_rows, widest) >= kernel_configs.FOLD_ROWS:
            folded_heads(cp)
        args = (cp.layers[0], self.predictor_w[0], self.cos, self.sin, batches, self.kernel_rows)
        err, self.kernel_pdl = _probe_pdl(lambda pdl: kernels.probe(*args, pdl, folded), self.kernel_pdl, False)
        if err:
            self.kernel_rows = 0
            return f"Triton predictor kernels unavailable on this GPU ({err}); using Inductor's"
        self.head_kernel_rows = self.kernel_rows
        between()
        err = head_kernels.probe(cp, batches, self.head_kernel_rows, sampling.TOPK_CAP, self.kernel_pdl)
        if err and self.kernel_pdl and not head_kernels.probe(cp, batches, self.head_kernel_rows,
                                                              sampling.TOPK_CAP, False):
            self.kernel_pdl = False  # the heads build without programmatic dependent launch: all go without it
            err = ""
        if err:
            self.head_kernel_rows = 0
            return f"Triton predictor head kernels unavailable on this GPU ({err}); using Inductor's"
        return ""

    def kernels_report(self) -> str:
        """One line: which kernels run the predictor's and the talker's layers (for the engine panel)."""
        if not (self.kernel_rows or self.talker_kernel_rows):
            return "Inductor kernels"
        pdl = ", predictor with programmatic dependent launch" if self.kernel_pdl else ""
        if self.kernel_pdl and self.talker_kernel_rows and self.talker_pdl_rows:
            pdl += f" (talker: up to {min(self.talker_pdl_rows, self.talker_kernel_rows)} rows)"
        head = " (+ heads and sampling)" if self.head_kernel_rows else ""
        rows = max(self.talker_attend_rows, self.talker_kernel_rows)
        attend = f" (attention: {rows} rows, {self.talker_attend_len} positions)" if self.talker_attend_len else ""
        return (f"Triton kernels up to {self.kernel_rows} predictor rows{head} / {self.talker_kernel_rows} talker "
                f"rows{attend}{pdl}, Inductor above")


def _probe_pdl(probe: Callable[[Any], str], pdl: Any, off: Any) -> tuple[str, Any]:
    """probe(pdl), and where that fails with programmatic dependent launch on, once more with `off`
    -> (the last error or '', the PDL setting it ran with)."""
    err = probe(pdl)
    if err and pdl:
        pdl = off
        err = probe(off)
    return err, pdl
