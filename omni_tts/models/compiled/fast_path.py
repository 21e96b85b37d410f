"""The compiled decode path (`FastPath`): compile units reused across layers and steps, and the
CodePredictor's whole frame as one compiled function.

`FastPath` holds the compiled units: the talker's decoder layer as two functions around its
attention (per-row positions, KV written into the slot cache; the attention between them is left
uncompiled so it reads only the first kv_len positions chosen per step without a recompile); the
CodePredictor's layer (16-position scratch cache per frame), head (final norm + codebook head +
sampling) and feed (code embedding + input projection); the talker's sampling call. Each unit is
compiled once per Inductor mode and reused for every layer and codebook step, so a batch bucket costs
a few small compiles; the hand-written Triton kernels replace units where chosen. The CodePredictor's
frame has one body here (`_frame_body`, CodePredictor.predict_frame's contract): `predict_frame` runs
it over the units and kernels, `whole_frame` compiles it once (Inductor's kernels only), traced
through regions that are lowered once and reused at every layer and step: what reduce-overhead runs.
Its layers run on one of three named paths per step shape (`_layers`). The talker's prefill runs one
compiled unit per layer (omni_tts.models.compiled.prefill). Every unit projects through packed q|k|v
and gate|up weights that share storage with the reference modules (`fuse_rows`; the shared
projections are omni_tts.models.compiled.units): fewer, bigger kernels for a launch-bound decode.
Knows nothing about requests, graphs or how buckets are chosen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from omni_tts.config import ModeSpec
from omni_tts.kernels import configs as kernel_configs
from omni_tts.kernels import heads as head_kernels
from omni_tts.kernels import layers as kernels
from omni_tts.kernels import talker as talker_kernels
from omni_tts.models import sampling
from omni_tts.models.compiled.kernel_choice import KernelChoice, fed_tables, folded_heads, folded_layers, made_once
from omni_tts.models.compiled.packed_weights import fuse_layer
from omni_tts.models.compiled.prefill import prefill_layer
from omni_tts.models.compiled.units import linear, mlp_fused, out_proj, qkv_fused, small_attention
from omni_tts.models.layers import gqa_attention, gqa_bias


# ---------------------------------------------------------------------------------------- layer units
def talker_attn_in(layer: Any, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None, x: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, rows: torch.Tensor,
                   pos: torch.Tensor) -> torch.Tensor:
    """First half of a talker layer: norm, q|k|v, rope, K/V written into the slot cache at (row, pos).
    x: [B, 1, D]; w_*: fuse_layer(layer); kc/vc: this layer's cache rows [B, Hkv, M, hd]; pos, rows: [B].
    -> q [B, H, 1, hd]"""
    h = layer.input_layernorm(x)
    q, k, v = qkv_fused(layer.self_attn, w_qkv, b_qkv, h, cos, sin)  # q: [B, H, 1, hd], k/v: [B, Hkv, 1, hd]
    kc[rows, :, pos] = k[:, :, 0]  # kc: [B, Hkv, M, hd]
    vc[rows, :, pos] = v[:, :, 0]
    return q


def final_norm(norm: Any, h: torch.Tensor) -> torch.Tensor:
    """The talker's final RMSNorm, a unit of its own: compiled, one fused kernel instead of its eager ones."""
    return norm(h)


def talker_attn_out(layer: Any, w_gu: torch.Tensor, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Second half: output projection + residual, then the MLP block. x: [B, 1, D], a: [B, H, 1, hd]."""
    x = x + out_proj(layer.self_attn, a)  # [B, 1, D]
    return x + mlp_fused(layer.mlp, w_gu, layer.post_attention_layernorm(x))


def predictor_layer(layer: Any, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None, w_gu: torch.Tensor,
                    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                    kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """x: [B, T, d] at positions pos [T] (same for every row); w_*: fuse_layer(layer); kc/vc:
    [B, Hkv, 16, hd]; mask: [1, 1, T, 16]. -> [B, T, d]"""
    q, k, v = qkv_fused(layer.self_attn, w_qkv, b_qkv, layer.input_layernorm(x), cos, sin)  # q: [B, H, T, hd]
    kc.index_copy_(2, pos, k)
    vc.index_copy_(2, pos, v)
    return _attend_mlp(layer, w_gu, x, q, kc, vc, mask)


def predictor_layer_pure(layer: Any, w_qkv: torch.Tensor, b_qkv: torch.Tensor | None, w_gu: torch.Tensor,
                         x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                         kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """predictor_layer writing nothing in place: -> (x [B, T, d], the new kc, vc), for a region that a
    whole-frame compile stamps out once per shape and reuses for every layer and step."""
    q, k, v = qkv_fused(layer.self_attn, w_qkv, b_qkv, layer.input_layernorm(x), cos, sin)  # q: [B, H, T, hd]
    kc, vc = kc.index_copy(2, pos, k), vc.index_copy(2, pos, v)  # [B, Hkv, 16, hd]
    return _attend_mlp(layer, w_gu, x, q, kc, vc, mask), kc, vc


def _attend_mlp(layer: Any, w_gu: torch.Tensor, x: torch.Tensor, q: torch.Tensor, kc: torch.Tensor,
                vc: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A predictor layer after its cache write: attention, output projection, MLP. -> [B, T, d]"""
    x = x + out_proj(layer.self_attn, small_attention(q, kc, vc, mask))  # [B, T, d]
    return x + mlp_fused(layer.mlp, w_gu, layer.post_attention_layernorm(x))


def predictor_head(norm: Any, head: Any, x: torch.Tensor, sp: sampling.SlotParams, seed: torch.Tensor,
                   frame: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """Final norm + this codebook's head on the last position, then its sampling. x: [B, T, d] -> [B]"""
    return sampling.sample_codebook(linear(norm(x[:, -1]), head.weight), sp, seed, frame, codebook)


def predictor_feed(embedding: Any, proj: Any, code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A sampled code's embedding (talker width) and the predictor's next input. code: [B] -> [B, D], [B, 1, d]"""
    e = embedding(code)  # [B, D]
    if isinstance(proj, nn.Linear):
        return e, linear(e[:, None], proj.weight, proj.bias)
    # a compile region's outputs may not alias each other: an Identity (0.6B: equal widths) gives a view of e
    return e, proj(e[:, None]).clone()


# Regions a whole-frame compile traces and lowers once and stamps out at every layer and step (75 layer
# calls, 15 heads): far less for Dynamo and Inductor to trace and compile. A no-op outside a compile.
_region = getattr(torch.compiler, "nested_compile_region", lambda f: f)
LAYER_REGION = _region(predictor_layer_pure)
HEAD_REGION = _region(predictor_head)
FEED_REGION = _region(predictor_feed)


def _cloned(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Copy a cudagraph-tree output out of Inductor's private pool before the next call reuses it
    (without this, torch raises 'accessing tensor output of CUDAGraphs that has been overwritten by
    a subsequent run')."""
    def call(*args: Any) -> Any:
        out = fn(*args)
        return tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone()

    return call


class FastPath(KernelChoice):
    """The compiled units of one CompileMode plus the talker step and the predictor frame built from them."""

    def __init__(self, model: Any, spec: ModeSpec | None, regions: bool = True) -> None:
        """spec: the compile mode's row of MODES (None: every unit plain, uncompiled); regions: the
        whole-frame compile traces the layer, head and feed once each and reuses them (False: inlines all
        75 layer and 15 head calls, for comparing the two)."""
        self.model = model
        self.regions = regions
        inductor_mode = spec.inductor if spec is not None else None
        compile_: Callable[..., Callable] = lambda f, dynamic=False: torch.compile(  # noqa: E731
            f, mode=inductor_mode, dynamic=dynamic, fullgraph=True)
        # a whole-frame mode compiles only the whole frame (below): its units stay plain functions inside it
        wrap = compile_ if inductor_mode is not None and not spec.whole_frame else (lambda f, dynamic=False: f)
        # the talker layer is two units around an uncompiled attention call, so the attention can read
        # only the first L cache positions (L chosen per step) without a recompile per L
        self.talker_attn_in = wrap(talker_attn_in)
        self.talker_attn_out = wrap(talker_attn_out)
        # prompts come in many (batch, length) buckets: compiled for dynamic shapes from the start
        self.talker_prefill_layer = wrap(prefill_layer, True)
        self.predictor_layer = wrap(predictor_layer)
        self.sample_talker = wrap(sampling.sample_talker)
        self.talker_norm = wrap(final_norm, True)
        self._rope_tables: dict[tuple[int, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        self.predictor_head = wrap(predictor_head)
        self.predictor_feed = wrap(predictor_feed)
        # the whole frame as one compiled function (Inductor's kernels only, batch size dynamic after the
        # first two shapes, so four compiles in all instead of one per bucket): graph trees record one graph
        # per batch shape and replay it once per frame (the KV cache is an intermediate, so no input is
        # written in place; outputs are copied out before the next replay)
        self.records_graph_trees = spec is not None and spec.graph_trees
        self.region_error = ""  # why the whole frame fell back to inlined layers, if it did
        self._compile, self._frame, self._frame_ran = compile_, None, False
        self.whole_frame: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = (
            None if inductor_mode is None else self._run_whole_frame)  # torch.compile is lazy: built on first call
        cp = model.code_predictor
        dev = model.device
        # packed q|k|v and gate|up weights per layer; the modules' own weights become views into them
        self.talker_w = [fuse_layer(layer) for layer in model.talker.layers]
        self.predictor_w = [fuse_layer(layer) for layer in cp.layers]
        self.n_pos = cp.num_groups  # 16 positions: talker hidden, code 0, codes 1..14
        self.pos = [torch.tensor([t], device=dev) for t in range(self.n_pos)]
        self.pos01 = torch.arange(2, device=dev)
        key = torch.arange(self.n_pos, device=dev)
        self.mask1 = [(key <= t)[None, None, None, :] for t in range(self.n_pos)]  # [1, 1, 1, 16]
        self.mask01 = (key[None, :] <= self.pos01[:, None])[None, None]  # [1, 1, 2, 16]
        cos, sin = cp.rope(key[None], model.dtype)  # [1, 16, hd]
        self.cos, self.sin = cos, sin
        # for the whole-frame compile, each step's positions as tensors of their own, not slices: a slice's
        # offset is baked into the kernels Inductor writes, which would then differ from step to step
        self.rope_at = [(cos[:, t:t + 1].contiguous(), sin[:, t:t + 1].contiguous()) for t in range(self.n_pos)]
        self.rope01 = (cos[:, :2].contiguous(), sin[:, :2].contiguous())
        self.codebook = [torch.tensor(j, device=dev) for j in range(self.n_pos)]

    def _layers(self, x: torch.Tensor, kc: list[torch.Tensor], vc: list[torch.Tensor], pos0: int,
                traced: bool) -> torch.Tensor:
        """All predictor layers for x: [B, T, d] at positions pos0..pos0+T-1, on the path chosen for this
        shape: the traced regions inside a whole-frame compile, else the Triton kernels up to `kernel_rows`
        rows (B x T), else the compiled units."""
        if traced:
            return self._layers_traced_regions(x, kc, vc, pos0)
        B, T = x.shape[:2]
        layers = self.model.code_predictor.layers
        if B * T <= self.kernel_rows and all(kernels.supports(layer, B * T) for layer in layers):
            return self._layers_triton(x, kc, vc, pos0)
        return self._layers_compiled_units(x, kc, vc, pos0)

    def _layers_triton(self, x: torch.Tensor, kc: list[torch.Tensor], vc: list[torch.Tensor], pos0: int
                       ) -> torch.Tensor:
        """The layers as omni_tts.kernels.layers (five kernels each; their norms folded into the weights from
        kernel_configs.FOLD_ROWS rows), the cache written in place."""
        cp = self.model.code_predictor
        wide = x.shape[0] * x.shape[1] >= kernel_configs.FOLD_ROWS
        folded = folded_layers(cp, self.predictor_w) if wide else [None] * len(cp.layers)
        for i, (layer, w) in enumerate(zip(cp.layers, self.predictor_w)):
            x = kernels.predictor_layer(layer, *w, x, self.cos, self.sin, kc[i], vc[i], pos0, self.kernel_pdl,
                                        folded[i])
        return x

    def _layers_compiled_units(self, x: torch.Tensor, kc: list[torch.Tensor], vc: list[torch.Tensor], pos0: int
                               ) -> torch.Tensor:
        """The layers as this mode's compiled layer unit (Inductor's kernels), the cache written in place."""
        T = x.shape[1]
        mask, pos = (self.mask01, self.pos01) if T == 2 else (self.mask1[pos0], self.pos[pos0])
        cos, sin = self.cos[:, pos0:pos0 + T], self.sin[:, pos0:pos0 + T]
        for i, (layer, w) in enumerate(zip(self.model.code_predictor.layers, self.predictor_w)):
            x = self.predictor_layer(layer, *w, x, cos, sin, mask, kc[i], vc[i], pos)
        return x

    def _layers_traced_regions(self, x: torch.Tensor, kc: list[torch.Tensor], vc: list[torch.Tensor], pos0: int
                               ) -> torch.Tensor:
        """The layers as the pure layer region a whole-frame compile traces once and reuses: each returns
        its new cache (kc/vc entries replaced) and reads its positions' rope as tensors of their own."""
        T = x.shape[1]
        mask, pos = (self.mask01, self.pos01) if T == 2 else (self.mask1[pos0], self.pos[pos0])
        cos, sin = self.rope01 if T == 2 else self.rope_at[pos0]  # pos0 == 0 when T == 2
        pure = self._traced_fns()[0]
        for i, (layer, w) in enumerate(zip(self.model.code_predictor.layers, self.predictor_w)):
            x, kc[i], vc[i] = pure(layer, *w, x, cos, sin, mask, kc[i], vc[i], pos)
        return x

    def talker_step(self, x: torch.Tensor, pos: torch.Tensor, cache: Any, b: int, kv_len: int | None = None
                    ) -> torch.Tensor:
        """x: [b, D] next inputs of rows [:b] at positions pos [b] -> final-normed hidden [b, D]. Attention
        reads cache positions [0, kv_len) (default: all): every row's pos must be < kv_len."""
        talker = self.model.talker
        L = cache.max_len if kv_len is None else kv_len
        cos, sin = self._rope_rows(pos, cache.max_len, x.dtype)  # [b, 1, hd]
        tri = b <= self.talker_kernel_rows and all(kernels.supports(layer, b) for layer in talker.layers)
        # the attention as a Triton kernel (with the rope one in the Triton layers, else after the compiled
        # unit), else SDPA over an additive bias built once for all layers
        attend = L <= self.talker_attend_len and (tri or b <= self.talker_attend_rows)
        bias = None if attend else self._talker_bias(pos, b, L, x.dtype)  # [b, 1, rep, L]
        rows = torch.arange(b, device=x.device)
        pdl = b <= self.talker_pdl_rows
        h = x[:, None]  # [b, 1, D]
        for i, (layer, (w_qkv, b_qkv, w_gu)) in enumerate(zip(talker.layers, self.talker_w)):
            kc, vc = cache.k[i, :b], cache.v[i, :b]  # [b, Hkv, M, hd]
            if attend and tri:  # programmatic dependent launch up to `talker_pdl_rows` (configs.TALKER_PDL_ROWS)
                a = talker_kernels.talker_attend(layer, w_qkv, b_qkv, h, cos, sin, kc, vc, pos, L, pdl)
            else:
                q = (talker_kernels.talker_attn_in(layer, w_qkv, b_qkv, h, cos, sin, kc, vc, pos, pdl) if tri
                     else self.talker_attn_in(layer, w_qkv, b_qkv, h, cos, sin, kc, vc, rows, pos))  # [b, H, 1, hd]
                a = (talker_kernels.attend(q, kc, vc, pos, L) if attend
                     else gqa_attention(q, kc[:, :, :L], vc[:, :, :L], bias))  # [b, H, 1, hd]
            h = (talker_kernels.talker_attn_out(layer, w_gu, h, a, pdl) if tri
                 else self.talker_attn_out(layer, w_gu, h, a))  # [b, 1, D]
        return self.talker_norm(talker.norm, h[:, 0])

    def _rope_rows(self, pos: torch.Tensor, max_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The talker's rope cos/sin at positions pos [b] -> [b, 1, hd] each: rows of a table made at the first
        step (a warm-up, outside any capture) for every cache position, as talker.rope computes them; one
        gather each instead of computing them every step."""
        def make() -> tuple[torch.Tensor, torch.Tensor]:
            cos, sin = self.model.talker.rope(torch.arange(max_len, device=pos.device)[None], dtype)  # [1, L, hd]
            return cos[0], sin[0]

        table = made_once(self._rope_tables, (max_len, dtype), make, pos.device)
        at = pos.clamp(max=max_len - 1)  # a free slot's stale position, in a bucket's spare rows
        return table[0][at][:, None], table[1][at][:, None]

    def talker_prefill(self, x: torch.Tensor, cache: Any, slots: torch.Tensor) -> torch.Tensor:
        """Talker.forward over prompts x: [B, T, D] (right-padded) at positions 0..T-1 into cache rows `slots`
        [B], as the prefill unit per layer. -> final-normed hidden [B, T, D]"""
        talker, T = self.model.talker, x.shape[1]
        cos, sin = talker.rope(torch.arange(T, device=x.device)[None], x.dtype)  # [1, T, hd]
        for i, (layer, (w_qkv, b_qkv, w_gu)) in enumerate(zip(talker.layers, self.talker_w)):
            x, k, v = self.talker_prefill_layer(layer, w_qkv, b_qkv, w_gu, x, cos, sin)  # k/v: [B, Hkv, T, hd]
            cache.k[i, :, :, :T][slots] = k  # one index_put each, outside the compiled unit
            cache.v[i, :, :, :T][slots] = v
        return talker.norm(x)

    def _talker_bias(self, pos: torch.Tensor, b: int, L: int, dtype: torch.dtype) -> torch.Tensor:
        """The causal mask of rows at positions pos [b] over L cache positions as gqa_attention's additive bias."""
        mask = (torch.arange(L, device=pos.device)[None, :] <= pos[:, None])[:, None, None]  # [b, 1, 1, L]
        a0 = self.model.talker.layers[0].self_attn
        return gqa_bias(mask, b, a0.heads // a0.kv_heads, 1, L, dtype)

    def predict_frame(self, hidden: torch.Tensor, code0: torch.Tensor, sp: sampling.SlotParams,
                      seed: torch.Tensor, frame: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Same contract as CodePredictor.predict_frame: -> (codes 1..15 [B, 15], embedding sum [B, D])."""
        return self._frame_body(hidden, code0, sp, seed, frame, False)

    def _run_whole_frame(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole frame, compiled on the first call; where this torch cannot compile it through the
        regions, once more with every layer inlined (slower to compile, same result)."""
        if self._frame is None:
            self._frame = self._build_frame()
        try:
            out = self._frame(*args)
        except Exception as e:
            if self._frame_ran or not self.regions:
                raise
            self.regions, self.region_error = False, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            self._frame = self._build_frame()
            out = self._frame(*args)
        self._frame_ran = True
        return out

    def _build_frame(self) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
        fn = self._compile(self._predict_plain, None)
        return _cloned(fn) if self.records_graph_trees else fn

    def _traced_fns(self) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
        """(layer, head, feed) as a whole-frame compile traces them: the reused regions, or plain."""
        if self.regions:
            return LAYER_REGION, HEAD_REGION, FEED_REGION
        return predictor_layer_pure, predictor_head, predictor_feed

    def _predict_plain(self, hidden: torch.Tensor, code0: torch.Tensor, sp: sampling.SlotParams,
                       seed: torch.Tensor, frame: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The frame over the traced regions, no hand-written kernels: the body `whole_frame` compiles."""
        return self._frame_body(hidden, code0, sp, seed, frame, True)

    def _frame_body(self, hidden: torch.Tensor, code0: torch.Tensor, sp: sampling.SlotParams, seed: torch.Tensor,
                    frame: torch.Tensor, traced: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The frame's 15 codebook steps over a 16-position KV cache made here (an intermediate, so a
        whole-frame compile writes no input in place). Each step: the layers (`_layers`), then the head,
        the code's choice and the next input, as omni_tts.kernels.heads where they apply to this batch
        (up to `head_kernel_rows` rows whose settings fit; the embedding sum then accumulates in float32),
        else as this path's head and feed units (`traced`: the regions a whole-frame compile traces)."""
        cp = self.model.code_predictor
        e0 = self.model.talker.codec_embedding(code0).to(hidden.dtype)  # [B, D]
        B = hidden.shape[0]
        x = cp.small_to_mtp_projection(torch.stack([hidden, e0], dim=1))  # [B, 2, d]
        kc = [x.new_zeros(B, cp.num_kv_heads, self.n_pos, cp.head_dim) for _ in cp.layers]
        vc = [x.new_zeros(B, cp.num_kv_heads, self.n_pos, cp.head_dim) for _ in cp.layers]
        head_kernels_on = (not traced and B <= self.head_kernel_rows
                           and head_kernels.supports(sp, B, cp.vocab_size))
        esum = e0.float() if head_kernels_on else None  # [B, D] running embedding sum (the kernels')
        fed = fed_tables(cp) if head_kernels_on else []  # made at the first (warm-up) call
        codes, embeds = [], [e0]
        pos0 = 0  # x holds positions pos0.. (the first step: talker hidden and code 0 at 0 and 1)
        for j in range(self.n_pos - 1):
            x = self._layers(x, kc, vc, pos0, traced)  # [B, T, d]
            pos0 = j + 2  # the next input's position
            if head_kernels_on:
                code, x = self._head_kernels(j, x, sp, seed, frame, esum, fed[j] if pos0 < self.n_pos else None)
            else:
                code, x, e = self._head_units(j, x, sp, seed, frame, pos0 < self.n_pos, traced)
                embeds.append(e)
            codes.append(code)
        total = esum.to(e0.dtype) if head_kernels_on else torch.stack(embeds, dim=1).sum(1)
        return torch.stack(codes, dim=1), total  # [B, 15], [B, D]

    def _head_units(self, j: int, x: torch.Tensor, sp: sampling.SlotParams, seed: torch.Tensor,
                    frame: torch.Tensor, feed: bool, traced: bool) -> tuple[torch.Tensor, Any, torch.Tensor]:
        """Codebook j + 1's head and choice, then (`feed`) the next input, as units -> (code [B], the next
        input [B, 1, d] or None, the code's embedding [B, D])."""
        cp = self.model.code_predictor
        head_fn, feed_fn = self._traced_fns()[1:] if traced else (self.predictor_head, self.predictor_feed)
        code = head_fn(cp.norm, cp.lm_head[j], x, sp, seed, frame, self.codebook[j + 1])  # [B]
        if feed:
            e, x = feed_fn(cp.codec_embedding[j], cp.small_to_mtp_projection, code)  # [B, D], [B, 1, d]
            return code, x, e
        return code, None, cp.codec_embedding[j](code)  # [B, D]

    def _head_kernels(self, j: int, x: torch.Tensor, sp: sampling.SlotParams, seed: torch.Tensor,
                      frame: torch.Tensor, esum: torch.Tensor, fed: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
        """Codebook j + 1's head, choice (its embedding added to esum) and, from the codebook's `fed` table,
        the next input, as omni_tts.kernels.heads -> (code [B], the next input [B, 1, d] or None)."""
        cp = self.model.code_predictor
        w_folded = folded_heads(cp)[j] if x.shape[0] >= kernel_configs.FOLD_ROWS else None
        return head_kernels.head_choose(cp.norm, cp.lm_head[j], x, sp, seed, frame, j + 1, cp.codec_embedding[j].weight,
                                        esum, self.kernel_pdl, fed, w_folded)
