"""Triton kernels implementing the code predictor's per-codebook work between its layer steps, as
omni_tts.models.code_predictor.CodePredictor.predict_frame does it: the final norm + this codebook's head +
omni_tts.models.sampling.sample_codebook, and the next input (code embedding + `small_to_mtp_projection`).

Owns, for one codebook step of a frame (rows = batch):
  1. the final RMSNorm of each row's last position + this codebook's head -> logits [B, V]
     (omni_tts.kernels.projection's kernel, its rows read with a stride);
  2. the choice of each row's code (`_choose_kernel`, one program per row): greedy rows take the
     argmax, sampled rows the Gumbel-max of the logits warped by temperature, top-k and top-p (rows
     with top-p < 1 from one top-`cap` selection; top-k alone, the checkpoints' default, from the k-th
     largest value, found a key byte at a time from histograms: no sort), with the noise of
     omni_tts.models.sampling.uniform_noise (the same counter-based hash, so a request's draws do not depend on
     the kernels); the chosen code's embedding row is added to the frame's running embedding sum (float32);
  3. in the same kernel, the next step's input: the chosen code's row of the codebook's `fed_table`
     (`small_to_mtp_projection` applied to the whole embedding table once, at set-up).
So a codebook step is two kernels instead of Inductor's ~9 (a sort-based top-k, a radix sort, the
norm's separate reduction). The math is omni_tts.models.sampling.choose / warp_topk's (float32, same order
of cuts); sums run in another order, so a value exactly on a top-p edge or a Gumbel tie could go the
other way in the last bit, as between any two compiled versions. Only for rows whose settings fit a
top-`cap` selection (`sampling.fits_topk`); the caller keeps the sort-based path for the others.
Knows nothing about graphs, buckets or requests. Runs on CUDA; tests run it in Triton's interpreter.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_tts.kernels import configs as kernel_configs
from omni_tts.kernels import layers as kernels
from omni_tts.kernels import projection as proj_kernels
from omni_tts.kernels.configs import next_pow2

if kernels.triton is not None:
    import triton
    import triton.language as tl

    from omni_tts.kernels.projection import after_previous

    @triton.jit
    def _u32(c: tl.constexpr):
        return tl.full([], c, tl.uint32)  # a uint32 constant: arithmetic stays in uint32 and wraps

    @triton.jit
    def _fmix32(h):
        """MurmurHash3's 32-bit finaliser on uint32 values (wrapping multiplies, logical shifts)."""
        h = h ^ (h >> 16)
        h = h * _u32(0x85EBCA6B)
        h = h ^ (h >> 13)
        h = h * _u32(0xC2B2AE35)
        return h ^ (h >> 16)

    @triton.jit
    def _noise(seed, frame, codebook, ids):
        """omni_tts.models.sampling.uniform_noise for one row: U(0,1) float32 at vocab ids [BV] (uint32)."""
        h = _fmix32((seed & 0xFFFFFFFF).to(tl.uint32) ^ _u32(0x9E3779B9))
        h = _fmix32(h ^ ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
        h = _fmix32(h ^ (frame & 0xFFFFFFFF).to(tl.uint32))
        h = _fmix32(h ^ ((codebook + 1) * _u32(1) * _u32(0x27D4EB2F)))
        x = _fmix32(h ^ _fmix32(ids + _u32(0x165667B1)))  # [BV]
        return ((x >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)

    @triton.jit
    def _topp_cut(xt, k, p, CAP: tl.constexpr):
        """sampling.warp_topk's cut for one row: max(k-th largest, the top-p edge), from a top-CAP sort."""
        top = tl.topk(xt, CAP)  # [CAP] descending
        j = tl.arange(0, CAP)
        kth = tl.sum(tl.where(j == tl.maximum(k, 1) - 1, top, 0.0), axis=0)
        kth = tl.where(k <= 0, float("-inf"), kth)  # top-k off: no cut
        m = tl.where(top < kth, float("-inf"), top)
        e = tl.exp(m - tl.max(m, axis=0))
        prob = e / tl.sum(e, axis=0)  # [CAP] over the top-k set
        above = tl.cumsum(prob, axis=0) - prob  # probability strictly above each value
        keep = tl.maximum(tl.sum((above < p).to(tl.int32), axis=0), 1)  # kept prefix length
        edge = tl.sum(tl.where(j == keep - 1, top, 0.0), axis=0)
        edge = tl.where(p >= 1.0, float("-inf"), edge)  # top-p off (this path also serves it when told to sort)
        return tl.maximum(kth, edge)

    @triton.jit
    def _kth_largest(x, xt, k, vm, KEY_BITS: tl.constexpr):
        """The k-th largest value of xt [BV] counted with repeats (sampling.warp_topk's kth; -inf when
        k <= 0: top-k off), without a sort: over the order-preserving keys of x (xt = x / temperature, the
        same order, so the k-th largest of xt is xt at x's k-th), the largest key T with at least k keys >= T,
        a byte a pass: each pass counts the valid keys (vm) that share the prefix found so far in a 256-bin
        histogram of their next byte, and the largest byte value with at least k keys at or above it extends
        the prefix. KEY_BITS: the key's top bits that can differ (16 for bfloat16 logits, whose float32 bits
        end in 16 zeros: two passes instead of four)."""
        bits = tl.where(x == 0.0, 0.0, x).to(tl.uint32, bitcast=True)  # -0.0 as +0.0: keys order as floats
        key = tl.where((bits >> 31) != 0, bits ^ _u32(0xFFFFFFFF), bits | _u32(0x80000000))  # [BV]
        key = key >> (32 - KEY_BITS)
        j = tl.arange(0, 256)
        t = tl.full([], 0, tl.uint32)
        above = tl.full([], 0, tl.int32)  # keys above the prefix found so far
        for s in tl.static_range(KEY_BITS // 8):
            shift = KEY_BITS - 8 * (s + 1)
            under = vm
            if s > 0:  # the keys that share the prefix
                under = vm & ((key >> (shift + 8)) == (t >> (shift + 8)))
            h = tl.histogram(((key >> shift) & 255).to(tl.int32), 256, mask=under)  # [256]
            at_or_above = tl.sum(h, axis=0) - tl.cumsum(h, axis=0) + h
            d = tl.max(tl.where(above + at_or_above >= k, j, 0), axis=0)
            above += tl.sum(tl.where(j == d, at_or_above - h, 0), axis=0)
            t = t | (d.to(tl.uint32) << shift)
        kth = tl.max(tl.where(key == t, xt, float("-inf")), axis=0)
        return tl.where(k <= 0, float("-inf"), kth)

    @triton.jit(do_not_specialize=["codebook"])  # one kernel for all codebooks (1 would be a constant)
    def _choose_kernel(logits_ptr, greedy_ptr, temp_ptr, topk_ptr, topp_ptr, seed_ptr, frame_ptr, codebook,
                       table_ptr, esum_ptr, code_ptr, fed_ptr, next_ptr, V: tl.constexpr, D: tl.constexpr,
                       BV: tl.constexpr, CAP: tl.constexpr, BD: tl.constexpr, DN: tl.constexpr, BDN: tl.constexpr,
                       FED: tl.constexpr, SAMPLE: tl.constexpr, SORT_BELOW: tl.constexpr,
                       KEY_BITS: tl.constexpr, PDL: tl.constexpr):
        """Program b: code_ptr[b] = this row's code (see the module docstring); esum[b] += table[code];
        with FED, next[b] = fed[code] (the next step's input, [DN])."""
        b = tl.program_id(0)
        i = tl.arange(0, BV)
        vm = i < V
        if SAMPLE:  # the noise depends on the slot's seed and frame only (set before the frame): before the wait
            gumbel = -tl.log(-tl.log(_noise(tl.load(seed_ptr + b), tl.load(frame_ptr + b), codebook, i.to(tl.uint32))))
        after_previous(PDL)
        x = tl.load(logits_ptr + b * V + i, mask=vm, other=float("-inf")).to(tl.float32)  # [BV]
        pick = tl.argmax(x, axis=0)  # greedy: the first largest
        if SAMPLE:
            xt = x / tl.load(temp_ptr + b)
            k = tl.minimum(tl.load(topk_ptr + b), CAP)
            p = tl.load(topp_ptr + b)
            if p < SORT_BELOW:  # top-p needs the top-k set in order (SORT_BELOW: 1, or inf to always sort)
                cut = _topp_cut(xt, k, p, CAP)
            else:  # top-k alone (the checkpoints' default) needs only the k-th largest value
                cut = _kth_largest(x, xt, k, vm, KEY_BITS)
            warped = tl.where(xt < cut, float("-inf"), xt) + gumbel
            drawn = tl.argmax(tl.where(vm, warped, float("-inf")), axis=0)
            pick = tl.where(tl.load(greedy_ptr + b) != 0, pick, drawn)
        tl.store(code_ptr + b, pick.to(tl.int64))
        d = tl.arange(0, BD)
        dm = d < D
        row = tl.load(table_ptr + pick.to(tl.int64) * D + d, mask=dm, other=0.0).to(tl.float32)
        acc = tl.load(esum_ptr + b * D + d, mask=dm, other=0.0)
        tl.store(esum_ptr + b * D + d, acc + row, mask=dm)
        if FED:
            dn = tl.arange(0, BDN)
            nm = dn < DN
            tl.store(next_ptr + b * DN + dn, tl.load(fed_ptr + pick.to(tl.int64) * DN + dn, mask=nm), mask=nm)


def head_choose(norm: Any, head: Any, x: torch.Tensor, sp: Any, seed: torch.Tensor, frame: torch.Tensor,
                codebook: int, table: torch.Tensor, esum: torch.Tensor, pdl: bool = False,
                fed: torch.Tensor | None = None, w_folded: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """CodePredictor's final norm + lm_head[codebook - 1] on the last position, then sampling.sample_codebook,
    + the code's embedding added to esum, for rows that `fits_topk(sp.topk_cap)` (or all greedy). x: [B, T, d]
    (the last position is used); table: this codebook's embedding [V, D]; esum: [B, D] float32 (updated);
    fed: `fed_table` of this codebook; w_folded: the head's weight with the norm's folded in, which batches of
    kernel_configs.FOLD_ROWS rows or more take. -> (codes [B] int64, the next input fed[codes] [B, 1, d] or None)"""
    logits = proj_kernels.normed_projection(x[:, -1], head.weight, norm, n=head.weight.shape[0], pdl=pdl,
                                       w_folded=w_folded)  # [B, V]
    return choose(logits, sp, seed, frame, codebook, table, esum, pdl, fed)


def choose(logits: torch.Tensor, sp: Any, seed: torch.Tensor, frame: torch.Tensor, codebook: int,
           table: torch.Tensor, esum: torch.Tensor, pdl: bool = False, fed: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The choice kernel alone: sampling.choose(logits.float(), ...) for rows that `fits_topk(sp.topk_cap)`,
    plus table[code] added to esum [B, D] (float32) and, with `fed` [V, d], the next input fed[code].
    logits: [B, V] -> (codes [B] int64, [B, 1, d] or None)"""
    B, V = logits.shape
    D = table.shape[1]
    code = torch.empty(B, dtype=torch.long, device=logits.device)
    nxt = torch.empty(B, 1, fed.shape[1], dtype=fed.dtype, device=logits.device) if fed is not None else None
    DN = fed.shape[1] if fed is not None else 1
    sample = not sp.all_greedy
    sort_below = 1.0 if kernel_configs.CHOOSE_SORT_FREE else float("inf")  # inf: every row takes the sort
    _choose_kernel[(B,)](logits, sp.greedy, sp.temperature, sp.top_k, sp.top_p, seed, frame, codebook, table, esum,
                         code, fed if fed is not None else table, nxt if nxt is not None else esum,
                         V=V, D=D, BV=next_pow2(V), CAP=min(next_pow2(sp.topk_cap or 1), next_pow2(V)),
                         BD=next_pow2(D), DN=DN, BDN=next_pow2(DN), FED=fed is not None, SAMPLE=sample,
                         SORT_BELOW=sort_below, KEY_BITS=key_bits(logits.dtype), PDL=pdl,
                         **proj_kernels.launch_options(pdl, kernel_configs.CHOOSE_WARPS))
    return code, nxt


def key_bits(dtype: torch.dtype) -> int:
    """The top-k cut's key width for logits of this dtype: bfloat16 is float32's top 16 bits."""
    return 16 if dtype == torch.bfloat16 else 32


@torch.no_grad()
def fed_table(table: torch.Tensor, proj: Any) -> torch.Tensor:
    """The next step's input for every code of a codebook, computed once: `proj(table)` [V, d]
    (`small_to_mtp_projection`: a Linear, or an Identity, which gives the table itself). Folds the feed
    projection of every codebook step into the choice kernel's gather, for V x d more weights."""
    if not isinstance(proj, torch.nn.Linear):
        return table
    return torch.nn.functional.linear(table, proj.weight, proj.bias)


def supports(sp: Any, rows: int, vocab: int) -> bool:
    """True when these kernels can choose for `rows` rows with these sampling hints."""
    return (kernels.triton is not None and rows <= kernels.MAX_ROWS
            and (sp.all_greedy or 0 < sp.topk_cap <= vocab))


def probe(cp: Any, batches: list[int], max_rows: int, cap: int, pdl: bool = False) -> str:
    """Run the head, choice (sampled variant, top-`cap`) and feed kernels of the code predictor `cp` once per
    batch of at most max_rows rows (`kernels.run_probe`): "" or the first error in one line (the caller
    then keeps the compiled head)."""
    from omni_tts.models.sampling import SlotParams

    dev = cp.norm.weight.device
    table = cp.codec_embedding[0].weight

    def build() -> str:
        fed = fed_table(table, cp.small_to_mtp_projection)
        for b in (b for b in batches if b <= max_rows):
            sp = SlotParams.zeros(b, dev).rows(b, topk_cap=cap)
            x = torch.zeros(b, 1, cp.hidden_size, device=dev, dtype=cp.norm.weight.dtype)
            esum = torch.zeros(b, table.shape[1], device=dev)
            idx = torch.zeros(b, dtype=torch.long, device=dev)
            for f in (fed, None):  # a step that feeds the next one, and the frame's last step
                head_choose(cp.norm, cp.lm_head[0], x, sp, idx, idx, 1, table, esum, pdl, f,
                            cp.lm_head[0].weight)  # the folded form's kernels from FOLD_ROWS rows
        return ""

    return kernels.run_probe(dev, build)
