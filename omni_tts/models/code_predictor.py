"""The code predictor ("sub-talker"): codebooks 1..15 of one frame from the talker's hidden state.

Owns: the small Qwen3 decoder (an omni_tts.models.layers.DecoderStack) that reads [talker hidden, embed(code 0)]
and then its own previous code each step, its input projection from the talker width (`small_to_mtp_projection`:
a Linear when the widths differ, identity otherwise, as the reference builds it), its 15 code embeddings (in the
talker width) and 15 heads, and `predict`: an unrolled loop of fixed shapes with a per-call KV cache of 16
positions, so the whole call can be compiled and captured in one CUDA graph.
Knows nothing about prompts or requests; sampling rules live in omni_tts.models.sampling.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from omni_tts.models import sampling
from omni_tts.models.layers import DecoderStack, cfg_ints, gqa_attention


class CodePredictor(DecoderStack):
    def __init__(self, cfg: dict[str, Any], talker_hidden: int, code0_embedding: nn.Embedding | None = None) -> None:
        super().__init__(cfg, "code_predictor_config")
        self.num_groups, self.vocab_size = cfg_ints(cfg, "code_predictor_config", "num_code_groups", "vocab_size")
        n = self.num_groups - 1
        self.codec_embedding = nn.ModuleList(nn.Embedding(self.vocab_size, talker_hidden) for _ in range(n))
        self.lm_head = nn.ModuleList(nn.Linear(self.hidden_size, self.vocab_size, bias=False) for _ in range(n))
        wide = talker_hidden != self.hidden_size
        self.small_to_mtp_projection: nn.Module = (
            nn.Linear(talker_hidden, self.hidden_size, bias=True) if wide else nn.Identity())
        # The talker's codec embedding (code 0 lives in the talker's vocabulary); shared, not owned.
        self._code0_embedding = [code0_embedding]

    def _run(self, x: torch.Tensor, start: int, cos: torch.Tensor, sin: torch.Tensor,
             kcache: list[torch.Tensor], vcache: list[torch.Tensor]) -> torch.Tensor:
        """x: [B, T, d] at positions start..start+T-1 (static ints) -> final-normed hidden [B, T, d]."""
        T = x.shape[1]
        end = start + T
        c, s = cos[:, start:end], sin[:, start:end]  # [1, T, hd]
        # queries start..end-1 over keys 0..end-1: causal only matters within this call's block
        causal = torch.ones(T, end, dtype=torch.bool, device=x.device).tril(start)[None, None] if T > 1 else None

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kcache[i][:, :, start:end] = k
            vcache[i][:, :, start:end] = v
            return gqa_attention(q, kcache[i][:, :, :end], vcache[i][:, :, :end], causal)  # [B, H, T, hd]

        return self.run_layers(x, c, s, attend)

    def predict_frame(self, talker_hidden: torch.Tensor, code0: torch.Tensor, sp: sampling.SlotParams,
                      seed: torch.Tensor, frame: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """talker_hidden: [B, D]; code0: ids [B] or its embedding [B, D]; seed, frame: [B].
        -> (codes 1..15 [B, 15] int64, sum of the 16 code embeddings of the frame [B, D])."""
        e0 = self._code0_embedding[0](code0) if code0.dim() == 1 else code0  # [B, D]
        B, L = talker_hidden.shape[0], self.num_groups
        x = self.small_to_mtp_projection(torch.stack([talker_hidden, e0.to(talker_hidden.dtype)], dim=1))  # [B, 2, d]
        kc = [x.new_zeros(B, self.num_kv_heads, L, self.head_dim) for _ in self.layers]  # [B, Hkv, 16, hd]
        vc = [x.new_zeros(B, self.num_kv_heads, L, self.head_dim) for _ in self.layers]
        cos, sin = self.rope(torch.arange(L, device=x.device)[None], x.dtype)  # [1, 16, hd]
        codes, embeds = [], [e0.to(talker_hidden.dtype)]
        start = 0
        for j in range(L - 1):  # unrolled: every shape below is static
            hidden = self._run(x, start, cos, sin, kc, vc)  # [B, T, d]
            start += x.shape[1]
            logits = self.lm_head[j](hidden[:, -1])  # [B, V]
            code = sampling.sample_codebook(logits, sp, seed, frame, j + 1)  # [B]
            codes.append(code)
            embeds.append(self.codec_embedding[j](code))  # [B, D]
            if j < L - 2:
                x = self.small_to_mtp_projection(embeds[-1][:, None])  # [B, 1, d]
        return torch.stack(codes, dim=1), torch.stack(embeds, dim=1).sum(1)  # [B, 15], [B, D]

    def predict(self, talker_hidden: torch.Tensor, code0: torch.Tensor, sp: sampling.SlotParams,
                seed: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
        """Codes 1..15 of the frame: [B, 15] int64 (see predict_frame)."""
        return self.predict_frame(talker_hidden, code0, sp, seed, frame)[0]
