"""Shared test set-up: one intra-op thread per test module (tiny matrices run several times faster
on one thread than on contended OpenMP threads on a 2-core machine); without CUDA, Triton in its
interpreter (set before anything imports triton)."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # omni_tts.kernels.layers' Triton kernels run in Triton's CPU interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
