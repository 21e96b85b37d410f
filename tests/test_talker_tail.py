"""The talker step's edges on the compiled path: its rope rows taken from a table, and code 0's choice as one
kernel (omni_tts.kernels.heads.talker_choose, in Triton's CPU interpreter) against
omni_tts.models.sampling.sample_talker, the rule it implements: the repetition penalty on the ids a row has
seen, the control ids and an early or forbidden EOS masked, then greedy, top-k and top-p rows drawing the
same noise; and FastPath taking the kernel only for the rows and settings it serves. Skips where triton is
not installed (requirements-dev.txt has it)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")  # conftest.py sets TRITON_INTERPRET=1 without CUDA

from test_kernels import _mixed_rows  # noqa: E402

from omni_tts.kernels import heads as head_kernels  # noqa: E402
from omni_tts.kernels import layers as kernels  # noqa: E402
from omni_tts.models import sampling  # noqa: E402

V, EOS, CONTROL = 160, 130, 32  # ids [V - CONTROL, V) are control ids, suppressed except EOS


def _rows(B: int, cap: int) -> sampling.SlotParams:
    """_mixed_rows' settings, each with a repetition penalty of its own (1: none)."""
    sp = _mixed_rows(B, cap)
    sp.penalty = torch.tensor([(1.0, 1.05, 1.3, 2.0)[i % 4] for i in range(B)])
    return sp


def _case(B: int, frame: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Logits with a strong EOS and strong, often seen, ids; which ids each row saw; which rows may stop."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, V, generator=g) * 2
    logits[:, EOS] += 4.0  # EOS wins where it is allowed, unless the noise says otherwise
    logits[:, :8] += torch.rand(B, 8, generator=g) * 6 - 3  # strong positive and negative ids, seen below
    seen = torch.rand(B, V, generator=g) < 0.3
    seen[:, :8] = True
    allow = torch.arange(B) % 3 != 0
    return logits, seen, torch.full((B,), frame), allow, torch.arange(B) * 7919 + seed


@pytest.mark.parametrize("frame", [0, 5])  # before min_frames EOS is masked for every row; after, per row
def test_talker_choice_kernel_chooses_as_the_sampling_module(frame: int) -> None:
    consts = sampling.SamplingConstants.for_talker(V, EOS, "cpu", num_control=CONTROL)
    B = 12
    sp = _rows(B, 16)
    picked = []
    for seed in range(3):
        logits, seen, frames, allow, seeds = _case(B, frame, seed)
        got = head_kernels.talker_choose(logits, sp, seen, frames, allow, seeds, consts)
        want = sampling.sample_talker(logits, sp, seen, frames, allow, seeds, consts)
        assert torch.equal(got, want)
        picked.append(got)
    codes = torch.cat(picked)
    assert not bool(consts.suppress[codes].any())  # no control id but EOS, ever
    allowed = torch.cat([(torch.arange(B) % 3 != 0)] * 3)
    assert bool((codes[allowed] == EOS).any()) == (frame >= consts.min_frames)
    assert not bool((codes[~allowed] == EOS).any())


def test_talker_choice_kernel_applies_the_repetition_penalty() -> None:
    """Greedy rows whose best id was seen: divided by a large penalty it loses to the next best, as in the
    module; at penalty 1 it wins."""
    consts = sampling.SamplingConstants.for_talker(V, EOS, "cpu", num_control=CONTROL)
    B = 4
    logits = torch.zeros(B, V)
    logits[:, 3], logits[:, 9] = 5.0, 4.0
    seen = torch.zeros(B, V, dtype=torch.bool)
    seen[:, 3] = True
    sp = sampling.SlotParams.from_settings([sampling.RowSettings(greedy=True, repetition_penalty=p)
                                            for p in (1.0, 1.1, 2.0, 3.0)]).rows(B, topk_cap=16)
    args = (seen, torch.full((B,), 4), torch.ones(B, dtype=torch.bool), torch.arange(B), consts)
    got = head_kernels.talker_choose(logits, sp, *args)
    assert torch.equal(got, sampling.sample_talker(logits, sp, *args))
    assert got.tolist() == [3, 3, 9, 9]


def test_fastpath_takes_the_talker_choice_kernel_only_where_it_serves(monkeypatch) -> None:
    """FastPath.sample_talker: the kernel for rows whose settings fit a top-k selection, within
    talker_choice_rows; the compiled unit (here plain) for full-sort rows and when the kernel is off. The
    same codes either way."""
    from test_fastpath import model_and_fast

    from omni_tts.models.compiled.fast_path import FastPath

    m, _ = model_and_fast()
    fast = FastPath(m, None)
    consts = sampling.SamplingConstants.for_talker(V, EOS, "cpu", num_control=CONTROL)
    B = 5
    logits, seen, frames, allow, seeds = _case(B, 4, 11)
    calls = []
    kernel = head_kernels.talker_choose
    monkeypatch.setattr(head_kernels, "talker_choose", lambda *a: calls.append(a) or kernel(*a))
    for rows, cap, used in ((0, 16, False), (kernels.MAX_ROWS, 16, True), (kernels.MAX_ROWS, 0, False),
                            (B - 1, 16, False)):
        fast.talker_choice_rows = rows
        sp = _rows(B, 16).rows(B, topk_cap=cap)
        n = len(calls)
        got = fast.sample_talker(logits, sp, seen, frames, allow, seeds, consts)
        assert (len(calls) > n) == used
        assert torch.equal(got, sampling.sample_talker(logits, sp, seen, frames, allow, seeds, consts))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_talker_rope_rows_are_each_positions_rope_and_the_table_is_made_once(dtype: torch.dtype) -> None:
    """FastPath._rope_rows against the talker's own rope at the same positions, bit for bit; a position past
    the cache (a free slot's stale one in a bucket's spare rows) reads the last row instead of failing."""
    from test_fastpath import model_and_fast

    from omni_tts.models.compiled.fast_path import FastPath

    m, _ = model_and_fast()
    fast = FastPath(m, None)
    L = 40
    pos = torch.tensor([0, 5, 39, 57, 1])
    for _ in range(2):
        cos, sin = fast._rope_rows(pos, L, dtype)
        want_cos, want_sin = m.talker.rope(pos.clamp(max=L - 1)[:, None], dtype)  # [5, 1, hd]
        assert cos.shape == want_cos.shape and torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    assert not torch.equal(cos[0], cos[1])
    assert len(fast._rope_tables) == 1
