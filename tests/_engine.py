"""The engine tests' helpers: a small eager CPU engine on a tiny checkpoint, the plain single-request
reference path (cached), the golden cases as requests, and checks that an engine still serves
(tests/conftest.py's `engine` fixture is one such engine per test module)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from _fixtures import fixture_dir

from omni_tts.config import CompileMode, SynthesisParams, build_config
from omni_tts.engine import offline
from omni_tts.engine.engine import Engine, RequestHandle
from omni_tts.engine.mode_scheduler import ModeScheduler

SR = 24000
SPF = 1920  # samples per 12.5 Hz frame at 24 kHz (0.08 s)
TIMEOUT = 120.0  # a hang fails the test instead of the suite


def make_engine(model: Path | str, **kw) -> Engine:
    """An eager CPU engine; experimental keys may be given bare, as in a preset."""
    cfg = dict(mode="eager", device="cpu", max_num_seqs=3, max_seq_len=256, initial_chunk_frames=1,
               chunk_frames=4, chunk_growth=False)
    cfg.update(kw)
    return Engine.from_config(build_config({"model": str(model), **cfg}))


def scheduler(eng: Engine, mode: CompileMode = CompileMode.EAGER) -> ModeScheduler:
    """The scheduler (thread, runner, slots) serving `mode` in `eng`."""
    return eng.schedulers[mode]



_PLAIN: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def plain(eng: Engine, p: SynthesisParams) -> tuple[np.ndarray, np.ndarray]:
    """The plain single-request reference path (TTSModel.synthesize): (wav, codes). Call while idle."""
    key = (str(eng.model.ckpt.path), repr(p))
    if key not in _PLAIN:
        wav, codes = offline.synthesize(eng.model, p)
        _PLAIN[key] = (wav, codes.numpy())
    return _PLAIN[key]


def golden_case(name: str, i: int) -> dict:
    cases = json.loads((fixture_dir(name) / "golden" / "cases.json").read_text())["cases"]
    return next(c for c in cases if c["case"] == i)


def case_params(case: dict, **kw) -> SynthesisParams:
    """A golden case as a request: greedy talker and predictor, max_new_tokens 40 (cases.json)."""
    args = dict(text=case["text"], task=case["task"], speaker=case.get("speaker"), language=case["language"],
                instruct=case.get("instruct"), non_streaming_mode=case.get("non_streaming_mode"),
                do_sample=False, subtalker_do_sample=False, max_new_tokens=40)
    args.update(kw)
    return SynthesisParams(**args)


def greedy(text: str, speaker: str = "ryan", **kw) -> SynthesisParams:
    return SynthesisParams(text=text, speaker=speaker, language="English", greedy=True, **kw)


def good(eng: Engine) -> None:
    """A small valid request succeeds: the engine is still serving."""
    r = eng.synthesize(greedy("still serving", max_new_tokens=4), timeout=TIMEOUT)
    assert r.metrics.status == "done" and r.codes.shape == (3, 16) and r.wav.size == 3 * SPF


def collect(h: RequestHandle) -> list:
    return list(h.stream(timeout=TIMEOUT))


def assert_same_as_plain(eng: Engine, p: SynthesisParams, codes: np.ndarray, wav: np.ndarray) -> None:
    ref_wav, ref_codes = plain(eng, p)
    assert codes.dtype == np.int64 and codes.shape == ref_codes.shape
    np.testing.assert_array_equal(codes, ref_codes)
    assert wav.dtype == np.float32 and wav.shape == ref_wav.shape
    assert float(np.abs(wav - ref_wav).max()) <= 1e-4
