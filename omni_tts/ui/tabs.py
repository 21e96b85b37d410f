"""The Gradio components of the app's page: the Synthesis form, the engine panel, the listening-test
and load-test tabs, and the hidden inputs of the named /synthesize API.

Owns: which controls each part of the page has, their labels, help texts (`info=`), ranges (from
omni_tts.limits.LIMITS), initial values and element ids (the browser test finds them by id); each
builder runs inside the caller's layout context and returns its components in a dict keyed by role.
Knows nothing about event handling (omni_tts.ui.layout wires them) or device math.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gradio as gr

from omni_tts import limits
from omni_tts.engine.snapshot import EngineSnapshot
from omni_tts.models import stretch
from omni_tts.ui import files, formatting, labels, plots
from omni_tts.ui import support as ui

DEFAULT_PROMPTS = ("Hello! This is omni-tts speaking.\nThe quick brown fox jumps over the lazy dog.\n"
                   "Streaming speech starts playing at the first chunk.\nHow fast can this engine talk?")
N_CLIPS = 4  # listening-test clip slots (one per mode)


def max_text() -> int:
    """The longest text a request takes (limits.MAX_INPUT_CHARS: the box, the counter and the notice)."""
    return int(limits.MAX_INPUT_CHARS)


def counter_js(limit: int) -> str:
    """The character counter, updated in the browser; past the limit it says Generate will refuse it."""
    return (f"(t) => {{ const n = (t || '').length; return n > {limit} ? `${{n}} / {limit} characters: "
            f"too long, Generate refuses texts over {limit}; shorten it` : `${{n}} / {limit} characters`; }}")


def _bounds(field: str, step: float) -> tuple[float, float]:
    """A slider's range: exactly the bounds SynthesisParams.validate enforces (limits.LIMITS), so the page
    and the API accept the same values; an open lower end starts one step above it."""
    limit = limits.LIMITS[field]
    return float(limit.low) + (step if limit.low_open else 0.0), float(limit.high)


def synthesis_form(info: Mapping[str, Any], max_len: int, modes: list[str], streaming: bool) -> dict[str, Any]:
    """Text, voice, Generate/Stop, output, clone fields, sampling and examples (inside the caller's layout)."""
    gen, c = info["generation"], {}
    text = "Hello! This is omni-tts speaking."
    # no max_length on the box: the browser would cut a longer paste silently; the counter says it instead
    c["text"] = gr.Textbox(label="Text", lines=3, value=text, elem_id="text")
    c["counter"] = gr.Markdown(f"{len(text)} / {max_text()} characters", elem_id="char-counter", elem_classes="small")
    tasks = [(ui.TASK_LABELS[t], t) for t in ui.TASK_LABELS if t in info["tasks"]]
    first = tasks[0][1] if tasks else "custom_voice"
    with gr.Row(equal_height=True):
        c["task"] = gr.Radio(tasks, value=first, label="Task", scale=1)
        c["speaker"] = gr.Dropdown(labels.speaker_choices(info["speakers"]),
                                   value=labels.default_speaker(info["speakers"]), label="Speaker",
                                   visible=first == "custom_voice", scale=2, elem_id="speaker")
        langs = info["languages"] or ["auto"]
        auto = next((x for x in langs if x.lower() == "auto"), langs[0])
        c["language"] = gr.Dropdown(labels.language_choices(langs), value=auto, label="Language", scale=1)
        c["speed"] = gr.Slider(stretch.MIN_SPEED, stretch.MAX_SPEED, value=1.0, step=0.05, label="Speed", scale=1,
                               info="pitch kept; other than 1, the clip plays when complete", elem_id="speed")
    c["instruct"] = gr.Textbox(label="Instruct", lines=1, visible=ui.instruct_visible(info, first),
                               info="How to speak (CustomVoice: tone, emotion, pace) or, for VoiceDesign, a "
                                    "description of the voice itself", elem_id="instruct")
    with gr.Row(equal_height=True):
        c["go"] = gr.Button("Generate", variant="primary", elem_id="generate", scale=2)
        c["stop"] = gr.Button("Stop", variant="stop", elem_id="stop", scale=1)
        c["streaming"] = gr.Checkbox(streaming, label="Stream audio while it is made", interactive=streaming,
                                     elem_id="streaming", scale=2)
        c["mode"] = gr.Dropdown([("Engine default", "")] + [(m, m) for m in modes], value="", label="Mode",
                                elem_id="request-mode", scale=2)
    c["audio_stream"] = gr.Audio(label="Output", streaming=True, autoplay=True, interactive=False,
                                 visible=streaming, elem_id="output-stream", buttons=["download"])
    c["audio_full"] = gr.Audio(label="Output", autoplay=True, interactive=False, visible=not streaming,
                               elem_id="output-audio", buttons=["download"])
    c["notice"] = gr.Markdown("", elem_id="notice")
    c["file"] = gr.File(label="Download wav", interactive=False, visible=False, elem_id="download")
    c.update(_clone_fields(first == "voice_clone"))
    c.update(_sampling(gen, max_len))
    return c


def _clone_fields(visible: bool) -> dict[str, Any]:
    c: dict[str, Any] = {}
    with gr.Group(visible=visible, elem_id="clone") as c["clone_group"]:
        with gr.Row(equal_height=True):
            c["ref_audio"] = gr.Audio(sources=["upload", "microphone"], type="filepath", label="Reference audio",
                                      elem_id="ref-audio", scale=1)
            with gr.Column(scale=1):
                c["ref_text"] = gr.Textbox(label="Reference text", lines=2,
                                           info="What the reference clip says (needed unless the box below is ticked)")
                c["xvec_only"] = gr.Checkbox(label="Voice from the clip only (no reference text; lower fidelity)")
        with gr.Row(equal_height=True):
            c["saved_voice"] = gr.Dropdown([""] + files.saved_voices(), value="", label="Saved voice",
                                           info="Use a voice from the library instead of the clip", scale=2)
            c["voice_file"] = gr.File(label="Or upload a voice file", file_types=[".safetensors"], type="filepath",
                                      height=90, scale=2)
        with gr.Row(equal_height=True):
            c["voice_name"] = gr.Textbox(label="Save this voice as", placeholder="my voice", scale=2)
            c["voice_save"] = gr.Button("Save voice", size="md", scale=1)
            c["voice_out"] = gr.File(label="Saved voice file", interactive=False, visible=False, scale=2)
    return c


def _sampling(gen: Mapping[str, Any], max_len: int) -> dict[str, Any]:
    c: dict[str, Any] = {}
    with gr.Accordion("Sampling", open=False, elem_id="sampling"):
        with gr.Row():
            lo, hi = _bounds("temperature", 0.05)
            c["temperature"] = gr.Slider(lo, hi, value=gen.get("temperature", 0.9), step=0.05, label="Temperature",
                                         info="0 always picks the likeliest sound")
            lo, hi = _bounds("top_k", 1)
            c["top_k"] = gr.Slider(lo, hi, value=gen.get("top_k", 50), step=1, label="Top-k", info="0: off")
            lo, hi = _bounds("top_p", 0.05)
            c["top_p"] = gr.Slider(lo, hi, value=gen.get("top_p", 1.0), step=0.05, label="Top-p")
        with gr.Row():
            lo, hi = _bounds("repetition_penalty", 0.01)
            c["rep"] = gr.Slider(lo, hi, value=gen.get("repetition_penalty", 1.05), step=0.01,
                                 label="Repetition penalty")
            seed_max = _bounds("seed", 1)[1]
            c["seed"] = gr.Number(value=-1, precision=0, minimum=-1, maximum=seed_max, label="Seed",
                                  info="-1: a new random seed each time")
            hi = min(max_len, int(limits.LIMITS["max_new_tokens"].high)) - 1  # frames: max_new_tokens - 1
            c["max_len"] = gr.Slider(1, hi, value=min(hi, int(gen.get("max_new_tokens", hi + 1)) - 1), step=1,
                                     label="Max length", info="in frames; 12.5 frames make one second",
                                     elem_id="max-len")
    return c


def examples(c: Mapping[str, Any], info: Mapping[str, Any]) -> Any:
    """The examples table for this checkpoint's tasks and languages (a click fills the form)."""
    rows = labels.examples(info["tasks"], info["languages"], info["speakers"])
    if not rows:
        return None
    return gr.Examples(rows, [c["text"], c["language"], c["task"], c["speaker"], c["instruct"]],
                       label="Examples (click one to fill the form)", elem_id="examples",
                       api_visibility="private")


def engine_panel(policy: ui.AdminPolicy, current: str, readiness: str, snapshot: EngineSnapshot) -> dict:
    """This visitor's figures and plots, then the engine-wide figures, readiness and the mode switch."""
    c: dict[str, Any] = {}
    c["live"] = gr.Markdown(formatting.live_markdown(None, None), elem_id="live-metrics", elem_classes="metrics")
    gr.Markdown(f"<small>{labels.METRICS_INFO}</small>", elem_id="metric-definitions")
    c["ttfp_plot"] = gr.HTML(plots.scatter_svg([], "ttfp_ms", "TTFP of your requests (ms)", " ms"),
                             elem_id="ttfp-plot")
    c["rtf_plot"] = gr.HTML(plots.scatter_svg([], "rtf", "RTF of your requests"), elem_id="rtf-plot")
    c["engine"] = gr.Markdown(formatting.engine_markdown(snapshot), elem_id="engine-figures")
    c["readiness"] = gr.Markdown(readiness, elem_id="mode-readiness")
    with gr.Accordion("Default mode (for every visitor)", open=False, elem_id="engine-mode"):
        with gr.Row(equal_height=True):
            c["mode"] = gr.Radio(list(formatting.MODES), value=current, label="Default compile mode",
                                 elem_id="mode-radio", scale=3)
            c["apply"] = gr.Button("Set as default", elem_id="apply-mode", scale=1)
        c["token"] = gr.Textbox(label="Admin token", type="password", visible=policy.asks_token,
                                elem_id="admin-token", info="needed for engine-wide actions on this server")
        c["mode_status"] = gr.Markdown("", elem_id="mode-status")
    c["timer"] = gr.Timer(1.0)  # active at first (modes warm at start); each tick decides whether to go on
    c["idle"] = gr.State(0)  # ticks in a row that found nothing to follow
    return c


def single_mode_notice(modes: list[str], readiness: Mapping[str, str]) -> str:
    """Why the listening test cannot compare here, and how to give the server a second mode."""
    why = "\n".join(f"- `{m}`: {state}" for m, state in readiness.items() if m not in modes)
    return (f"**Nothing to compare on this server:** the listening test plays the same text in two or more "
            f"modes, and only `{modes[0] if modes else 'none'}` runs here.\n\n{why}\n\n"
            "To enable a second mode, list it in a preset file, e.g. `modes: [eager, default]` (on a CUDA GPU "
            "also `reduce-overhead`, `default+cudagraph`), and start the app with `python app.py --preset "
            "FILE`. On a CPU, `default` compiles for minutes at start, on every core.")


def listening_tab(modes: list[str], readiness: Mapping[str, str] | None = None) -> dict[str, Any]:
    c: dict[str, Any] = {}
    can = len(modes) >= 2
    c["single"] = gr.Markdown(single_mode_notice(modes, readiness or {}) if not can else "",
                              visible=not can, elem_id="listening-single-mode")
    with gr.Column(visible=can, elem_id="listening-controls"):
        _listening_controls(c, modes)
    return c


def _listening_controls(c: dict[str, Any], modes: list[str]) -> None:
    gr.Markdown("The same text and seed, once per mode; voice, language and sampling come from the Synthesis tab. "
                "Then a blind A/B/X trial: can you hear which clip X is?")
    with gr.Row(equal_height=True):
        c["text"] = gr.Textbox(label="Text", value="The quick brown fox jumps over the lazy dog.", scale=3)
        c["seed"] = gr.Number(value=1234, precision=0, minimum=0, label="Seed", scale=1)
    c["modes"] = gr.CheckboxGroup(modes, value=modes[:2], label="Modes to compare (two or more)")
    c["run"] = gr.Button("Run listening test", variant="primary")
    with gr.Row():
        c["clips"] = [gr.Audio(label=f"clip {i + 1}", visible=i < 2, interactive=False) for i in range(N_CLIPS)]
    c["verdict"] = gr.Markdown()
    c["table"] = gr.Dataframe(label="Figures per mode", interactive=False, wrap=False, elem_classes="nowrap-table",
                              headers=["mode", "ran as", *formatting.ROW_COLUMNS[3:], "frames", "same codes"])
    c["export"] = gr.File(label="Export: clips + results CSV", file_count="multiple", interactive=False, visible=False)
    gr.Markdown("#### Blind test: which clip is X?")
    c["abx_info"] = gr.Markdown("Run the test, then listen to X and say which clip it matches.")
    with gr.Row(equal_height=True):
        c["x_audio"] = gr.Audio(label="X", interactive=False, scale=2)
        c["pick_a"], c["pick_b"] = gr.Button("X is clip A", scale=1), gr.Button("X is clip B", scale=1)
    c["tally"] = gr.Markdown()
    c["abx"] = gr.State({})


def load_tab(max_num_seqs: int, modes: list[str], current: str) -> dict[str, Any]:
    c: dict[str, Any] = {}
    gr.Markdown("N requests at once (voice and sampling from the Synthesis tab), then their figures. "
                "The engine is shared: other visitors' requests wait meanwhile.")
    with gr.Row(equal_height=True):
        c["n"] = gr.Slider(1, max(2, max_num_seqs), value=max_num_seqs, step=1,
                           label=f"Requests at once (at most {max_num_seqs})")
        c["mode"] = gr.Dropdown(modes, value=current, label="Mode")
        c["seed"] = gr.Number(value=0, precision=0, minimum=0, label="Seed")
    c["prompts"] = gr.Textbox(label="Prompts (one per line, cycled)", lines=4, value=DEFAULT_PROMPTS)
    c["run"] = gr.Button("Run load test", variant="primary")
    c["status"] = gr.Markdown()
    c["table"] = gr.Dataframe(label="Summary", interactive=False, headers=list(formatting.LOAD_COLUMNS), wrap=False,
                              elem_classes="nowrap-table", elem_id="load-summary")
    c["per"] = gr.Dataframe(label="Per request", interactive=False, headers=list(formatting.ROW_COLUMNS),
                            wrap=False, elem_classes="nowrap-table", elem_id="load-per-request")
    return c
