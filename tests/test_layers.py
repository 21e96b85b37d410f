"""omni_tts.models.layers, the one implementation of the transformer building blocks: RMS norm's float32
variance, rotary embedding, grouped-query attention, the decoder layer with a caller-owned cache, the KV
cache, strict loading, casting; and the speech tokenizer's causal attention built on them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from omni_tts.errors import CheckpointError
from omni_tts.models.codec.transformer import WindowAttention
from omni_tts.models.layers import (
    DecoderLayer,
    KVCache,
    LayerScale,
    Rope,
    activation,
    apply_rope,
    cast_parameters,
    gqa_attention,
    gqa_bias,
    load_prefixed_state,
    load_strict,
    rms_norm,
)

CFG = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48,
           rms_norm_eps=1e-6, hidden_act="silu")


def test_rms_norm_takes_its_variance_in_float32() -> None:
    x = torch.tensor([[300.0, -400.0, 500.0, 0.0]], dtype=torch.float16)  # squares overflow float16
    y = rms_norm(x, torch.ones(4, dtype=torch.float16), 1e-6)
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
    assert abs(float(y.float().pow(2).mean()) - 1.0) < 1e-2
    x = torch.randn(2, 3, 8)  # [B, heads, hd]
    plain = rms_norm(x, torch.ones(8), 1e-6)
    per_head = rms_norm(x, torch.arange(1.0, 4.0)[:, None].expand(3, 8), 1e-6)  # head h scaled by h + 1
    torch.testing.assert_close(per_head, plain * torch.arange(1.0, 4.0)[:, None])


def test_rope_rotates_pairs_and_sees_only_relative_positions() -> None:
    rope = Rope(8, 10000.0)
    torch.manual_seed(0)
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)

    def score(m: int, n: int) -> torch.Tensor:
        cq, sq = rope(torch.tensor([[m]]), torch.float32)
        ck, sk = rope(torch.tensor([[n]]), torch.float32)
        return (apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum(-1)

    torch.testing.assert_close(score(3, 1), score(10, 8), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(score(3, 1), score(3, 2))
    c0, s0 = rope(torch.zeros(1, 1, dtype=torch.long), torch.float32)
    torch.testing.assert_close(apply_rope(q, c0, s0), q)  # position 0: no rotation
    c, s = rope(torch.tensor([[5]]), torch.float32)
    r = apply_rope(q, c, s)
    torch.testing.assert_close(r[..., :4] ** 2 + r[..., 4:] ** 2, q[..., :4] ** 2 + q[..., 4:] ** 2)  # pairs keep norms


def test_gqa_attention_equals_attention_over_repeated_kv_heads() -> None:
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    mask = torch.rand(2, 1, 3, 6) > 0.4
    mask[..., 0] = True  # every query sees a key
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask)
    torch.testing.assert_close(gqa_attention(q, k, v, mask), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 3])
def test_gqa_attention_over_a_prebuilt_bias_equals_it_over_the_boolean_mask(T: int, dtype: torch.dtype) -> None:
    """A decode step builds the additive bias once for all layers: each layer's attention must be the same
    bits as with the boolean mask, which masks differently per row (a row's own positions only)."""
    torch.manual_seed(T)
    B, H, Hkv, M = 3, 4, 2, 7
    q, k, v = (torch.randn(B, h, n, 8).to(dtype) for h, n in ((H, T), (Hkv, M), (Hkv, M)))
    pos = torch.tensor([0, 3, 6])  # row b attends positions <= pos[b]
    mask = (torch.arange(M)[None, :] <= pos[:, None])[:, None, None]  # [B, 1, 1, M]
    bias = gqa_bias(mask, B, H // Hkv, T, M, dtype)
    assert bias.shape == (B, 1, H // Hkv * T, M) and bias.dtype == dtype
    assert torch.equal(gqa_attention(q, k, v, bias), gqa_attention(q, k, v, mask))
    assert not torch.equal(gqa_attention(q, k, v, torch.zeros_like(bias)), gqa_attention(q, k, v, mask))


def test_decoder_layer_one_token_at_a_time_equals_the_whole_sequence() -> None:
    """The layer leaves the cache and the mask to its caller's `attend`: a cached step-by-step run and one
    causal pass over all positions agree."""
    torch.manual_seed(2)
    layer, rope = DecoderLayer(CFG, "test"), Rope(8, 10000.0)
    x = torch.randn(2, 5, 32)
    cos, sin = rope(torch.arange(5)[None], torch.float32)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    full = layer(x, cos, sin, lambda q, k, v: gqa_attention(q, k, v, causal))
    cache = KVCache(1, 2, 2, 5, 8, "cpu", torch.float32)
    steps = []
    for t in range(5):
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, t: int = t) -> torch.Tensor:
            kc, vc = cache.write_and_read(0, k, v, torch.full((2, 1), t), None, t + 1)
            return gqa_attention(q, kc, vc, None)

        steps.append(layer(x[:, t:t + 1], cos[:, t:t + 1], sin[:, t:t + 1], attend))
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_kv_cache_writes_each_rows_slot_and_moves_slots() -> None:
    cache = KVCache(2, 3, 1, 4, 2, "cpu", torch.float32)
    k = torch.arange(4.0).view(2, 1, 1, 2)
    kc, _ = cache.write_and_read(1, k, -k, torch.tensor([[3], [0]]), torch.tensor([2, 0]))
    assert kc.shape == (2, 1, 4, 2) and torch.equal(cache.k[1, 2, 0, 3], k[0, 0, 0])
    assert torch.equal(cache.v[1, 0, 0, 0], -k[1, 0, 0]) and float(cache.k[0].abs().sum()) == 0.0
    cache.move(2, 1)
    assert torch.equal(cache.k[:, 1], cache.k[:, 2])


def test_strict_loading_names_the_key_and_casting_keeps_buffers() -> None:
    m = nn.Sequential(nn.Linear(2, 3), LayerScale(3))
    good = {"p.0.weight": torch.ones(3, 2), "p.0.bias": torch.zeros(3), "p.1.scale": torch.full((3,), 2.0),
            "other.x": torch.zeros(1)}
    load_prefixed_state(m, good, "p.", "f.safetensors")
    assert float(m(torch.ones(1, 2)).detach().sum()) == 12.0  # (1 + 1) * 2 per output, 3 outputs
    for broken, what in (({k: v for k, v in good.items() if k != "p.0.bias"}, "missing tensor 'p.0.bias'"),
                         ({**good, "p.2.weight": torch.zeros(1)}, "unexpected tensor 'p.2.weight'"),
                         ({**good, "p.1.scale": torch.zeros(4)}, "tensor 'p.1.scale' has shape")):
        with pytest.raises(CheckpointError, match=what):
            load_strict(m, broken, [("p.", "")], "f.safetensors")
    with pytest.raises(CheckpointError, match="encoder_config: unsupported hidden_act 'tanhh'"):
        activation("tanhh", "encoder_config")
    model = nn.ModuleDict({"rope": Rope(8, 1e6), "proj": nn.Linear(8, 8)})
    cast_parameters(model, torch.bfloat16)
    assert model["proj"].weight.dtype == torch.bfloat16 and model["rope"].inv_freq.dtype == torch.float32


def test_codec_attention_without_a_window_is_plain_causal_attention() -> None:
    """The encoder's call (mask None) and the decoder's (a window as long as the clip) are one function."""
    torch.manual_seed(3)
    attn = WindowAttention(16, 2, 2, 8, False)
    x = torch.randn(2, 6, 16)
    rope = Rope(8, 10000.0)(torch.arange(6)[None], torch.float32)
    window = torch.ones(6, 6, dtype=torch.bool).tril()
    got = attn(x, rope, None)
    torch.testing.assert_close(got, attn(x, rope, window), rtol=1e-5, atol=1e-5)
    later = x.clone()
    later[:, 3:] += 1.0
    torch.testing.assert_close(attn(later, rope, None)[:, :3], got[:, :3])  # no position sees a later one


def test_no_weight_init_draws_no_random_numbers_and_puts_init_back() -> None:
    """Modules built for a checkpoint skip random initialisation (no RNG draw) and nn.init is restored,
    also after an error inside."""
    from omni_tts.models.layers import no_weight_init

    before = nn.init.kaiming_uniform_
    torch.manual_seed(0)
    state = torch.get_rng_state()
    with no_weight_init():
        nn.Linear(64, 64)
        nn.Embedding(32, 8)
    assert torch.equal(torch.get_rng_state(), state)
    with pytest.raises(ValueError), no_weight_init():
        raise ValueError("inside")
    assert nn.init.kaiming_uniform_ is before
    nn.Linear(4, 4)
    assert not torch.equal(torch.get_rng_state(), state)  # outside, initialisation draws again
