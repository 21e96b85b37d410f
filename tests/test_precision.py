"""The TF32 switches under concurrent exact and TF32 blocks (omni_tts.models.precision): exact blocks on two
threads overlap without one turning TF32 back on under the other, a TF32 block stays IEEE while any exact
block is open, and no exact block opens under a TF32 block. Driven by events, so every interleaving below
is forced, not timed."""

from __future__ import annotations

import threading

import torch

from omni_tts.models.precision import exact, tf32

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


def matmul_tf32_in(block) -> bool:
    with block:
        return torch.backends.cuda.matmul.allow_tf32


def test_a_tf32_block_is_ieee_while_an_exact_block_is_open_elsewhere() -> None:
    before = switches()
    assert matmul_tf32_in(tf32(CUDA)) is True and switches() == before
    held, leave = threading.Event(), threading.Event()
    t = in_thread(held, leave)
    try:
        assert held.wait(WAIT)
        assert matmul_tf32_in(tf32(CUDA)) is False
    finally:
        leave.set()
    t.join(WAIT)
    assert matmul_tf32_in(tf32(CUDA)) is True and switches() == before


def test_no_exact_block_opens_under_a_tf32_block() -> None:
    """An exact block asked for on another thread waits for the TF32 block to end; on the block's own
    thread one may open inside it (re-entrant), and each restores what it found."""
    before = switches()
    entered, asked = threading.Event(), threading.Event()
    inside: list[tuple[bool, bool]] = []

    def other() -> None:
        asked.set()
        with exact(CUDA):
            entered.set()
            inside.append(switches())

    with tf32(CUDA):
        t = threading.Thread(target=other)
        t.start()
        assert asked.wait(WAIT)
        t.join(0.2)  # not a timing decision: the block below must still see TF32 on either way
        assert not entered.is_set() and torch.backends.cuda.matmul.allow_tf32 is True
        with exact(CUDA):
            assert switches() == (False, False)
        assert torch.backends.cuda.matmul.allow_tf32 is True
    t.join(WAIT)
    assert entered.is_set() and inside == [(False, False)] and switches() == before


def test_off_cuda_a_tf32_block_changes_nothing() -> None:
    before = switches()
    with tf32(torch.device("cpu")):
        assert switches() == before


def test_off_cuda_an_exact_block_changes_nothing() -> None:
    before = switches()
    with exact(torch.device("cpu")):
        assert switches() == before
