"""A model's modules called in one thread while torch.fx traces in another, as AOTAutograd does inside every
torch.compile (a mode compiling while another serves): an eager request served meanwhile, its prompt prepared
and its audio decoded in their own threads, ends as it ends alone (the tiny custom_voice checkpoint, CPU); and
`keep_module_calls` leaves a class with a __call__ of its own as it is."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from test_modes import TIMEOUT, config, greedy, lone_scheduler, queue_request, same
from torch import nn

from omni_tts.engine import offline
from omni_tts.models.module_calls import keep_module_calls


@contextmanager
def fx_trace_held_open() -> Iterator[None]:
    """A real torch.fx symbolic trace in another thread, held inside its traced forward (where the tracer has
    swapped nn.Module.__call__ process-wide) until the block ends."""
    entered, release = threading.Event(), threading.Event()

    class Held(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            entered.set()
            assert release.wait(TIMEOUT)
            return x + 1

    tracer = threading.Thread(target=lambda: torch.fx.symbolic_trace(Held()))
    tracer.start()
    try:
        assert entered.wait(TIMEOUT)
        assert nn.Module.__call__ is not nn.Module._wrapped_call_impl  # the tracer's swap is in force
        yield
    finally:
        release.set()
        tracer.join(TIMEOUT)
    assert nn.Module.__call__ is nn.Module._wrapped_call_impl


def test_an_eager_request_served_while_another_thread_traces_ends_as_alone(_one_thread) -> None:
    cfg = config()
    model, sched, audio = lone_scheduler(cfg)
    try:
        sched.warm(lambda s: None)
        p = greedy("served while another mode compiles", max_new_tokens=8)
        want = offline.synthesize(model, p)
        with fx_trace_held_open():
            got = queue_request(sched, model, 1, p).result(TIMEOUT)  # prepared here, decoded in the audio stage
        assert got.metrics.status == "done" and got.metrics.error is None
        same(got, want)
    finally:
        sched.stop()
        audio.stop()


def test_a_module_class_with_a_call_of_its_own_keeps_it() -> None:
    class Own(nn.Module):
        def __call__(self, x: int) -> str:
            return f"own {x}"

    class Heir(Own):
        pass

    class Plain(nn.Module):
        def forward(self, x: int) -> int:
            return x + 1

    own_call = vars(Own)["__call__"]
    root = nn.ModuleList([Own(), Heir(), Plain()])
    keep_module_calls(root)
    assert vars(Own)["__call__"] is own_call and "__call__" not in vars(Heir)
    assert vars(Plain)["__call__"] is nn.Module._wrapped_call_impl
    with fx_trace_held_open():
        assert (root[0](1), root[1](2), root[2](3)) == ("own 1", "own 2", 4)
