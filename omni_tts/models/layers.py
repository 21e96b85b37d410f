"""The transformer building blocks of every model part: the one reference implementation that the
talker, the code predictor and both halves of the speech tokenizer (codec decoder and encoder) use.

Owns: the hidden-activation lookup; strict config reads (`cfg_get`, `check_rope`); RMS norm with a
float32 variance; rotary embedding (float32 frequencies and angles, rotate-half convention); the SwiGLU
MLP; the q/k/v/o attention projections under the checkpoints' names, grouped-query attention, and the
Qwen3 attention block with per-head q/k RMS norm; the Qwen3 `DecoderLayer` and `DecoderStack`; the per-channel
`LayerScale`; the static slot-indexed `KVCache`; strict loading of checkpoint tensors into a module
(`load_strict`, `load_prefixed_state`) and casting parameters without their float32 buffers.
Compiled units (omni_tts.engine.step_impl) and Triton kernels (omni_tts.kernels) implement these
functions; tests hold them to it. Knows nothing about checkpoints' files, prompts, sampling or devices.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omni_tts.errors import CheckpointError, OmniTTSError

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (q, k, v) -> attention output
LayerAttend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # the same, given the layer

_ACTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu, "swish": F.silu, "gelu": F.gelu, "relu": F.relu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
}
ACTIVATIONS = tuple(_ACTS)  # the supported hidden_act values


def activation(name: str, where: str = "config.json") -> Callable[[torch.Tensor], torch.Tensor]:
    """The function a config's `hidden_act` names, or a CheckpointError naming `where` it came from."""
    if name not in _ACTS:
        raise CheckpointError(f"{where}: unsupported hidden_act '{name}'; supported: {', '.join(_ACTS)}")
    return _ACTS[name]


def cfg_get(cfg: dict[str, Any], key: str, where: str = "talker_config") -> Any:
    """cfg[key] or a CheckpointError naming the config section and key (no silent defaults)."""
    if key not in cfg or cfg[key] is None:
        raise CheckpointError(f"config.json: {where} has no '{key}'")
    return cfg[key]


def cfg_ints(cfg: dict[str, Any], where: str, *keys: str) -> tuple[int, ...]:
    """Several integer sizes of a config section at once (`cfg_get` for each)."""
    return tuple(int(cfg_get(cfg, k, where)) for k in keys)


def check_rope(cfg: dict[str, Any], where: str) -> None:
    """Only plain RoPE: the talker's interleaved M-RoPE gives all three streams the same position, so it is
    the same function; any other scaling type is refused."""
    scaling = cfg.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind != "default":
        raise CheckpointError(f"config.json: {where}.rope_scaling.rope_type '{kind}' is not supported (only default)")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm over the last axis: variance in float32, normalised value cast back to x's dtype, then
    scaled by `weight` (broadcast against x: [size], or e.g. [heads, size] for per-head weights)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


class RMSNorm(nn.Module):
    """`rms_norm` with its weight as a parameter."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_frequencies(head_dim: int, theta: float, device: torch.device | str | None = None) -> torch.Tensor:
    """The rotary inverse frequencies [head_dim / 2], float32."""
    exponents = torch.arange(0, head_dim, 2, device=device, dtype=torch.int64).float() / head_dim
    return 1.0 / (float(theta) ** exponents)


def rope_cos_sin(pos: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of integer positions pos [..., T]: angles in float32, then cast. -> [..., T, head_dim] each."""
    angles = pos.float()[..., None] * inv_freq.float()  # [..., T, hd/2]
    angles = torch.cat((angles, angles), dim=-1)  # [..., T, hd]
    return angles.cos().to(dtype), angles.sin().to(dtype)


class Rope(nn.Module):
    """`rope_cos_sin` with the frequencies kept as a float32 buffer.

    Cast parameters, not whole modules, to a lower precision (`cast_parameters`): the reference keeps
    these frequencies in float32.
    """

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        self.register_buffer("inv_freq", rope_frequencies(head_dim, theta), persistent=False)

    def forward(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(pos, self.inv_freq, dtype)  # pos: [B, T] -> [B, T, hd] each


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, H, T, hd]; cos/sin: [B, T, hd] (or [1, T, hd], shared by the batch); rotate-half convention."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # [B, H, T, hd]
    return x * cos[:, None] + rotated * sin[:, None]


def gqa_bias(mask: torch.Tensor, B: int, rep: int, T: int, M: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive form of a boolean attention mask in gqa_attention's folded layout: 0 where attended,
    -inf elsewhere, as scaled_dot_product_attention turns a boolean mask into. A decode step builds it
    once for all its layers instead of once per layer (three small kernels each).
    mask: bool, broadcastable to [B, 1, T, M] -> [B, 1, rep*T, M] in `dtype`"""
    mf = _folded(mask, B, rep, T, M)
    return torch.zeros(mf.shape, dtype=dtype, device=mask.device).masked_fill(~mf, float("-inf"))


def _folded(mask: torch.Tensor, B: int, rep: int, T: int, M: int) -> torch.Tensor:
    """A mask broadcastable to [B, 1, T, M] repeated for the rep query heads of a KV head -> [B, 1, rep*T, M]"""
    return mask.expand(B, 1, T, M)[:, :, None].expand(B, 1, rep, T, M).reshape(B, 1, rep * T, M)


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Grouped-query attention without copying K/V: the `rep` query heads that share a KV head are
    folded into the query-length axis (query rows are independent, so this is the same math).

    q: [B, H, T, hd]; k, v: [B, Hkv, M, hd]; mask: bool, True = attend, broadcastable to [B, 1, T, M],
    or its `gqa_bias`. -> [B, H, T, hd]"""
    B, H, T, hd = q.shape
    Hkv, M = k.shape[1], k.shape[2]
    rep = H // Hkv
    qf = q.reshape(B, Hkv, rep * T, hd)  # [B, Hkv, rep*T, hd] (heads j*rep..j*rep+rep-1 share KV head j)
    mf = mask
    if mask is not None and mask.dtype == torch.bool:
        mf = _folded(mask, B, rep, T, M)  # [B, 1, rep*T, M]
    a = F.scaled_dot_product_attention(qf, k, v, attn_mask=mf)  # [B, Hkv, rep*T, hd]
    return a.reshape(B, H, T, hd)


class MLP(nn.Module):
    """SwiGLU-style: down(act(gate(x)) * up(x)), no biases."""

    def __init__(self, hidden: int, inter: int, act: str, where: str = "config.json") -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.act = activation(act, where)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class AttentionProjections(nn.Module):
    """The q/k/v/o projections of a grouped-query attention block, under the checkpoints' names."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, bias: bool) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)

    def heads_of(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [B, T, D] -> q [B, T, H, hd], k and v [B, T, Hkv, hd] (not transposed, not rotated)."""
        B, T, _ = x.shape
        return (self.q_proj(x).view(B, T, self.heads, self.head_dim),
                self.k_proj(x).view(B, T, self.kv_heads, self.head_dim),
                self.v_proj(x).view(B, T, self.kv_heads, self.head_dim))

    def out(self, a: torch.Tensor) -> torch.Tensor:
        B, _, T, _ = a.shape  # a: [B, H, T, hd]
        return self.o_proj(a.transpose(1, 2).reshape(B, T, self.heads * self.head_dim))  # [B, T, D]


class Attention(AttentionProjections):
    """The Qwen3 attention block's projections with per-head q/k RMS norm; the caller owns caching and
    the attention call."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, bias: bool, eps: float) -> None:
        super().__init__(hidden, heads, kv_heads, head_dim, bias)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [B, T, D] -> q [B, H, T, hd], k and v [B, Hkv, T, hd]; q and k normed and rotated."""
        q, k, v = self.heads_of(x)
        q, k = self.q_norm(q).transpose(1, 2), self.k_norm(k).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v.transpose(1, 2)


class DecoderLayer(nn.Module):
    """The Qwen3 pre-norm decoder layer; `attend` (q, k, v of the new positions -> attention output)
    is the caller's: it owns the cache and the mask."""

    def __init__(self, cfg: dict[str, Any], where: str) -> None:
        super().__init__()
        hidden, heads, kv_heads, head_dim, inter = cfg_ints(
            cfg, where, "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size")
        eps = float(cfg_get(cfg, "rms_norm_eps", where))
        self.self_attn = Attention(hidden, heads, kv_heads, head_dim, bool(cfg.get("attention_bias", False)), eps)
        self.mlp = MLP(hidden, inter, str(cfg_get(cfg, "hidden_act", where)))
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        """x: [B, T, D]; cos/sin: [B or 1, T, hd] -> [B, T, D]."""
        q, k, v = self.self_attn.qkv(self.input_layernorm(x), cos, sin)  # q: [B, H, T, hd], k/v: [B, Hkv, T, hd]
        x = x + self.self_attn.out(attend(q, k, v))
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """A Qwen3 decoder's layers, final norm and rotary table, sized from a config section (`where`); the
    talker and the code predictor add their embeddings and heads."""

    def __init__(self, cfg: dict[str, Any], where: str) -> None:
        super().__init__()
        check_rope(cfg, where)
        self.hidden_size, self.num_layers, self.num_kv_heads, self.head_dim = cfg_ints(
            cfg, where, "hidden_size", "num_hidden_layers", "num_key_value_heads", "head_dim")
        self.layers = nn.ModuleList(DecoderLayer(cfg, where) for _ in range(self.num_layers))
        self.norm = RMSNorm(self.hidden_size, float(cfg_get(cfg, "rms_norm_eps", where)))
        self.rope = Rope(self.head_dim, float(cfg_get(cfg, "rope_theta", where)))

    def run_layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: LayerAttend) -> torch.Tensor:
        """x: [B, T, D]; cos/sin: [B or 1, T, hd]; attend(layer index, q, k, v) -> final-normed [B, T, D]."""
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, functools.partial(attend, i))
        return self.norm(x)


class LayerScale(nn.Module):
    """A learned per-channel scale on a residual branch (the speech tokenizer's transformers)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


def device_memory(device: torch.device) -> tuple[int, str]:
    """(bytes of memory, its name) of `device` as a whole: the GPU's, or the host's RAM (0 when unknown)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory, "GPU"
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "machine's memory"
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows)
        return 0, "machine"


class KVCache:
    """Static per-slot cache: k, v: [num_layers, num_slots, num_kv_heads, max_len, head_dim]."""

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, max_len: int, head_dim: int,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        shape = (num_layers, num_slots, num_kv_heads, max_len, head_dim)
        need = 2 * num_layers * num_slots * num_kv_heads * max_len * head_dim * dtype.itemsize
        have, where = device_memory(torch.device(device))
        too_big = (f"the talker's KV cache for {num_slots} slots x {max_len} positions needs {need / 2**30:.1f} GiB"
                   f"{f', more than the {have / 2**30:.1f} GiB of this {where}' if have else ''}: lower "
                   "max_num_seqs or max_seq_len")
        if have and need > have:
            raise OmniTTSError(too_big)
        try:
            self.k = torch.zeros(shape, device=device, dtype=dtype)
            self.v = torch.zeros(shape, device=device, dtype=dtype)
        except (torch.OutOfMemoryError, RuntimeError) as e:  # the CPU allocator raises RuntimeError
            if not isinstance(e, torch.OutOfMemoryError) and "allocate" not in str(e):
                raise
            raise OmniTTSError(too_big) from None
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


_INITS = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
          "xavier_normal_", "zeros_", "ones_", "constant_")


@contextmanager
def no_weight_init() -> Iterator[None]:
    """Build modules without random initialisation: every weight then comes from a checkpoint
    (`load_strict` checks that each one does), and initialising a 1.7B model on a CPU takes seconds."""
    saved = {n: getattr(nn.init, n) for n in _INITS}
    for n in _INITS:
        setattr(nn.init, n, lambda t, *args, **kwargs: t)
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(nn.init, n, f)


def load_strict(module: nn.Module, weights: dict[str, torch.Tensor], prefix_map: list[tuple[str, str]],
                source: str, ignore_prefixes: tuple[str, ...] = ()) -> None:
    """Copy checkpoint tensors into `module`'s parameters and buffers; every tensor under a mapped prefix
    must be used and every entry filled, with matching shapes, else CheckpointError naming the key."""
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


def load_prefixed_state(module: nn.Module, weights: dict[str, torch.Tensor], prefix: str, source: str) -> None:
    """`load_strict` of every `prefix + name` tensor into the module's entry `name`."""
    load_strict(module, weights, [(prefix, "")], source)


def cast_parameters(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast floating parameters (not buffers such as RoPE frequencies) to `dtype`."""
    for p in module.parameters():
        if p.is_floating_point():
            p.data = p.data.to(dtype)
    return module
