"""The TF32 switches under concurrent exact blocks and TF32 matmuls (omni_tts.models.precision): blocks on
two threads overlap without one turning TF32 back on under the other, and a TF32 matmul call stays IEEE
while any exact block is open. Driven by events, so every interleaving below is forced, not timed."""

from __future__ import annotations

import threading

import torch

from omni_tts.models.precision import exact, tf32_matmul

CUDA = torch.device("cuda")  # only its type is read: the switches exist in CPU builds too
WAIT = 30.0


def switches() -> tuple[bool, bool]:
    return torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32


def in_thread(entered: threading.Event, leave: threading.Event) -> threading.Thread:
    def hold() -> None:
        with exact(CUDA):
            entered.set()
            assert leave.wait(WAIT)
    t = threading.Thread(target=hold)
    t.start()
    return t


def test_overlapping_exact_blocks_keep_tf32_off_until_the_last_ends() -> None:
    before = switches()
    a_in, a_out, b_in, b_out = (threading.Event() for _ in range(4))
    a = in_thread(a_in, a_out)
    try:
        assert a_in.wait(WAIT) and switches() == (False, False)
        b = in_thread(b_in, b_out)
        assert b_in.wait(WAIT)
        a_out.set()
        a.join(WAIT)
        assert switches() == (False, False)  # b's block is still open
    finally:
        a_out.set()
        b_out.set()
    b.join(WAIT)
    assert switches() == before


def test_a_tf32_matmul_is_ieee_while_an_exact_block_is_open_elsewhere() -> None:
    before = switches()
    seen = lambda: torch.backends.cuda.matmul.allow_tf32  # noqa: E731
    assert tf32_matmul(True, seen) is True and switches() == before
    assert tf32_matmul(False, seen) is before[1]
    held, leave = threading.Event(), threading.Event()
    t = in_thread(held, leave)
    try:
        assert held.wait(WAIT)
        assert tf32_matmul(True, seen) is False
    finally:
        leave.set()
    t.join(WAIT)
    assert tf32_matmul(True, seen) is True and switches() == before


def test_off_cuda_an_exact_block_changes_nothing() -> None:
    before = switches()
    with exact(torch.device("cpu")):
        assert switches() == before
