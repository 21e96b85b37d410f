"""The talker: a Qwen3 decoder over summed text+codec embeddings that predicts codebook 0.

Owns: the decoder building blocks shared with the code predictor (RMSNorm with float32 variance,
rotary embedding with float32 cos/sin, SwiGLU MLP, GQA attention with per-head q/k RMSNorm; the
codec decoder reuses the norm, the MLP and the attention projections), the static slot-indexed
`KVCache`, the `Talker` module (text embedding + resize MLP, codec embedding, decoder layers,
final norm, codec head) and strict loading of a checkpoint's tensors into a module.

The checkpoint configures interleaved M-RoPE with three position streams; for TTS all three
streams carry the same position, so every frequency slot takes its angle from the same position
and M-RoPE equals plain 1-D RoPE (`rope_scaling.rope_type` must be "default"). This module takes
tensors and returns tensors: no tokenizer, no sampling, no I/O.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from omni_tts.errors import CheckpointError

_ACTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu, "swish": F.silu, "gelu": F.gelu, "relu": F.relu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in _ACTS:
        raise CheckpointError(f"config.json: unsupported hidden_act '{name}'; supported: {', '.join(_ACTS)}")
    return _ACTS[name]


def cfg_get(cfg: dict[str, Any], key: str, where: str = "talker_config") -> Any:
    """cfg[key] or a CheckpointError naming the config section and key (no silent defaults)."""
    if key not in cfg or cfg[key] is None:
        raise CheckpointError(f"config.json: {where} has no '{key}'")
    return cfg[key]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm over the last axis: variance in float32, normalised value cast back to x's dtype, then
    scaled by `weight` (broadcast against x: [size], or e.g. [heads, size] for per-head weights)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


class RMSNorm(nn.Module):
    """RMS norm: variance in float32, normalised value cast back to the input dtype, then scaled."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Rope(nn.Module):
    """Rotary angles for integer positions; cos/sin computed in float32 then cast to the model dtype.

    `inv_freq` is a float32 buffer: cast parameters, not whole modules, to a lower precision
    (`cast_parameters`), as the reference keeps these frequencies in float32.
    """

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        self.register_buffer("inv_freq", 1.0 / (float(theta) ** exponents), persistent=False)

    def forward(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        angles = pos.float()[..., None] * self.inv_freq.float()  # [B, T, hd/2]
        angles = torch.cat((angles, angles), dim=-1)  # [B, T, hd]
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, H, T, hd]; cos/sin: [B, T, hd] (rotate-half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # [B, H, T, hd]
    return x * cos[:, None] + rotated * sin[:, None]


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Grouped-query attention without copying K/V: the `rep` query heads that share a KV head are
    folded into the query-length axis (query rows are independent, so this is the same math).

    q: [B, H, T, hd]; k, v: [B, Hkv, M, hd]; mask: bool, True = attend, broadcastable to [B, 1, T, M].
    -> [B, H, T, hd]"""
    B, H, T, hd = q.shape
    Hkv, M = k.shape[1], k.shape[2]
    rep = H // Hkv
    qf = q.reshape(B, Hkv, rep * T, hd)  # [B, Hkv, rep*T, hd] (heads j*rep..j*rep+rep-1 share KV head j)
    mf = None
    if mask is not None:
        mf = mask.expand(B, 1, T, M)[:, :, None].expand(B, 1, rep, T, M).reshape(B, 1, rep * T, M)  # [B, 1, rep*T, M]
    a = F.scaled_dot_product_attention(qf, k, v, attn_mask=mf)  # [B, Hkv, rep*T, hd]
    return a.reshape(B, H, T, hd)


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int, act: str) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.act = activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class AttentionProjections(nn.Module):
    """The q/k/v/o projections of a grouped-query attention block, under the checkpoints' names
    (shared with the codec decoder's window attention)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, bias: bool) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)


class Attention(AttentionProjections):
    """Projections of one attention block; the caller owns caching and the attention call."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, bias: bool, eps: float) -> None:
        super().__init__(hidden, heads, kv_heads, head_dim, bias)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.heads, self.head_dim)).transpose(1, 2)  # q: [B, H, T, hd]
        k = self.k_norm(self.k_proj(x).view(B, T, self.kv_heads, self.head_dim)).transpose(1, 2)  # k: [B, Hkv, T, hd]
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)  # v: [B, Hkv, T, hd]
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def out(self, a: torch.Tensor) -> torch.Tensor:
        B, _, T, _ = a.shape  # a: [B, H, T, hd]
        return self.o_proj(a.transpose(1, 2).reshape(B, T, self.heads * self.head_dim))  # [B, T, D]


class DecoderLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any], where: str) -> None:
        super().__init__()
        hidden, eps = int(cfg_get(cfg, "hidden_size", where)), float(cfg_get(cfg, "rms_norm_eps", where))
        self.self_attn = Attention(hidden, int(cfg_get(cfg, "num_attention_heads", where)),
                                   int(cfg_get(cfg, "num_key_value_heads", where)), int(cfg_get(cfg, "head_dim", where)),
                                   bool(cfg.get("attention_bias", False)), eps)
        self.mlp = MLP(hidden, int(cfg_get(cfg, "intermediate_size", where)), str(cfg_get(cfg, "hidden_act", where)))
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)


def check_rope(cfg: dict[str, Any], where: str) -> None:
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind != "default":
        raise CheckpointError(f"config.json: {where}.rope_scaling.rope_type '{kind}' is not supported (only default)")


class KVCache:
    """Static per-slot cache: k, v: [num_layers, num_slots, num_kv_heads, max_len, head_dim]."""

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, max_len: int, head_dim: int,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        shape = (num_layers, num_slots, num_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len

    @property
    def num_slots(self) -> int:
        return self.k.shape[1]

    def move(self, src: int, dst: int) -> None:
        """Copy slot src's cache rows to slot dst (all layers)."""
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]

    def write_and_read(self, layer: int, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                       slots: torch.Tensor | None, kv_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v ([B, Hkv, T, hd]) at (slot, pos) and return the rows' caches [B, Hkv, kv_len, hd]
        (kv_len: the first positions only; default all M).

        slots=None means rows 0..B-1 (views, no gather)."""
        B, Hkv, _, _ = k.shape
        kl, vl = self.k[layer], self.v[layer]  # [S, Hkv, M, hd]
        if slots is None:
            kl, vl = kl[:B], vl[:B]  # [B, Hkv, M, hd] views
            rows = torch.arange(B, device=k.device)
        else:
            rows = slots
        heads = torch.arange(Hkv, device=k.device)
        index = (rows[:, None, None], heads[None, :, None], pos[:, None, :])  # each broadcasts to [B, Hkv, T]
        kl.index_put_(index, k)
        vl.index_put_(index, v)
        L = kl.shape[2] if kv_len is None else kv_len
        if slots is None:
            return kl[:, :, :L], vl[:, :, :L]
        return kl[:, :, :L].index_select(0, slots), vl[:, :, :L].index_select(0, slots)  # [B, Hkv, L, hd]


class Talker(nn.Module):
    """Qwen3 decoder of the talker. forward() returns final-normed hidden states; logits() applies the head."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        w = "talker_config"
        check_rope(cfg, w)
        self.hidden_size = int(cfg_get(cfg, "hidden_size", w))
        self.num_layers = int(cfg_get(cfg, "num_hidden_layers", w))
        self.num_kv_heads = int(cfg_get(cfg, "num_key_value_heads", w))
        self.head_dim = int(cfg_get(cfg, "head_dim", w))
        self.vocab_size = int(cfg_get(cfg, "vocab_size", w))
        text_hidden = int(cfg_get(cfg, "text_hidden_size", w))
        act = str(cfg_get(cfg, "hidden_act", w))
        self.text_embedding = nn.Embedding(int(cfg_get(cfg, "text_vocab_size", w)), text_hidden)
        self.text_projection = nn.ModuleDict({"linear_fc1": nn.Linear(text_hidden, text_hidden, bias=True),
                                              "linear_fc2": nn.Linear(text_hidden, self.hidden_size, bias=True)})
        self.text_act = activation(act)
        self.codec_embedding = nn.Embedding(self.vocab_size, self.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, w) for _ in range(self.num_layers))
        self.norm = RMSNorm(self.hidden_size, float(cfg_get(cfg, "rms_norm_eps", w)))
        self.codec_head = nn.Linear(self.hidden_size, self.vocab_size, bias=False)
        self.rope = Rope(self.head_dim, float(cfg_get(cfg, "rope_theta", w)))

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
        for i, layer in enumerate(self.layers):
            h = layer.input_layernorm(x)  # [B, T, D]
            q, k, v = layer.self_attn.qkv(h, cos, sin)  # q: [B, H, T, hd], k/v: [B, Hkv, T, hd]
            kc, vc = cache.write_and_read(i, k, v, pos, slots, kv_len)  # [B, Hkv, M, hd]
            a = gqa_attention(q, kc, vc, mask)  # [B, H, T, hd]
            x = x + layer.self_attn.out(a)  # [B, T, D]
            x = x + layer.mlp(layer.post_attention_layernorm(x))  # [B, T, D]
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.codec_head(hidden)  # [B, T, vocab]


def load_strict(module: nn.Module, weights: dict[str, torch.Tensor], prefix_map: list[tuple[str, str]],
                source: str, ignore_prefixes: tuple[str, ...] = ()) -> None:
    """Copy checkpoint tensors into `module`; every tensor under a mapped prefix must be used and every
    parameter filled, with matching shapes, else CheckpointError naming the key."""
    own = module.state_dict()
    taken: dict[str, torch.Tensor] = {}
    for key, t in weights.items():
        if key.startswith(ignore_prefixes):
            continue
        for ckpt_prefix, own_prefix in prefix_map:
            if key.startswith(ckpt_prefix):
                name = own_prefix + key[len(ckpt_prefix):]
                if name not in own:
                    raise CheckpointError(f"{source}: unexpected tensor '{key}'")
                if tuple(own[name].shape) != tuple(t.shape):
                    raise CheckpointError(f"{source}: tensor '{key}' has shape {list(t.shape)}, "
                                          f"the config implies {list(own[name].shape)}")
                taken[name] = t
                break
    missing = [n for n in own if n not in taken]
    if missing:
        back = {o: c for c, o in prefix_map}
        name = missing[0]
        pre = max((o for o in back if name.startswith(o)), key=len, default="")
        raise CheckpointError(f"{source}: missing tensor '{back.get(pre, '') + name[len(pre):]}'")
    with torch.no_grad():
        for name, t in taken.items():
            own[name].copy_(t.to(own[name].dtype))


def cast_parameters(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast floating parameters (not buffers such as RoPE frequencies) to `dtype`."""
    for p in module.parameters():
        if p.is_floating_point():
            p.data = p.data.to(dtype)
    return module
