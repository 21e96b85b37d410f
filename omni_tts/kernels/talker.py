"""Triton kernels implementing the talker's omni_tts.models.layers.DecoderLayer (omni_tts.models.talker), one
new token per row, at small batch.

Owns: the talker layer around its attention in five kernels (norm + q|k|v, then q/k norm + rope with
K/V written at each row's own cache position; o + residual, norm + gate|up + SiLU, down + residual:
the projection kernel of omni_tts.kernels.projection), and the attention itself folded into the second
(`talker_attend`: one program per row and query head reads the cache positions up to its row's own;
where rows x heads leave SMs idle, several programs share them and a small kernel joins their softmaxes),
so the reference's attention call between them drops out where the caller chooses it.
Numerics follow the references to the dtype's rounding (float32 accumulation; the order of sums
differs). Knows nothing about graphs, buckets or requests; which batches use the kernels is the
caller's choice. Runs on CUDA; tests run it in Triton's CPU interpreter against the references.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from omni_tts.kernels import configs as kernel_configs
from omni_tts.kernels import layers as kernels
from omni_tts.kernels import projection as proj_kernels
from omni_tts.kernels.configs import next_pow2
from omni_tts.kernels.projection import _INTERPRET

ATTEND_BLOCK = 128  # cache positions per step of the attention kernel's loop
ATTEND_WARPS = 8
# steps of at most EARLY_ROWS rows whose attention runs at most EARLY_PROGRAMS programs (rows x heads x splits)
# load the cache's first block before their wait: more programs' loads there slowed the q|k|v projection they overlap
EARLY_ROWS = 1
EARLY_PROGRAMS = 64
COMBINE_WARPS = 2

if kernels.triton is not None:
    import triton
    import triton.language as tl

    from omni_tts.kernels.layers import lanes, normed_rope, rope_row, store_kv
    from omni_tts.kernels.projection import after_previous

    @triton.jit
    def _rope_cache_kernel(y_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, kc_ptr, vc_ptr, q_ptr, eps,
                           kc_row, kc_head, H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr,
                           BD: tl.constexpr, PDL: tl.constexpr):
        """Program (row b, KV head g) of a one-token talker step: K/V of head g normed + rotated into the
        cache at the row's own position pos[b]; the query heads sharing g normed + rotated into q [B, H, HD].
        y: [B, (H+2HKV)*HD]; cos/sin: [B, HD] (each row's position); kc/vc: [B, HKV, M, HD] strided."""
        dt = q_ptr.dtype.element_ty
        b, g, d, dm = lanes(HD, BD)
        REP: tl.constexpr = H // HKV
        HALF: tl.constexpr = HD // 2
        W: tl.constexpr = (H + 2 * HKV) * HD
        after_previous(PDL)
        cos, sin = rope_row(cos_ptr, sin_ptr, b * HD, d, dm)
        row = y_ptr + b * W
        at = b * kc_row + g * kc_head + tl.load(pos_ptr + b) * HD + d
        store_kv(row, g, kn_ptr, cos, sin, eps, kc_ptr + at, vc_ptr + at, d, dm, dm, H, HKV, HD, dt)
        for r in tl.static_range(REP):
            h = g * REP + r
            q = normed_rope(row + h * HD, d, dm, HALF, HD, qn_ptr, cos, sin, eps, dt)
            tl.store(q_ptr + (b * H + h) * HD + d, q.to(dt), mask=dm)


    @triton.jit
    def _split_start(CH: tl.constexpr, S: tl.constexpr):
        """The first cache position of this program's split (program axis 2) of CH positions."""
        if S == 1:
            return 0
        else:
            return tl.program_id(2) * CH

    @triton.jit
    def _cached(kc_at, vc_at, p, pos, d, dm, HD: tl.constexpr, FRESH: tl.constexpr):
        """The cache's K/V at positions p [BL] up to pos (FRESH: below it, being written) -> float32 [BL, BD] x 2."""
        cached = ((p < pos) if FRESH else (p <= pos))[:, None] & dm[None, :]
        kk = tl.load(kc_at + p[:, None] * HD + d[None, :], mask=cached, other=0.0).to(tl.float32)
        vv = tl.load(vc_at + p[:, None] * HD + d[None, :], mask=cached, other=0.0).to(tl.float32)
        return kk, vv

    @triton.jit
    def _attend_block(q, k, v, kk, vv, p, pos, acc, m_i, l_i, scale, S: tl.constexpr, FRESH: tl.constexpr):
        """The online softmax's update by one block of positions p [BL] (kk/vv: their K/V from `_cached`; FRESH:
        position pos is k/v) -> (acc, m_i, l_i)"""
        if FRESH:
            kk = tl.where((p == pos)[:, None], k[None, :], kk)
            vv = tl.where((p == pos)[:, None], v[None, :], vv)
        s = tl.where(p <= pos, tl.sum(q[None, :] * kk, axis=1) * scale, float("-inf"))  # [BL]
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        m_at = m_new
        if S > 1:  # a split wholly past pos has no position: no NaN from -inf - -inf
            m_at = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_at)
        e = tl.exp(s - m_at)
        l_i = l_i * alpha + tl.sum(e, axis=0)
        acc = acc * alpha + tl.sum(e[:, None] * vv, axis=0)
        return acc, m_new, l_i

    @triton.jit
    def _attend_loop(q, k, v, kk0, vv0, pos, kc_at, vc_at, d, dm, scale, HD: tl.constexpr, BL: tl.constexpr,
                     CH: tl.constexpr, S: tl.constexpr, FRESH: tl.constexpr, TO_POS: tl.constexpr,
                     GIVEN: tl.constexpr):
        """q's causal attention (float32 [BD]) over this program's split of one KV head's cache positions
        0..pos (kc_at/vc_at: its position 0, positions HD apart): positions [s CH, (s+1) CH) for split s
        (program axis 2), in blocks of BL with an online softmax; GIVEN: the first block's K/V are kk0/vv0
        (`_cached`, which a kernel may load before its wait), else unused; TO_POS: the blocks up to the one holding pos
        (a row's cost follows its own position, not the bucket's; a padded row's, past the bucket, stops at its
        split's end), else all of the split's (a block past pos reads nothing). FRESH: position pos is k/v
        (float32 [BD], being written by another program), not the cache's. -> (unnormed output [BD], running
        max, softmax sum): max -inf and sum 0 for a split wholly past pos"""
        lo = _split_start(CH, S)
        m_i = tl.full([], float("-inf"), tl.float32)
        l_i = tl.full([], 0.0, tl.float32)
        acc = tl.zeros(q.shape, tl.float32)
        if GIVEN:
            acc, m_i, l_i = _attend_block(q, k, v, kk0, vv0, lo + tl.arange(0, BL), pos, acc, m_i, l_i, scale, S, FRESH)
        # to the split's end at most: a padded row sits at the scratch position past every bucket (inline: the
        # interpreter makes a local a tensor)
        for start in range(BL if GIVEN else 0, tl.minimum(pos + 1, lo + CH) - lo if TO_POS else CH, BL):
            p = lo + start + tl.arange(0, BL)
            kk, vv = _cached(kc_at, vc_at, p, pos, d, dm, HD, FRESH)
            acc, m_i, l_i = _attend_block(q, k, v, kk, vv, p, pos, acc, m_i, l_i, scale, S, FRESH)
        return acc, m_i, l_i

    @triton.jit
    def _attend_store(acc, m_i, l_i, a_ptr, pm_ptr, pl_ptr, b, h, d, dm, H: tl.constexpr, HD: tl.constexpr,
                      S: tl.constexpr):
        """One split's output: normed into a [B, H, HD] when it is the only split, else unnormed into the
        partials a [B, H, S, HD] float32 with its max and sum into pm/pl [B, H, S] (`_combine_kernel`)."""
        if S == 1:
            tl.store(a_ptr + (b * H + h) * HD + d, (acc / l_i).to(a_ptr.dtype.element_ty), mask=dm)
        else:
            at = (b * H + h) * S + tl.program_id(2)
            tl.store(a_ptr + at * HD + d, acc, mask=dm)
            tl.store(pm_ptr + at, m_i)
            tl.store(pl_ptr + at, l_i)

    @triton.jit
    def _combine_kernel(po_ptr, pm_ptr, pl_ptr, a_ptr, H: tl.constexpr, HD: tl.constexpr, BD: tl.constexpr,
                        S: tl.constexpr, BS: tl.constexpr, PDL: tl.constexpr):
        """Program (row b, query head h): its S splits' partial attentions rescaled to their common max and
        summed -> a [B, H, HD]."""
        b, h, d, dm = lanes(HD, BD)
        after_previous(PDL)
        s = tl.arange(0, BS)
        at = (b * H + h) * S + s
        m = tl.load(pm_ptr + at, mask=s < S, other=float("-inf"))  # [BS]
        w = tl.exp(m - tl.max(m, axis=0))  # split 0 always holds position 0: the max is finite
        l_sum = tl.sum(w * tl.load(pl_ptr + at, mask=s < S, other=0.0), axis=0)
        po = tl.load(po_ptr + at[:, None] * HD + d[None, :], mask=(s < S)[:, None] & dm[None, :], other=0.0)
        o = tl.sum(w[:, None] * po, axis=0) / l_sum
        tl.store(a_ptr + (b * H + h) * HD + d, o.to(a_ptr.dtype.element_ty), mask=dm)

    @triton.jit
    def _rope_attend_kernel(y_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, kc_ptr, vc_ptr, a_ptr, pm_ptr, pl_ptr,
                            eps, scale, kc_row, kc_head, H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr,
                            BD: tl.constexpr, BL: tl.constexpr, CH: tl.constexpr, S: tl.constexpr,
                            PDL: tl.constexpr, TO_POS: tl.constexpr, EARLY: tl.constexpr):
        """Program (row b, query head h, split s) of a one-token talker step: K/V of h's KV head normed + rotated
        into the cache at the row's position pos[b] (by the first query head sharing it, in split 0), then h's
        causal attention over split s's cache positions of 0..pos[b] (`_attend_loop`; the new position's
        K/V from y, not from the cache being written) -> a [B, H, HD], or with S > 1 the partials
        (`_attend_store`). y: [B, (H+2HKV)*HD]; cos/sin: [B, HD]."""
        dt = kc_ptr.dtype.element_ty
        b, h = tl.program_id(0), tl.program_id(1)
        REP: tl.constexpr = H // HKV
        W: tl.constexpr = (H + 2 * HKV) * HD
        g = h // REP
        d = tl.arange(0, BD)
        dm = d < HD
        # EARLY: positions, rope rows and the cache's earlier positions, which kernels before the q|k|v projection
        # (the last one) wrote, load before the wait, so the cache's first block arrives while it runs
        if EARLY:
            cos, sin = rope_row(cos_ptr, sin_ptr, b * HD, d, dm)
            pos = tl.load(pos_ptr + b)
            head = b * kc_row + g * kc_head
            kk0, vv0 = _cached(kc_ptr + head, vc_ptr + head, _split_start(CH, S) + tl.arange(0, BL), pos, d, dm, HD,
                               True)
        after_previous(PDL)
        if not EARLY:
            cos, sin = rope_row(cos_ptr, sin_ptr, b * HD, d, dm)
        row = y_ptr + b * W
        if not EARLY:
            pos = tl.load(pos_ptr + b)
            head = b * kc_row + g * kc_head
            kk0, vv0 = cos, sin  # unused: the loop loads every block itself
        writes = dm & (h % REP == 0)
        if S > 1:
            writes = writes & (tl.program_id(2) == 0)
        k, v = store_kv(row, g, kn_ptr, cos, sin, eps, kc_ptr + head + pos * HD + d, vc_ptr + head + pos * HD + d, d,
                        dm, writes, H, HKV, HD, dt)
        q = normed_rope(row + h * HD, d, dm, HD // 2, HD, qn_ptr, cos, sin, eps, dt)
        acc, m_i, l_i = _attend_loop(q, k, v.to(tl.float32), kk0, vv0, pos, kc_ptr + head, vc_ptr + head, d, dm, scale,
                                     HD, BL, CH, S, True, TO_POS, EARLY)
        _attend_store(acc, m_i, l_i, a_ptr, pm_ptr, pl_ptr, b, h, d, dm, H, HD, S)

    @triton.jit
    def _attend_kernel(q_ptr, pos_ptr, kc_ptr, vc_ptr, a_ptr, pm_ptr, pl_ptr, scale, q_row, q_head, kc_row, kc_head,
                       H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, BD: tl.constexpr, BL: tl.constexpr,
                       CH: tl.constexpr, S: tl.constexpr, TO_POS: tl.constexpr):
        """Program (row b, query head h, split s): q[b, h]'s causal attention over split s's share of its KV
        head's cache positions 0..pos[b], the new position already in the cache -> a [B, H, HD], or with
        S > 1 the partials (`_attend_store`)."""
        b, h = tl.program_id(0), tl.program_id(1)
        d = tl.arange(0, BD)
        dm = d < HD
        pos = tl.load(pos_ptr + b)
        head = b * kc_row + (h // (H // HKV)) * kc_head
        q = tl.load(q_ptr + b * q_row + h * q_head + d, mask=dm, other=0.0).to(tl.float32)
        acc, m_i, l_i = _attend_loop(q, q, q, q, q, pos, kc_ptr + head, vc_ptr + head, d, dm, scale, HD, BL, CH, S,
                                     False, TO_POS, False)
        _attend_store(acc, m_i, l_i, a_ptr, pm_ptr, pl_ptr, b, h, d, dm, H, HD, S)


def _qkv(layer: Any, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None, x: torch.Tensor, kc: torch.Tensor,
         vc: torch.Tensor, pdl: bool) -> torch.Tensor:
    """Input norm + q|k|v of x [B, 1, D] (one kernel), after checking the cache layout the rope kernels
    assume (kc/vc: [B, Hkv, M, hd], last two dims contiguous). -> y [B, (H+2Hkv) hd]"""
    a, (B, _, D) = layer.self_attn, x.shape
    assert kc.stride() == vc.stride() and kc.stride(3) == 1 and kc.stride(2) == a.head_dim
    return proj_kernels.projection(x.reshape(B, D), w_qkv, n=(a.heads + 2 * a.kv_heads) * a.head_dim, bias=b_qkv,
                              norm=layer.input_layernorm, pdl=pdl)


def talker_attn_in(layer: Any, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None, x: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor,
                   pdl: bool = False) -> torch.Tensor:
    """The DecoderLayer before its attention (rows 0..B-1) in two kernels: input norm + q|k|v, then q/k norm +
    rope (Attention.qkv) and K/V written at each row's position. x: [B, 1, D]; cos/sin: [B, 1, hd]; kc/vc:
    [B, Hkv, M, hd] (last two dims contiguous); pos: [B]. -> q [B, H, 1, hd]"""
    attn, y = layer.self_attn, _qkv(layer, w_qkv, b_qkv, x, kc, vc, pdl)  # y: [B, (H+2Hkv) hd]
    B, H, Hkv, hd = x.shape[0], attn.heads, attn.kv_heads, attn.head_dim
    q = torch.empty(B, H, 1, hd, device=x.device, dtype=x.dtype)  # [B, H, 1, hd]
    _rope_cache_kernel[(B, Hkv)](y, attn.q_norm.weight, attn.k_norm.weight, cos.contiguous(), sin.contiguous(),
                                 pos, kc, vc, q, float(attn.q_norm.eps), kc.stride(0), kc.stride(1), H=H, HKV=Hkv,
                                 HD=hd, BD=next_pow2(hd), PDL=pdl, **proj_kernels.launch_options(pdl, 1))
    return q


def talker_attend(layer: Any, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None, x: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor, kv_len: int,
                  pdl: bool = False, splits: int | None = None) -> torch.Tensor:
    """The DecoderLayer up to its attention output (rows 0..B-1) in two kernels (three where the positions are
    split, `_split`): input norm + q|k|v, then q/k norm + rope, K/V written at each row's position and the
    causal attention over positions 0..pos (as gqa_attention over the first kv_len positions). x: [B, 1, D];
    cos/sin: [B, 1, hd]; kc/vc: [B, Hkv, M, hd] (last two dims contiguous); pos: [B], each below kv_len.
    -> a [B, H, 1, hd]"""
    attn, y = layer.self_attn, _qkv(layer, w_qkv, b_qkv, x, kc, vc, pdl)  # y: [B, (H+2Hkv) hd]
    B, H, Hkv, hd = x.shape[0], attn.heads, attn.kv_heads, attn.head_dim
    S, CH = _split(B, H, kv_len, x.device, splits)
    a, po, pm, pl = _outputs(B, H, hd, S, x)
    _rope_attend_kernel[(B, H, S)](y, attn.q_norm.weight, attn.k_norm.weight, cos.contiguous(), sin.contiguous(),
                                   pos, kc, vc, po, pm, pl, float(attn.q_norm.eps), hd ** -0.5, kc.stride(0),
                                   kc.stride(1), H=H, HKV=Hkv, HD=hd, BD=next_pow2(hd), BL=ATTEND_BLOCK,
                                   CH=CH, S=S, PDL=pdl, TO_POS=_to_pos(CH), EARLY=_early(B, H, S),
                                   **proj_kernels.launch_options(pdl, ATTEND_WARPS))
    return _combine(po, pm, pl, a, pdl)


def attend(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor, kv_len: int,
           splits: int | None = None) -> torch.Tensor:
    """gqa_attention of one query per row over the cache positions 0..pos (the new one already written),
    as over the first kv_len positions with the causal mask. q: [B, H, 1, hd] (any strides, hd contiguous);
    kc/vc: [B, Hkv, M, hd] (last two dims contiguous); pos: [B], each below kv_len. -> [B, H, 1, hd]"""
    B, H, _, hd = q.shape
    assert kc.stride() == vc.stride() and kc.stride(3) == 1 and kc.stride(2) == hd and q.stride(3) == 1
    S, CH = _split(B, H, kv_len, q.device, splits)
    a, po, pm, pl = _outputs(B, H, hd, S, q)
    _attend_kernel[(B, H, S)](q, pos, kc, vc, po, pm, pl, hd ** -0.5, q.stride(0), q.stride(1), kc.stride(0),
                              kc.stride(1), H=H, HKV=kc.shape[1], HD=hd, BD=next_pow2(hd), BL=ATTEND_BLOCK,
                              CH=CH, S=S, TO_POS=_to_pos(CH), num_warps=ATTEND_WARPS)
    return _combine(po, pm, pl, a, False)


def _early(B: int, H: int, S: int) -> bool:
    """Whether a one-token step's rope + attend kernel loads its positions and cached K/V before its wait."""
    return B <= EARLY_ROWS and B * H * S <= EARLY_PROGRAMS


def _to_pos(chunk: int) -> bool:
    """Whether a split's loop stops at its row's own position: where the split spans several blocks (one
    block compiles to straight-line code, no loop), and not in Triton's interpreter (which takes no loop bound
    from a loaded value: there a split loops over all its blocks)."""
    return chunk > ATTEND_BLOCK and not _INTERPRET


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def default_splits(B: int, H: int, sms: int) -> int:
    """Programs a row and query head's positions split over on `sms` SMs (0 off CUDA): where B x H programs
    leave SMs idle, enough that the B x H x splits give each SM configs.ATTEND_WAVES of them; else one (no
    split: where rows x heads fill the SMs, a split's extra programs and their join cost more than they hide)."""
    if B * H >= sms:
        return 1
    return max(1, kernel_configs.ATTEND_WAVES * sms // (B * H))


def _split(B: int, H: int, kv_len: int, device: torch.device, splits: int | None) -> tuple[int, int]:
    """(S, CH): the programs sharing one row and query head's cache positions, each CH of them (whole blocks).
    Default: `default_splits`, at most one a block (the positions past a row's own cost a split nothing); one
    off CUDA. -> S with no split empty of positions below kv_len"""
    blocks = -(-kv_len // ATTEND_BLOCK)
    if splits is None:
        splits = default_splits(B, H, _sm_count(device) if device.type == "cuda" else 0)
    per = -(-blocks // max(1, min(splits, blocks)))  # blocks a split
    return -(-blocks // per), per * ATTEND_BLOCK


def _outputs(B: int, H: int, hd: int, S: int, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """a [B, H, 1, hd], and with S > 1 the splits' partials: outputs [B, H, S, hd], maxima and sums [B, H, S]
    (float32); with S == 1 the kernel writes a itself (all four are a)."""
    a = torch.empty(B, H, 1, hd, device=like.device, dtype=like.dtype)
    if S == 1:
        return a, a, a, a
    po = torch.empty(B, H, S, hd, device=like.device, dtype=torch.float32)
    return a, po, *torch.empty(2, B, H, S, device=like.device, dtype=torch.float32)


def _combine(po: torch.Tensor, pm: torch.Tensor, pl: torch.Tensor, a: torch.Tensor, pdl: bool) -> torch.Tensor:
    """a [B, H, 1, hd] from the splits' partials (`_combine_kernel`; a itself where nothing was split)."""
    if po is a:
        return a
    B, H, S, hd = po.shape
    _combine_kernel[(B, H)](po, pm, pl, a, H=H, HD=hd, BD=next_pow2(hd), S=S, BS=next_pow2(S), PDL=pdl,
                            **proj_kernels.launch_options(pdl, COMBINE_WARPS))
    return a


def talker_attn_out(layer: Any, w_gu: torch.Tensor, x: torch.Tensor, a: torch.Tensor, pdl: bool = False
                    ) -> torch.Tensor:
    """The DecoderLayer after its attention: o projection + residual, then the MLP block, in three kernels.
    x: [B, 1, D], a: [B, H, 1, hd] -> [B, 1, D]"""
    B, _, D = x.shape
    return kernels.mlp_block(layer, w_gu, x.reshape(B, D), a.reshape(B, -1), pdl).view(B, 1, D)


def probe(layer: Any, w: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor], batches: list[int],
          max_rows: int, dtype: torch.dtype, pdl: int = 0) -> str:
    """Build and run the talker kernels a capture will use, for every batch of at most max_rows rows,
    through `kernels.run_probe`; pdl: with PDL for batches of at most `pdl` rows. -> "" or why not, one
    line."""
    a, dev = layer.self_attn, layer.input_layernorm.weight.device
    D = layer.input_layernorm.weight.shape[0]

    def build() -> str:
        for b in (b for b in batches if b <= max_rows):
            if not kernels.supports(layer, b):
                return "the talker layer's activation or norms are not what the kernels implement"
            kc = torch.zeros(b, a.kv_heads, 4, a.head_dim, device=dev, dtype=dtype)
            pos = torch.zeros(b, dtype=torch.long, device=dev)
            x = torch.zeros(b, 1, D, device=dev, dtype=dtype)
            rope = torch.zeros(b, 1, a.head_dim, device=dev, dtype=dtype)
            q = talker_attn_in(layer, w[0], w[1], x, rope, rope, kc, torch.zeros_like(kc), pos, b <= pdl)
            talker_attn_out(layer, w[2], x, q, b <= pdl)
            talker_attend(layer, w[0], w[1], x, rope, rope, kc, torch.zeros_like(kc), pos, kc.shape[2], b <= pdl)
        return ""

    return kernels.run_probe(dev, build)


def probe_attend(layer: Any, batches: list[int], max_rows: int, dtype: torch.dtype) -> str:
    """Build and run `attend` for every batch of at most max_rows rows (`kernels.run_probe`). -> "" or why not."""
    a, dev = layer.self_attn, layer.input_layernorm.weight.device

    def build() -> str:
        for b in (b for b in batches if b <= max_rows):
            kc = torch.zeros(b, a.kv_heads, 4, a.head_dim, device=dev, dtype=dtype)
            q = torch.zeros(b, a.heads, 1, a.head_dim, device=dev, dtype=dtype)
            attend(q, kc, torch.zeros_like(kc), torch.zeros(b, dtype=torch.long, device=dev), kc.shape[2])
        return ""

    return kernels.run_probe(dev, build)
