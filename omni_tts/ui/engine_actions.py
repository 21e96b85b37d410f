"""Handlers of the engine panel's default-mode switch, the listening test and the load test.

Owns: the admin check in front of engine-wide actions (omni_tts.ui.support.AdminPolicy: the default
mode and the load test; the listening test runs ordinary per-request modes), the radio always showing
the engine's real default mode afterwards, one clip per mode, the A/B/X trial, and the tests' tables
(rounded; exports without server paths). Uses only the Engine's public API plus
omni_tts.ui.engine_access.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Mapping
from typing import Any

import gradio as gr
import pandas as pd

from omni_tts.config import SynthesisParams
from omni_tts.engine.metrics import summarize
from omni_tts.ui import engine_access, files, formatting
from omni_tts.ui import support as ui
from omni_tts.ui.handlers import log, user_errors


def _readiness(engine: Any) -> str:
    return formatting.readiness_markdown(engine_access.mode_readiness(engine), engine.mode_notes())


def apply_mode(engine: Any, mode: str, token: str | None = None, policy: ui.AdminPolicy = ui.LOCAL,
               zero: bool = False) -> tuple[str, Any, str]:
    """Make `mode` the engine's default (the mode of requests that name none): (status, radio, readiness).
    Whatever happens, the radio ends on the engine's real default mode; a refusal is also a toast."""
    why = engine.available_modes().get(mode, "unknown mode")
    if zero and mode not in ui.ZERO_GPU_MODES:
        why = "not on ZeroGPU (graphs captured at start-up do not survive between GPU calls)"
    try:
        policy.check(token, "Changing the default mode")
        if why is not None:
            raise ValueError(f"{mode} is unavailable here: {why}")
        engine.set_default_mode(mode)
    except Exception as e:
        message = str(e)
        gr.Warning(message)
        log.warning("default mode not changed: %s", message)
        return f"**Not changed:** {message}", gr.update(value=engine.mode.value), _readiness(engine)
    info = engine.modes()[mode]
    state = info.state
    later = "they run meanwhile, some slower until it is warm" if info.serving else "they wait until it is warm"
    status = f"**Done:** requests that name no mode now run `{engine.mode.value}`" + (
        "" if state == "ready" else f" (it is {state}: {later})")
    return status, gr.update(value=engine.mode.value), _readiness(engine)


# ------------------------------------------------------------------ listening test
def run_modes(engine: Any, modes: list[str], params: SynthesisParams) -> list[dict[str, Any]]:
    """Synthesize `params` once per mode (each request names its mode; the engine's default is untouched)."""
    clips: list[dict[str, Any]] = []
    for mode in modes:
        result = engine.synthesize(engine_access.with_mode(dataclasses.replace(params), mode))
        path = files.write_wav(result.wav, result.sample_rate, f"clip-{mode.replace('+', '-')}")
        clips.append({"mode": mode, "ran_as": result.metrics.mode, "path": path, "codes": result.codes,
                      "metrics": result.metrics})
    return clips


def listening_test(engine: Any, f: Mapping[str, Any], text: str, seed: float, modes: list[str],
                   tally: dict[str, Any] | None = None) -> tuple:
    """Clips per mode side by side, the code-matrix verdicts, exports, and a fresh A/B/X trial (the
    visitor's A/B/X tally in `tally` carries over)."""
    modes = list(modes or [])  # the UI offers each mode once; a repeated mode is a determinism check
    if len(modes) < 2:
        raise gr.Error("Modes to compare: choose at least two", print_exception=False)
    with user_errors("listening test"):
        params = ui.make_params(engine, {**f, "text": text, "seed": seed if seed is not None and seed >= 0 else 0})
        params.validate()
        clips = run_modes(engine, modes, params)
    base = clips[0]
    verdicts = [ui.verdict_text(base["mode"], c["mode"], base["codes"], c["codes"]) for c in clips[1:]]
    rows = [{"mode": c["mode"], "ran as": c["ran_as"], **dict(list(formatting.row(c["metrics"]).items())[3:]),
             "frames": len(c["codes"]), "same codes": ui.compare_codes(base["codes"], c["codes"])[0],
             "file": c["path"]} for c in clips]
    csv_path = files.write_csv(rows, "listening-results")
    audio = [gr.update(value=c["path"], label=f"{c['mode']} · TTFP {formatting.fmt(c['metrics'].ttfp_ms, ' ms')} · "
                       f"RTF {formatting.fmt(c['metrics'].rtf, '', 3)}", visible=True) for c in clips[:4]]
    audio += [gr.update(value=None, visible=False)] * (4 - len(audio))
    abx = {"trials": 0, "correct": 0, **(tally or {}), "a": clips[0]["path"], "b": clips[1]["path"],
           "modes": (clips[0]["mode"], clips[1]["mode"])}
    abx_state, x_path = new_abx_trial(abx)
    table = pd.DataFrame(rows).drop(columns=["file"])
    exports = gr.update(value=[c["path"] for c in clips] + [csv_path], visible=True)
    return (*audio, "\n\n".join(verdicts), table, exports, abx_state, x_path,
            f"A = `{abx['modes'][0]}`, B = `{abx['modes'][1]}`. Which one is X?")


def new_abx_trial(state: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Pick X at random (A or B) and copy that clip to a neutrally named file."""
    x_is = random.choice("AB")
    return {**state, "x_is": x_is}, files.copy_out(state["a"] if x_is == "A" else state["b"], "X")


def abx_guess(state: dict[str, Any], guess: str) -> tuple[dict[str, Any], str, Any]:
    new, line = ui.abx_record(state or {}, guess)
    if "a" not in new:
        return new, line, gr.skip()
    new, x_path = new_abx_trial(new)
    return new, line + " — a new X is ready.", x_path


# ------------------------------------------------------------------ load test
def load_test(engine: Any, f: Mapping[str, Any], n: float, mode: str, prompts: str, seed: float,
              token: str | None = None, policy: ui.AdminPolicy = ui.LOCAL) -> tuple:
    """N requests at once from the prompt list in `mode`; the summary and per-request tables."""
    texts = [t.strip() for t in (prompts or "").splitlines() if t.strip()]
    if not texts:
        raise gr.Error("Prompts is empty: give one prompt per line", print_exception=False)
    n = max(1, min(int(n or 1), engine.config.max_num_seqs))
    with user_errors("load test"):
        policy.check(token, "The load test (it fills the engine for every visitor)")
        template = engine_access.with_mode(ui.make_params(engine, {**f, "text": texts[0], "seed": seed}), mode or None)
        template.validate()
        t0 = time.perf_counter()
        handles = [engine.submit(dataclasses.replace(template, text=texts[i % len(texts)])) for i in range(n)]
        for h in handles:
            h.result()
        wall = time.perf_counter() - t0
    mode = handles[0].metrics.mode
    s = summarize([h.metrics for h in handles], wall)
    table = pd.DataFrame([formatting.load_row(mode, n, s)])
    per = pd.DataFrame([formatting.row(h.metrics, i + 1) for i, h in enumerate(handles)])
    return table, per, f"{int(s['requests'])}/{n} requests done in {wall:.2f} s"
