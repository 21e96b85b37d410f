"""The page: `build_demo(engine)` lays out the tabs and wires every event to its handler.

Owns: the page's arrangement (Synthesis with Generate near the top, Listening test, Load test, the
engine panel beside them), the banner (model, and streaming off when ffmpeg is missing), which events
are private (all but the named /synthesize API of omni_tts.ui.api), concurrency groups, and the
per-visitor state (history, plotted marker, A/B/X tally). Nothing is launched here.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from omni_tts import voices
from omni_tts.ui import api, engine_access, engine_actions, formatting, handlers, labels, tabs
from omni_tts.ui import support as ui

PRIVATE = {"api_visibility": "private"}
# Tables never break a word or a number: headers and cells stay on one line, and a table wider than its
# column scrolls sideways inside it (".table-wrap" is gr.Dataframe's, ".metrics" the panel's markdown).
CSS = (".metrics table {font-size: 0.85em; display: block; overflow-x: auto; max-width: 100%} "
       ".metrics th, .metrics td, .nowrap-table th, .nowrap-table td, .nowrap-table th *, .nowrap-table td * "
       "{white-space: nowrap !important; word-break: keep-all !important; overflow-wrap: normal !important} "
       ".nowrap-table .table-wrap {overflow-x: auto} "
       "#char-counter {text-align: right; opacity: 0.7; margin-top: -0.5em} "
       "#notice p {font-size: 0.9em} .small {font-size: 0.85em}")
DELETE_CACHE = (600, 3600)  # every 10 minutes, Gradio removes its cached copies older than an hour


def banner_markdown(info: dict, reason: str, streaming: bool) -> str:
    lines = [f"## omni-tts · Qwen3-TTS 12 Hz\n**Model:** {labels.model_description(info['describe'])}"]
    if reason:
        lines.append(f"*Why this model:* {reason}")
    if info["embedded"]:
        lines.append("> **Note:** this is the embedded tiny **random** demo checkpoint: it produces "
                     "**noise, not speech**. Load a real one with "
                     "`python app.py --model Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice` "
                     "(or `--model /path/to/checkpoint_dir`, or env `OMNI_TTS_MODEL`).")
    if not streaming:
        lines.append("> **Streaming off:** clips play when finished (ffmpeg is not installed on the server), so "
                     "*playable* is E2E, not TTFP. Install ffmpeg for streaming playback.")
    return "\n\n".join(lines)


def build_demo(engine: Any, model_reason: str = "", zero: bool = False,
               policy: ui.AdminPolicy = ui.LOCAL, streaming: bool | None = None) -> gr.Blocks:
    """The whole page over `engine`; nothing is launched."""
    info = engine.model_info()
    streaming = (ui.streaming_playback_supported() if streaming is None else streaming) and not zero
    available = engine.available_modes()
    modes = [m for m in formatting.MODES if available.get(m) is None and (not zero or m in ui.ZERO_GPU_MODES)]
    max_len = max(2, min(2048, engine.config.max_seq_len - 64))
    snap = engine.snapshot()
    readiness = formatting.readiness_markdown(engine_access.mode_readiness(engine), engine.mode_notes())
    with gr.Blocks(title="omni-tts", delete_cache=DELETE_CACHE) as demo:
        gr.Markdown(banner_markdown(info, model_reason or info["reason"], streaming), elem_id="banner")
        history, plotted = gr.State([]), gr.State(-1)
        with gr.Row():
            with gr.Column(scale=3):
                with gr.Tab("Synthesis", elem_id="tab-synthesis"):
                    s = tabs.synthesis_form(info, max_len, modes, streaming)
                    tabs.examples(s, info)
                with gr.Tab("Listening test", elem_id="tab-listening"):
                    lt = tabs.listening_tab(modes, engine_access.mode_readiness(engine))
                with gr.Tab("Load test", elem_id="tab-load"):
                    ld = tabs.load_tab(engine.config.max_num_seqs, modes, snap.mode)
            with gr.Column(scale=2):
                p = tabs.engine_panel(policy, snap.mode, readiness, snap)
        ctx = {"engine": engine, "info": info, "policy": policy, "zero": zero}
        _wire_synthesis(ctx, s, p, history)
        _wire_panel(ctx, p, history, plotted)
        _wire_tests(ctx, s, p, lt, ld)
        api.add_endpoint(engine, info)
        # the voice store may have changed since the page was built (a voice saved by another visitor or
        # over HTTP): read it on every page load, off the queue so a running synthesis never delays it
        demo.load(lambda v: handlers.saved_voice_choices(v), [s["saved_voice"]], [s["saved_voice"]], queue=False,
                  show_progress="hidden", **PRIVATE)

        def on_leave(request: gr.Request):  # a closed tab or a gradio_client gone: its requests end
            handlers.left(request)

        demo.unload(on_leave)
    return demo


def _form(s: dict) -> list:
    return [s[k] for k in ui.FORM_FIELDS]


def _wire_synthesis(ctx: dict, s: dict, p: dict, history: Any) -> None:
    engine, info = ctx["engine"], ctx["info"]
    outputs = [s["audio_stream"], s["audio_full"], s["file"], p["live"], history, s["notice"]]
    if ctx["zero"]:  # ZeroGPU: the GPU exists only inside @spaces.GPU calls: whole clips in one call
        import spaces  # type: ignore[import-not-found]

        @spaces.GPU
        def on_generate(hist, streaming, *vals):
            return handlers.synthesize_in_call(engine, dict(zip(ui.FORM_FIELDS, vals)), hist, info)
    else:
        def on_generate(request: gr.Request, hist, streaming, *vals):  # Gradio fills `request` itself
            yield from handlers.synthesize(engine, dict(zip(ui.FORM_FIELDS, vals)), hist, streaming, request, info)
    s["go"].click(lambda: ("", gr.update(visible=False)), None, [s["notice"], s["file"]], queue=False, **PRIVATE)
    _follow(s["go"], p["timer"], p["idle"])
    s["go"].click(on_generate, [history, s["streaming"], *_form(s)], outputs, concurrency_id="synthesis",
                  **PRIVATE)

    def on_stop(request: gr.Request):
        handlers.stop(request)

    # queued (a toast needs the queue's event stream) but never waiting behind other events
    s["stop"].click(on_stop, None, None, concurrency_limit=None, show_progress="hidden", **PRIVATE)
    s["text"].change(None, [s["text"]], [s["counter"]], js=tabs.counter_js(tabs.max_text()), queue=False, **PRIVATE)

    def players(on: bool, speed: float) -> tuple:  # a Speed other than 1 plays whole clips: the plain player
        live = bool(on) and speed == 1
        return gr.update(visible=live), gr.update(visible=not live)

    for control in (s["streaming"], s["speed"]):
        control.change(players, [s["streaming"], s["speed"]], [s["audio_stream"], s["audio_full"]], queue=False,
                       **PRIVATE)
    s["task"].change(lambda t: (gr.update(visible=t == "custom_voice"), gr.update(visible=ui.instruct_visible(info, t)),
                                gr.update(visible=t == "voice_clone")),
                     [s["task"]], [s["speaker"], s["instruct"], s["clone_group"]], queue=False, **PRIVATE)
    s["voice_save"].click(lambda name, *vals: handlers.voice_save(engine, dict(zip(ui.FORM_FIELDS, vals)), name),
                          [s["voice_name"], *_form(s)], [s["saved_voice"], s["voice_out"]], **PRIVATE)
    # the library changes behind the page too (POST /v1/audio/voices): list it afresh when opened
    s["saved_voice"].focus(lambda: gr.update(choices=[""] + voices.saved_voices()), None, s["saved_voice"],
                           queue=False, **PRIVATE)


SETTLED_TICKS = 3  # the timer stops after this many ticks in a row found nothing to follow


def _follow(button: Any, timer: Any, idle: Any) -> None:
    """A click on `button` starts the panel's timer (which stops itself once everything has settled)."""
    button.click(lambda: (gr.Timer(active=True), 0), None, [timer, idle], queue=False, show_progress="hidden",
                 **PRIVATE)


def _wire_panel(ctx: dict, p: dict, history: Any, plotted: Any) -> None:
    engine, policy, zero = ctx["engine"], ctx["policy"], ctx["zero"]

    p["apply"].click(lambda mode, token: engine_actions.apply_mode(engine, mode, token, policy, zero),
                     [p["mode"], p["token"]], [p["mode_status"], p["mode"], p["readiness"]], **PRIVATE)

    def on_tick(hist, marker, idle, request: gr.Request):
        # a few refreshes after everything settled (a request's last figures and plot point land in the
        # visitor's history just after the engine finishes it), then the timer stops: an idle page costs nothing
        idle = idle + 1 if handlers.settled(engine, request) else 0
        return (*handlers.refresh_panel(engine, hist, marker, request), idle,
                gr.Timer(active=idle < SETTLED_TICKS))

    # off the queue: the panel's ticks never wait behind (or hold up) the synthesis events
    p["timer"].tick(on_tick, [history, plotted, p["idle"]], [p["live"], p["engine"], p["readiness"], p["ttfp_plot"],
                                                             p["rtf_plot"], plotted, p["idle"], p["timer"]],
                    show_progress="hidden", queue=False, **PRIVATE)


def _wire_tests(ctx: dict, s: dict, p: dict, lt: dict, ld: dict) -> None:
    engine, policy = ctx["engine"], ctx["policy"]

    def on_listen(st, text, seed, modes, *vals):
        return engine_actions.listening_test(engine, dict(zip(ui.FORM_FIELDS, vals)), text, seed, modes, st)

    for button in (lt["run"], ld["run"], p["apply"]):
        _follow(button, p["timer"], p["idle"])
    lt["run"].click(on_listen, [lt["abx"], lt["text"], lt["seed"], lt["modes"], *_form(s)],
                    [*lt["clips"], lt["verdict"], lt["table"], lt["export"], lt["abx"], lt["x_audio"], lt["abx_info"]],
                    concurrency_limit=2, **PRIVATE)
    for key, guess in (("pick_a", "A"), ("pick_b", "B")):
        lt[key].click(lambda st, g=guess: engine_actions.abx_guess(st, g), [lt["abx"]],
                      [lt["abx"], lt["tally"], lt["x_audio"]], **PRIVATE)

    def on_load(token, n, mode, prompts, seed, *vals):
        return engine_actions.load_test(engine, dict(zip(ui.FORM_FIELDS, vals)), n, mode, prompts, seed, token, policy)

    ld["run"].click(on_load, [p["token"], ld["n"], ld["mode"], ld["prompts"], ld["seed"], *_form(s)],
                    [ld["table"], ld["per"], ld["status"]], concurrency_limit=1, concurrency_id="engine-mode",
                    **PRIVATE)
