"""The talker step's rope rows on the compiled path (FastPath._rope_rows): gathered from a table made once per
cache length, bit for bit what the talker's own rope computes at each position."""

from __future__ import annotations

import pytest
import torch
from test_fastpath import model_and_fast

from omni_tts.models.compiled.fast_path import FastPath


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_talker_rope_rows_are_each_positions_rope_and_the_table_is_made_once(dtype: torch.dtype) -> None:
    """A position past the cache (a free slot's stale one in a bucket's spare rows) reads the last row
    instead of failing."""
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
