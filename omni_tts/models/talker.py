"""The talker: a Qwen3 decoder over summed text+codec embeddings that predicts codebook 0.

Owns the `Talker` module: text embedding + resize MLP (`text_projection`), codec embedding, decoder
layers, final norm and codec head, and its forward over the slot-indexed `KVCache`. The building blocks
(norms, rotary embedding, attention, MLP, decoder layers and stack, cache, strict loading) are those of
omni_tts.models.layers.

The checkpoint configures interleaved M-RoPE with three position streams; for TTS all three
streams carry the same position, so every frequency slot takes its angle from the same position
and M-RoPE equals plain 1-D RoPE (`rope_scaling.rope_type` must be "default"). This module takes
tensors and returns tensors: no tokenizer, no sampling, no I/O.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from omni_tts.models.layers import DecoderStack, KVCache, activation, cfg_get, cfg_ints, gqa_attention, gqa_bias


class Talker(DecoderStack):
    """Qwen3 decoder of the talker. forward() returns final-normed hidden states; logits() applies the head."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        w = "talker_config"
        super().__init__(cfg, w)
        self.vocab_size, text_hidden, text_vocab = cfg_ints(cfg, w, "vocab_size", "text_hidden_size", "text_vocab_size")
        self.text_embedding = nn.Embedding(text_vocab, text_hidden)
        self.text_projection = nn.ModuleDict({"linear_fc1": nn.Linear(text_hidden, text_hidden, bias=True),
                                              "linear_fc2": nn.Linear(text_hidden, self.hidden_size, bias=True)})
        self.text_act = activation(str(cfg_get(cfg, "hidden_act", w)))
        self.codec_embedding = nn.Embedding(self.vocab_size, self.hidden_size)
        self.codec_head = nn.Linear(self.hidden_size, self.vocab_size, bias=False)

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        """Text token ids [..., N] -> projected text embeddings [..., N, D]."""
        e = self.text_embedding(ids)  # [..., N, Dt]
        return self.text_projection["linear_fc2"](self.text_act(self.text_projection["linear_fc1"](e)))

    def embed_codec(self, ids: torch.Tensor) -> torch.Tensor:
        return self.codec_embedding(ids)  # [..., N, D]

    def new_cache(self, num_slots: int, max_len: int, device: torch.device | str | None = None,
                  dtype: torch.dtype | None = None) -> KVCache:
        p = self.codec_head.weight
        return KVCache(self.num_layers, num_slots, self.num_kv_heads, max_len, self.head_dim,
                       device or p.device, dtype or p.dtype)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cache: KVCache, slots: torch.Tensor | None,
                kv_len: int | None = None) -> torch.Tensor:
        """x: [B, T, D], pos: [B, T] (absolute positions), slots: [B] or None (rows 0..B-1) -> [B, T, D].
        kv_len: attend over the first kv_len cache positions only (every pos must be below it)."""
        cos, sin = self.rope(pos, x.dtype)  # [B, T, hd]
        key_pos = torch.arange(cache.max_len if kv_len is None else kv_len, device=x.device)  # [M]
        mask = (key_pos[None, None, :] <= pos[:, :, None])[:, None]  # [B, 1, T, M]
        a0 = self.layers[0].self_attn
        B, T = pos.shape
        bias = gqa_bias(mask, B, a0.heads // a0.kv_heads, T, key_pos.shape[0], x.dtype)  # once, for every layer

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kc, vc = cache.write_and_read(i, k, v, pos, slots, kv_len)  # [B, Hkv, M, hd]
            return gqa_attention(q, kc, vc, bias)  # [B, H, T, hd]

        return self.run_layers(x, cos, sin, attend)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.codec_head(hidden)  # [B, T, vocab]
