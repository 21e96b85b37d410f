"""The compiled decode path: small compile units reused across layers and steps.

Owns: one decoder-layer function for the talker (one new token per row, per-row positions, KV
written into the slot cache), one for the code predictor (positions shared by the batch, a
16-position scratch cache per frame), and the two sampling calls, each wrapped by torch.compile
once per CompileMode and re-used for all 28 talker layers, all 5 predictor layers and all 15
codebook steps. So a bucket costs five small compiles instead of one huge one (an unrolled frame
took ~200 s to compile on the H200 with torch 2.11, dynamo does not recompile for another layer
instance of the same class). The ops inside are those of omni_tts.talker / code_predictor /
sampling; eager mode does not use this file (it runs the reference modules as they are).
Knows nothing about requests, buckets or graphs.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from omni_tts import sampling
from omni_tts.talker import gqa_attention


def talker_layer(layer: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                 kc: torch.Tensor, vc: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """x: [B, 1, D]; kc/vc: this layer's cache rows [B, Hkv, M, hd] (written at (row, pos));
    mask: [B, 1, 1, M]; pos, rows: [B]. -> [B, 1, D]"""
    h = layer.input_layernorm(x)
    q, k, v = layer.self_attn.qkv(h, cos, sin)  # q: [B, H, 1, hd], k/v: [B, Hkv, 1, hd]
    kc[rows, :, pos] = k[:, :, 0]  # kc: [B, Hkv, M, hd]
    vc[rows, :, pos] = v[:, :, 0]
    x = x + layer.self_attn.out(gqa_attention(q, kc, vc, mask))  # [B, 1, D]
    return x + layer.mlp(layer.post_attention_layernorm(x))


def predictor_layer(layer: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                    kc: torch.Tensor, vc: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """x: [B, T, d] at positions pos [T] (same for every row); kc/vc: [B, Hkv, 16, hd];
    mask: [1, 1, T, 16]. -> [B, T, d]"""
    h = layer.input_layernorm(x)
    q, k, v = layer.self_attn.qkv(h, cos, sin)  # q: [B, H, T, hd]
    kc.index_copy_(2, pos, k)
    vc.index_copy_(2, pos, v)
    x = x + layer.self_attn.out(gqa_attention(q, kc, vc, mask))  # [B, T, d]
    return x + layer.mlp(layer.post_attention_layernorm(x))


def _cloned(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Copy a cudagraph-tree output out of Inductor's private pool before the next call reuses it
    (without this, torch 2.11 raised 'accessing tensor output of CUDAGraphs that has been
    overwritten by a subsequent run' on the H200, 2026-11-30)."""
    return lambda *args: fn(*args).clone()


class FastPath:
    """The compiled units of one CompileMode plus the two step bodies built from them."""

    def __init__(self, model: Any, inductor_mode: str | None) -> None:
        self.model = model
        wrap: Callable[[Callable], Callable] = (
            (lambda f: f) if inductor_mode is None else
            (lambda f: torch.compile(f, mode=inductor_mode, dynamic=False, fullgraph=True)))
        if inductor_mode == "reduce-overhead":  # its graphs' outputs are overwritten by the next replay
            inner = wrap
            wrap = lambda f: _cloned(inner(f))  # noqa: E731
        self.talker_layer = wrap(talker_layer)
        self.predictor_layer = wrap(predictor_layer)
        self.sample_talker = wrap(sampling.sample_talker)
        self.sample_codebook = wrap(sampling.sample_codebook)
        cp = model.code_predictor
        dev = model.device
        self.n_pos = cp.num_groups  # 16 positions: talker hidden, code 0, codes 1..14
        self.pos = [torch.tensor([t], device=dev) for t in range(self.n_pos)]
        self.pos01 = torch.arange(2, device=dev)
        key = torch.arange(self.n_pos, device=dev)
        self.mask1 = [(key <= t)[None, None, None, :] for t in range(self.n_pos)]  # [1, 1, 1, 16]
        self.mask01 = (key[None, :] <= self.pos01[:, None])[None, None]  # [1, 1, 2, 16]
        cos, sin = cp.rope(key[None], model.dtype)  # [1, 16, hd]
        self.cos, self.sin = cos, sin
        self.codebook = [torch.tensor(j, device=dev) for j in range(self.n_pos)]

    def talker_step(self, x: torch.Tensor, pos: torch.Tensor, cache: Any, b: int) -> torch.Tensor:
        """x: [b, D] next inputs of rows [:b] at positions pos [b] -> final-normed hidden [b, D]."""
        talker = self.model.talker
        cos, sin = talker.rope(pos[:, None], x.dtype)  # [b, 1, hd]
        key = torch.arange(cache.max_len, device=x.device)
        mask = (key[None, :] <= pos[:, None])[:, None, None]  # [b, 1, 1, M]
        rows = torch.arange(b, device=x.device)
        h = x[:, None]  # [b, 1, D]
        for i, layer in enumerate(talker.layers):
            h = self.talker_layer(layer, h, cos, sin, mask, cache.k[i, :b], cache.v[i, :b], rows, pos)
        return talker.norm(h)[:, 0]

    def predict_frame(self, hidden: torch.Tensor, code0: torch.Tensor, sp: sampling.SlotParams,
                      seed: torch.Tensor, frame: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Same contract as CodePredictor.predict_frame: -> (codes 1..15 [B, 15], embedding sum [B, D])."""
        cp = self.model.code_predictor
        e0 = self.model.talker.codec_embedding(code0)  # [B, D]
        B = hidden.shape[0]
        x = cp.small_to_mtp_projection(torch.stack([hidden, e0.to(hidden.dtype)], dim=1))  # [B, 2, d]
        kc = [x.new_zeros(B, cp.num_kv_heads, self.n_pos, cp.head_dim) for _ in cp.layers]
        vc = [x.new_zeros(B, cp.num_kv_heads, self.n_pos, cp.head_dim) for _ in cp.layers]
        cos, sin, mask, pos = self.cos[:, :2], self.sin[:, :2], self.mask01, self.pos01
        codes, embeds = [], [e0.to(hidden.dtype)]
        for j in range(self.n_pos - 1):
            for i, layer in enumerate(cp.layers):
                x = self.predictor_layer(layer, x, cos, sin, mask, kc[i], vc[i], pos)
            logits = cp.lm_head[j](cp.norm(x[:, -1]))  # [B, V]
            code = self.sample_codebook(logits, sp, seed, frame, self.codebook[j + 1])  # [B]
            codes.append(code)
            embeds.append(cp.codec_embedding[j](code))  # [B, D]
            t = j + 2
            if t < self.n_pos:
                x = cp.small_to_mtp_projection(embeds[-1][:, None])  # [B, 1, d]
                cos, sin = self.cos[:, t:t + 1], self.sin[:, t:t + 1]
                mask, pos = self.mask1[t], self.pos[t]
        return torch.stack(codes, dim=1), torch.stack(embeds, dim=1).sum(1)  # [B, 15], [B, D]
