"""Shared test set-up: one intra-op thread per test module (tiny matrices run several times faster
on one thread than on contended OpenMP threads on a 2-core machine)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
