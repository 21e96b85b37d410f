"""Triton kernels of the talker's one-token attention with one program per KV head: the query heads that
share it take their scores and softmaxes side by side over each block of cache positions, which is loaded
once for them all instead of once per query head.

Owns: the loop over a split's cache positions in that form (`_loop_kv`; its block load `kv_block`, which the
per-query-head loop shares), the talker step's q/k norm + rope + cache write + attention kernel
(`rope_attend_kv_kernel`) and the attention-alone kernel (`attend_kv_kernel`), both writing outputs and split
partials exactly where omni_tts.kernels.talker's per-query-head kernels write theirs, so the same join follows.
omni_tts.kernels.talker launches them where the configs key attend_per_kv_head asks; numerics as those kernels'
(float32 scores and sums). Knows nothing about graphs or requests. Runs on CUDA; tests run it in Triton's CPU
interpreter.
"""

from __future__ import annotations

from omni_tts.kernels.layers import triton

# cache positions per step of the loop: the query heads' scores over a block are held together
BLOCK = 64

if triton is not None:
    import triton.language as tl

    from omni_tts.kernels.layers import normed_rope, rope_row, store_kv
    from omni_tts.kernels.projection import after_previous

    @triton.jit
    def kv_block(kc_at, vc_at, p, pos, k, v, d, dm, HD: tl.constexpr, FRESH: tl.constexpr):
        """One KV head's cache block at positions p [BL] (kc_at/vc_at: its position 0), those past pos read as 0;
        FRESH: position pos is k/v (float32 [BD], being written by another program), not the cache's.
        -> K, V float32 [BL, BD] (both attention forms' loops take their blocks so)"""
        cached = ((p < pos) if FRESH else (p <= pos))[:, None] & dm[None, :]
        kk = tl.load(kc_at + p[:, None] * HD + d[None, :], mask=cached, other=0.0).to(tl.float32)
        vv = tl.load(vc_at + p[:, None] * HD + d[None, :], mask=cached, other=0.0).to(tl.float32)
        if FRESH:
            kk = tl.where((p == pos)[:, None], k[None, :], kk)
            vv = tl.where((p == pos)[:, None], v[None, :], vv)
        return kk, vv

    @triton.jit
    def _loop_kv(q, k, v, pos, kc_at, vc_at, d, dm, scale, R: tl.constexpr, HD: tl.constexpr, BL: tl.constexpr,
                 CH: tl.constexpr, S: tl.constexpr, FRESH: tl.constexpr, TO_POS: tl.constexpr):
        """The causal attention of q (float32 [R, BD]: the R query heads of one KV head) over this program's split
        of that KV head's cache positions 0..pos, as omni_tts.kernels.talker's `_attend_loop` runs one query head
        (FRESH: position pos is k/v, float32 [BD], not the cache's). -> (unnormed outputs [R, BD], running
        maxima [R], softmax sums [R])"""
        if S == 1:
            lo = 0
        else:
            lo = tl.program_id(2) * CH
        m_i = tl.full([R], float("-inf"), tl.float32)
        l_i = tl.zeros([R], tl.float32)
        acc = tl.zeros(q.shape, tl.float32)
        for start in range(0, tl.minimum(pos + 1, lo + CH) - lo if TO_POS else CH, BL):
            p = lo + start + tl.arange(0, BL)
            kk, vv = kv_block(kc_at, vc_at, p, pos, k, v, d, dm, HD, FRESH)  # [BL, BD]
            s = tl.sum(q[:, None, :] * kk[None, :, :], axis=2) * scale  # [R, BL]
            s = tl.where((p <= pos)[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_at = m_new
            if S > 1:  # a split wholly past pos has no position: no NaN from -inf - -inf
                m_at = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_at)
            e = tl.exp(s - m_at[:, None])  # [R, BL]
            l_i = l_i * alpha + tl.sum(e, axis=1)
            acc = acc * alpha[:, None] + tl.sum(e[:, :, None] * vv[None, :, :], axis=1)
            m_i = m_new
        return acc, m_i, l_i

    @triton.jit
    def _store_kv_heads(acc, m_i, l_i, a_ptr, pm_ptr, pl_ptr, b, h, d, dm, H: tl.constexpr, HD: tl.constexpr,
                        S: tl.constexpr):
        """Query heads h [R] of row b: normed into a [B, H, HD] when there is one split, else their unnormed
        partials into a [B, H, S, HD] float32 and maxima and sums into pm/pl [B, H, S]."""
        if S == 1:
            out = (acc / l_i[:, None]).to(a_ptr.dtype.element_ty)
            tl.store(a_ptr + (b * H + h)[:, None] * HD + d[None, :], out, mask=dm[None, :])
        else:
            at = (b * H + h) * S + tl.program_id(2)  # [R]
            tl.store(a_ptr + at[:, None] * HD + d[None, :], acc, mask=dm[None, :])
            tl.store(pm_ptr + at, m_i)
            tl.store(pl_ptr + at, l_i)

    @triton.jit
    def rope_attend_kv_kernel(y_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, kc_ptr, vc_ptr, a_ptr, pm_ptr,
                              pl_ptr, eps, scale, kc_row, kc_head, H: tl.constexpr, HKV: tl.constexpr,
                              HD: tl.constexpr, BD: tl.constexpr, BL: tl.constexpr, CH: tl.constexpr,
                              S: tl.constexpr, PDL: tl.constexpr, TO_POS: tl.constexpr):
        """Program (row b, KV head g, split s) of a one-token talker step: K/V of g normed + rotated into the
        cache at the row's position pos[b] (in split 0), its query heads normed + rotated, then their causal
        attention over split s's cache positions of 0..pos[b] (the new position's K/V from y). y: [B,
        (H+2HKV)*HD]; cos/sin: [B, HD]. -> a [B, H, HD], or with S > 1 the partials"""
        dt = kc_ptr.dtype.element_ty
        b, g = tl.program_id(0), tl.program_id(1)
        REP: tl.constexpr = H // HKV
        r = tl.arange(0, REP)
        d = tl.arange(0, BD)
        dm = d < HD
        after_previous(PDL)
        cos, sin = rope_row(cos_ptr, sin_ptr, b * HD, d, dm)
        row = y_ptr + b * ((H + 2 * HKV) * HD)
        pos = tl.load(pos_ptr + b)
        head = b * kc_row + g * kc_head
        writes = dm
        if S > 1:
            writes = writes & (tl.program_id(2) == 0)
        k, v = store_kv(row, g, kn_ptr, cos, sin, eps, kc_ptr + head + pos * HD + d, vc_ptr + head + pos * HD + d, d,
                        dm, writes, H, HKV, HD, dt)
        q = tl.zeros([REP, BD], tl.float32)
        for i in tl.static_range(REP):
            qi = normed_rope(row + (g * REP + i) * HD, d, dm, HD // 2, HD, qn_ptr, cos, sin, eps, dt)
            q = tl.where((r == i)[:, None], qi[None, :], q)
        acc, m_i, l_i = _loop_kv(q, k, v.to(tl.float32), pos, kc_ptr + head, vc_ptr + head, d, dm, scale, REP, HD,
                                 BL, CH, S, True, TO_POS)
        _store_kv_heads(acc, m_i, l_i, a_ptr, pm_ptr, pl_ptr, b, g * REP + r, d, dm, H, HD, S)

    @triton.jit
    def attend_kv_kernel(q_ptr, pos_ptr, kc_ptr, vc_ptr, a_ptr, pm_ptr, pl_ptr, scale, q_row, q_head, kc_row,
                         kc_head, H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, BD: tl.constexpr,
                         BL: tl.constexpr, CH: tl.constexpr, S: tl.constexpr, TO_POS: tl.constexpr):
        """Program (row b, KV head g, split s): the causal attention of g's query heads of q[b] over split s's
        share of g's cache positions 0..pos[b], the new position already in the cache -> a [B, H, HD], or with
        S > 1 the partials."""
        b, g = tl.program_id(0), tl.program_id(1)
        REP: tl.constexpr = H // HKV
        h = g * REP + tl.arange(0, REP)
        d = tl.arange(0, BD)
        dm = d < HD
        pos = tl.load(pos_ptr + b)
        head = b * kc_row + g * kc_head
        q = tl.load(q_ptr + b * q_row + h[:, None] * q_head + d[None, :], mask=dm[None, :], other=0.0)
        acc, m_i, l_i = _loop_kv(q.to(tl.float32), d, d, pos, kc_ptr + head, vc_ptr + head, d, dm, scale, REP, HD,
                                 BL, CH, S, False, TO_POS)
        _store_kv_heads(acc, m_i, l_i, a_ptr, pm_ptr, pl_ptr, b, h, d, dm, H, HD, S)
