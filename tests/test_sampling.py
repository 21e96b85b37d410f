"""Per-row logits processing and counter-based sampling (omni_tts.models.sampling)."""

from __future__ import annotations

import random

import torch

from omni_tts.models import sampling
from omni_tts.models.sampling import RowSettings, SamplingConstants, SlotParams


def sp_of(*rows: RowSettings) -> SlotParams:
    return SlotParams.from_settings(list(rows))


def test_mul32_has_no_int64_overflow() -> None:
    rng = random.Random(0)
    vals = [0, 1, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF] + [rng.getrandbits(32) for _ in range(200)]
    a = torch.tensor(vals, dtype=torch.long)
    for c in (0x85EBCA6B, 0xC2B2AE35, 0xFFFFFFFF, 1):
        got = sampling._mul32(a, c).tolist()
        assert got == [(v * c) % (1 << 32) for v in vals]


def test_noise_range_determinism_and_independence() -> None:
    seeds = torch.tensor([0, 1, -5, (1 << 62) + 3, 2 ** 63 - 1])
    frames = torch.tensor([0, 7, 3, 1000000, 2])
    u = sampling.uniform_noise(seeds, frames, 3, 2048)
    assert u.shape == (5, 2048) and u.dtype == torch.float32
    assert bool((u > 0).all()) and bool((u < 1).all())
    assert torch.equal(u, sampling.uniform_noise(seeds, frames, 3, 2048))
    # a row's noise depends only on its own (seed, frame): same in any batch, at any position
    alone = sampling.uniform_noise(seeds[2:3], frames[2:3], 3, 2048)
    assert torch.equal(alone[0], u[2])
    perm = torch.tensor([4, 2, 0, 1, 3])
    assert torch.equal(sampling.uniform_noise(seeds[perm], frames[perm], 3, 2048), u[perm])
    # and changes with the seed, the frame and the codebook
    base = sampling.uniform_noise(torch.tensor([1]), torch.tensor([1]), 1, 2048)
    for other in (sampling.uniform_noise(torch.tensor([2]), torch.tensor([1]), 1, 2048),
                  sampling.uniform_noise(torch.tensor([1]), torch.tensor([2]), 1, 2048),
                  sampling.uniform_noise(torch.tensor([1]), torch.tensor([1]), 2, 2048)):
        assert (other != base).float().mean() > 0.99


def test_noise_is_uniform() -> None:
    u = sampling.uniform_noise(torch.arange(64), torch.zeros(64, dtype=torch.long), 0, 4096).flatten()
    assert abs(u.mean().item() - 0.5) < 0.005 and abs(u.var().item() - 1 / 12) < 0.002
    hist = torch.histc(u, bins=10, min=0, max=1) / u.numel()
    assert bool(((hist - 0.1).abs() < 0.005).all())


def test_greedy_is_exact_argmax_first_on_ties() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    sp = sp_of(RowSettings(greedy=True), RowSettings(greedy=True))
    out = sampling.choose(logits, sp, torch.tensor([1, 2]), torch.tensor([0, 0]), 0)
    assert out.tolist() == [1, 0] == torch.argmax(logits, -1).tolist()
    sp.all_greedy = False  # the tensor path must agree with the host-hint shortcut
    assert sampling.choose(logits, sp, torch.tensor([1, 2]), torch.tensor([0, 0]), 0).tolist() == [1, 0]


def _frequencies(logits: torch.Tensor, row: RowSettings, n: int = 20000) -> torch.Tensor:
    sp = SlotParams.from_settings([row] * n)
    picks = sampling.choose(logits.expand(n, -1).clone(), sp, torch.arange(n), torch.zeros(n, dtype=torch.long), 5)
    return torch.bincount(picks, minlength=logits.shape[-1]).float() / n


def test_sampling_follows_temperature_softmax() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    freq = _frequencies(logits, RowSettings(greedy=False, temperature=0.7))
    assert torch.allclose(freq, torch.softmax(logits[0] / 0.7, -1), atol=0.012)


def test_top_k_and_top_p() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    freq = _frequencies(logits, RowSettings(greedy=False, top_k=2))
    assert freq[2:].sum() == 0 and torch.allclose(freq[:2], torch.softmax(logits[0, :2], -1), atol=0.012)
    # HF top-p: keep the smallest top set whose mass reaches p. probs .5 .3 .15 .05, p=.7 -> {0, 1}
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    warped = sampling.warp(probs.log(), sp_of(RowSettings(greedy=False, top_p=0.7)))
    assert torch.isinf(warped[0, 2:]).all() and torch.isfinite(warped[0, :2]).all()
    warped = sampling.warp(probs.log(), sp_of(RowSettings(greedy=False, top_p=1.0)))
    assert torch.isfinite(warped).all()


def test_repetition_penalty_hf_rule() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    seen = torch.tensor([[True, True, False]])
    out = sampling.apply_repetition_penalty(logits, seen, torch.tensor([2.0]))
    assert out.tolist() == [[1.0, -4.0, 1.0]]


def test_talker_eos_min_frames_and_suppression() -> None:
    V, eos = 3072, 2150
    consts = SamplingConstants.for_talker(V, eos, "cpu")
    assert int(consts.suppress.sum()) == 1023 and not bool(consts.suppress[eos]) and not bool(consts.suppress[2047])
    logits = torch.zeros(1, V)
    logits[0, eos], logits[0, 2500], logits[0, 17] = 10.0, 20.0, 5.0
    sp = sp_of(RowSettings(greedy=True))
    seen = torch.zeros(1, V, dtype=torch.bool)
    def pick(frame: int, allow: bool) -> int:
        return sampling.sample_talker(logits, sp, seen, torch.tensor([frame]), torch.tensor([allow]),
                                      torch.tensor([0]), consts).item()

    assert pick(0, True) == 17 and pick(1, True) == 17  # EOS masked before 2 frames, 2500 suppressed
    assert pick(2, True) == eos
    assert pick(5, False) == 17  # fixed-length rows never stop


def test_rows_are_independent_of_the_batch() -> None:
    torch.manual_seed(0)
    V = 2048
    rows = [RowSettings(greedy=False, temperature=0.9, top_k=50), RowSettings(greedy=True),
            RowSettings(greedy=False, temperature=1.3, top_p=0.8), RowSettings(greedy=False, temperature=0.5),
            RowSettings(greedy=False, top_k=5, top_p=0.9, temperature=0.9)]
    logits = torch.randn(len(rows), V) * 3
    seeds = torch.tensor([11, 12, 13, 14, 15])
    frames = torch.tensor([0, 4, 9, 2, 30])
    batch = sampling.choose(logits, SlotParams.from_settings(rows), seeds, frames, 7)
    for i, r in enumerate(rows):
        alone = sampling.choose(logits[i:i + 1], sp_of(r), seeds[i:i + 1], frames[i:i + 1], 7)
        assert alone.item() == batch[i].item()
    perm = [3, 0, 4, 2, 1]
    permuted = sampling.choose(logits[perm], SlotParams.from_settings([rows[i] for i in perm]), seeds[perm],
                               frames[perm], 7)
    assert permuted.tolist() == batch[perm].tolist()
    # different seeds draw different tokens (over many draws)
    many = [sampling.choose(logits[:1], sp_of(rows[0]), torch.tensor([s]), frames[:1], 7).item() for s in range(20)]
    assert len(set(many)) > 3


def test_slot_params_views_and_moves() -> None:
    sp = SlotParams.zeros(4)
    sp.set_rows(2, [RowSettings(greedy=False, temperature=0.8, top_k=7, top_p=0.5, repetition_penalty=1.1)])
    assert not sp.all_greedy and sp.rows(3).top_k.tolist() == [0, 0, 7]
    sp.move(2, 0)
    assert sp.span(0, 1).temperature.item() == sp.temperature[2].item() and not bool(sp.greedy[0])
    sp.rows(2).top_k[1] = 9  # rows() are views of the slot tensors
    assert sp.top_k[1].item() == 9
    assert SlotParams.from_settings([RowSettings(greedy=False, temperature=0.0)]).all_greedy  # T=0 means greedy


def test_set_rows_writes_a_span_like_row_by_row_sets() -> None:
    """One copy per field for a span of rows gives what setting each row alone gives, defaults included
    (T = 0 -> 1, no top-k -> 0, no top-p -> 1, no penalty -> 1), and leaves the other rows alone."""
    rows = [RowSettings(greedy=False, temperature=0.8, top_k=7, top_p=0.5, repetition_penalty=1.1),
            RowSettings(greedy=True, temperature=0.0, top_k=None, top_p=None, repetition_penalty=None),
            RowSettings(greedy=False, temperature=1.3, top_k=0, top_p=0.95, repetition_penalty=1.05)]
    span, one = SlotParams.zeros(5), SlotParams.zeros(5)
    span.top_k[0], one.top_k[0] = 11, 11
    span.set_rows(1, rows)
    for i, r in enumerate(rows):
        one.set_rows(1 + i, [r])
    for a, b in zip(span._fields(), one._fields()):
        assert torch.equal(a, b)
    assert span.top_k.tolist() == [11, 7, 0, 0, 0] and span.temperature[2].item() == 1.0
    assert span.greedy.tolist() == [True, False, True, False, True] and not span.all_greedy


# ---------------------------------------------------------------------------------------- one-sort warp
NEG_INF = float("-inf")


def _warp_two_sorts(logits: torch.Tensor, sp: SlotParams, stable: bool = False) -> torch.Tensor:
    """The previous `warp` verbatim (a descending sort for top-k, an ascending one for top-p); its second
    sort was the default, unstable one, so which of several tied tokens at the top-p edge it dropped was
    up to the sort (stable=True: the deterministic order the one-sort `warp` uses)."""
    V = logits.shape[-1]
    x = logits / sp.temperature[:, None]  # [B, V]
    k = torch.where(sp.top_k > 0, sp.top_k.clamp(max=V), torch.full_like(sp.top_k, V))  # [B]
    desc = torch.sort(x, dim=-1, descending=True).values  # [B, V]
    kth = desc.gather(1, (k - 1)[:, None])  # [B, 1]
    x = x.masked_fill(x < kth, NEG_INF)
    asc, order = torch.sort(x, dim=-1, stable=stable)  # [B, V] ascending
    cum = asc.softmax(-1).cumsum(-1)  # [B, V]
    drop = (cum <= (1 - sp.top_p)[:, None]) & (sp.top_p < 1)[:, None]
    drop[:, -1] = False  # keep at least the most likely token
    return x.masked_fill(drop.scatter(1, order, drop), NEG_INF)


def _grid_rows(V: int, per_setting: int) -> list[RowSettings]:
    """Every (top_k, top_p, temperature) of the grid, `per_setting` rows each, interleaved in one batch."""
    grid = [RowSettings(greedy=False, temperature=t, top_k=k, top_p=p)
            for k in (0, 1, 5, 50, V) for p in (1.0, 0.9, 0.5, 0.01) for t in (0.7, 1.0, 1.3)]
    return grid * per_setting


def _random_logits(n: int, V: int, ties: bool, gen: torch.Generator) -> torch.Tensor:
    if not ties:
        return torch.randn(n, V, generator=gen) * 3
    # few distinct values: ties at the top-k edge, at the top-p edge and for the maximum
    return torch.randint(-6, 7, (n, V), generator=gen).float() * 0.5


def test_one_sort_warp_equals_two_sort_warp_and_samples_the_same_tokens() -> None:
    gen = torch.Generator().manual_seed(0)
    for V, per_setting in ((2048, 40), (64, 400)):
        rows = _grid_rows(V, per_setting)
        sp = SlotParams.from_settings(rows)
        n = len(rows)
        seeds, frames = torch.arange(n), torch.full((n,), 3)
        g = -torch.log(-torch.log(sampling.uniform_noise(seeds, frames, 4, V)))  # [n, V] the Gumbel noise of choose
        for ties in (False, True):
            logits = _random_logits(n, V, ties, gen)
            new = sampling.warp(logits, sp)
            old = _warp_two_sorts(logits, sp, stable=ties)
            assert torch.equal(new, old), (V, ties)  # same kept set, same values
            assert torch.equal(torch.argmax(new + g, -1), torch.argmax(old + g, -1))
            picks = sampling.choose(logits, sp, seeds, frames, 4)
            assert torch.equal(picks, torch.argmax(old + g, -1))
            if ties:  # vs the unstable original: same number kept and same kept values, ids may differ among ties
                orig = _warp_two_sorts(logits, sp)
                assert torch.equal(torch.isfinite(new).sum(-1), torch.isfinite(orig).sum(-1))
                assert torch.equal(new.sort(-1).values, orig.sort(-1).values)
            kept = torch.isfinite(new).sum(-1)
            k = torch.where(sp.top_k > 0, sp.top_k.clamp(max=V), torch.full_like(sp.top_k, V))
            assert bool((kept >= 1).all())
            if not ties:  # distinct values: top-k keeps exactly k, top-p only narrows it
                assert bool((kept[sp.top_p == 1] == k[sp.top_p == 1]).all()) and bool((kept <= k).all())


def test_one_sort_warp_top_p_edge_and_tie_rules() -> None:
    # probs .5 .3 .15 .05 (shuffled ids): p=.7 and .75 keep {.5, .3}, .85 adds .15
    probs = torch.tensor([[0.15, 0.5, 0.05, 0.3]])
    for p, keep in ((0.7, [1, 3]), (0.75, [1, 3]), (0.85, [0, 1, 3]), (0.01, [1]), (1.0, [0, 1, 2, 3])):
        w = sampling.warp(probs.log(), sp_of(RowSettings(greedy=False, top_p=p)))
        assert torch.isfinite(w[0]).nonzero()[:, 0].tolist() == keep, p
    # top-k keeps every token tied with the k-th largest
    w = sampling.warp(torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.0]]), sp_of(RowSettings(greedy=False, top_k=2)))
    assert torch.isfinite(w[0]).tolist() == [False, True, True, True, False]
    # four equal tokens, p=0.5: cumulative .25 .5 .75 1 -> the first two in sorted order go; lower ids first
    w = sampling.warp(torch.zeros(1, 4), sp_of(RowSettings(greedy=False, top_p=0.5)))
    assert torch.isfinite(w[0]).tolist() == [False, False, True, True]


def test_topk_warp_equals_the_sort_warp_for_the_rows_it_is_for_and_picks_the_same_tokens() -> None:
    gen = torch.Generator().manual_seed(1)
    for V, cap in ((2048, 64), (3072, 64), (40, 64)):  # 40 < cap: the selection is the whole row
        rows = [r for r in _grid_rows(V, 12) if sampling.fits_topk(r, cap)]
        assert {r.top_k for r in rows} == {k for k in (0, 1, 5, 50, V) if k <= cap}  # top-k 0 only with top-p 1
        sp = SlotParams.from_settings(rows)
        n = len(rows)
        seeds, frames = torch.arange(n), torch.full((n,), 5)
        logits = _random_logits(n, V, False, gen)
        full = sampling.warp(logits, sp)
        fast = sampling.warp_topk(logits, sp, cap)
        assert torch.equal(fast, full), V  # same kept set and values
        sp.topk_cap = cap
        fast_picks = sampling.choose(logits, sp, seeds, frames, 2)
        sp.topk_cap = 0
        assert torch.equal(fast_picks, sampling.choose(logits, sp, seeds, frames, 2))
    # what it is not for: top-k off with top-p < 1, top-k above the cap
    assert not sampling.fits_topk(RowSettings(greedy=False, top_k=0, top_p=0.9), 64)
    assert not sampling.fits_topk(RowSettings(greedy=False, top_k=65), 64)
    assert sampling.fits_topk(RowSettings(greedy=True, top_k=0, top_p=0.5), 64)  # greedy rows never warp
    # the edge rules: top-k keeps the k-th largest's ties; top-p keeps {.5, .3} at p=.7 and .75, adds .15 at .85
    w = sampling.warp_topk(torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.0]]), sp_of(RowSettings(greedy=False, top_k=2)), 4)
    assert torch.isfinite(w[0]).tolist() == [False, True, True, True, False]
    probs = torch.tensor([[0.15, 0.5, 0.05, 0.3]])
    for p, keep in ((0.7, [1, 3]), (0.75, [1, 3]), (0.85, [0, 1, 3]), (0.01, [1]), (1.0, [0, 1, 2, 3])):
        w = sampling.warp_topk(probs.log(), sp_of(RowSettings(greedy=False, top_k=4, top_p=p)), 64)
        assert torch.isfinite(w[0]).nonzero()[:, 0].tolist() == keep, p
