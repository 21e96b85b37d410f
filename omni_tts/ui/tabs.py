"""The Gradio components of the app's page: Synthesis inputs, engine panel, listening-test and load-test tabs.

Owns: which controls each part of the page has, their labels, ranges, initial values and element
ids (the browser test finds them by id); each builder runs inside the caller's layout context and
returns its components in a dict keyed by role. Knows nothing about event handling (app.py wires
the components to its handlers) or device math: from the engine it reads only its snapshot and config.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from omni_tts.ui import support as ui

DEFAULT_PROMPTS = ("Hello! This is omni-tts speaking.\nThe quick brown fox jumps over the lazy dog.\n"
                   "Streaming speech starts playing at the first chunk.\nHow fast can this engine talk?")
N_CLIPS = 4  # listening-test clip slots (one per mode)


def synthesis_inputs(info: dict[str, Any], max_len: int) -> dict[str, Any]:
    """Text, task, voice and sampling controls (created inside the caller's layout context)."""
    gen, c = info["generation"], {}
    c["text"] = gr.Textbox(label="Text", lines=3, value="Hello! This is omni-tts speaking.", elem_id="text")
    tasks = [ui.TASK_LABELS[t] for t in ui.TASK_LABELS if t in info["tasks"]]
    with gr.Row():
        c["task"] = gr.Radio(tasks, value=tasks[0] if tasks else None, label="Task")
        c["speaker"] = gr.Dropdown(info["speakers"], value=(info["speakers"] or [None])[0], label="Speaker",
                                   visible=tasks[:1] == ["CustomVoice"])
        langs = info["languages"] or ["Auto"]
        auto = next((x for x in langs if x.lower() == "auto"), langs[0])
        c["language"] = gr.Dropdown(langs, value=auto, label="Language")
    c["instruct"] = gr.Textbox(label="Instruct (voice / style description)", lines=2,
                               visible=ui.instruct_visible(info, tasks[0] if tasks else ""))
    with gr.Group(visible=tasks[:1] == [ui.TASK_LABELS["voice_clone"]]) as c["clone_group"]:
        c["ref_audio"] = gr.Audio(sources=["upload", "microphone"], type="numpy", label="Reference audio")
        c["ref_text"] = gr.Textbox(label="Reference text (what the reference says)")
        c["xvec_only"] = gr.Checkbox(label="x-vector only (no reference text needed; lower fidelity)")
        with gr.Row():
            c["voice_file"] = gr.File(label="Load a saved voice", file_types=[".safetensors"], type="filepath",
                                      height=90)
            c["voice_save"] = gr.Button("Save voice file", size="sm")
            c["voice_out"] = gr.File(label="Saved voice", interactive=False, height=90)
    with gr.Accordion("Sampling", open=False, elem_id="sampling"):
        with gr.Row():
            c["temperature"] = gr.Slider(0.0, 2.0, value=gen.get("temperature", 0.9), step=0.05, label="Temperature")
            c["top_k"] = gr.Slider(1, 200, value=gen.get("top_k", 50), step=1, label="Top-k")
            c["top_p"] = gr.Slider(0.05, 1.0, value=gen.get("top_p", 1.0), step=0.05, label="Top-p")
        with gr.Row():
            c["rep"] = gr.Slider(1.0, 2.0, value=gen.get("repetition_penalty", 1.05), step=0.01,
                                 label="Repetition penalty")
            c["seed"] = gr.Number(value=-1, precision=0, label="Seed (-1: random)")
            c["max_len"] = gr.Slider(1, max_len, value=min(max_len, int(gen.get("max_new_tokens", max_len))), step=1,
                                     label="Max length (frames, 12.5 per second)", elem_id="max-len")
    return c


def engine_panel(engine: Any, modes: list[str], notes: str) -> dict[str, Any]:
    c: dict[str, Any] = {}
    gr.Markdown("### Engine")
    with gr.Row():
        c["mode"] = gr.Radio(list(ui.MODES), value=engine.snapshot()["mode"], label="Compile mode",
                             elem_id="mode-radio")
        c["apply"] = gr.Button("Apply mode", elem_id="apply-mode")
    c["mode_status"] = gr.Markdown("", elem_id="mode-status")
    gr.Markdown(notes, elem_id="mode-notes")
    c["live"] = gr.Markdown(ui.live_markdown(None, None), elem_id="live-metrics", elem_classes="metrics")
    c["engine"] = gr.Markdown(ui.engine_markdown(engine.snapshot()), elem_id="engine-figures")
    empty = ui.history_frame([])
    c["ttfp_plot"] = gr.ScatterPlot(empty, x="request", y="ttfp_ms", color="mode", title="TTFP (ms), recent requests",
                                    height=170, y_title="TTFP ms")
    c["rtf_plot"] = gr.ScatterPlot(empty, x="request", y="rtf", color="mode", title="RTF, recent requests",
                                   height=170, y_title="RTF")
    c["timer"] = gr.Timer(1.0)
    return c


def listening_tab(modes: list[str]) -> dict[str, Any]:
    c: dict[str, Any] = {}
    gr.Markdown("Same text, same seed, run once per mode (the engine switches mode for each, then restores). "
                "Voice, language and sampling come from the Synthesis tab.")
    with gr.Row():
        c["text"] = gr.Textbox(label="Text", value="The quick brown fox jumps over the lazy dog.", scale=3)
        c["seed"] = gr.Number(value=1234, precision=0, label="Seed", scale=1)
    c["modes"] = gr.CheckboxGroup(modes, value=modes[:2], label="Modes to compare (two or more)")
    c["run"] = gr.Button("Run listening test", variant="primary")
    with gr.Row():
        c["clips"] = [gr.Audio(label=f"clip {i + 1}", visible=i < 2, interactive=False) for i in range(N_CLIPS)]
    c["verdict"] = gr.Markdown()
    c["table"] = gr.Dataframe(label="Metrics per mode", interactive=False,
                              headers=["mode", "ran_as", "ttfp_ms", "e2e_ms", "rtf", "audio_s", "frames"])
    c["export"] = gr.File(label="Export: clips + results CSV", file_count="multiple", interactive=False)
    gr.Markdown("#### Blind A/B/X")
    c["abx_info"] = gr.Markdown("run the test, then listen to X and say which clip it matches")
    c["x_audio"] = gr.Audio(label="X", interactive=False)
    with gr.Row():
        c["pick_a"], c["pick_b"] = gr.Button("X is A"), gr.Button("X is B")
    c["tally"] = gr.Markdown()
    c["abx"] = gr.State({})
    return c


def load_tab(engine: Any, modes: list[str]) -> dict[str, Any]:
    c: dict[str, Any] = {}
    gr.Markdown("N concurrent requests (voice and sampling from the Synthesis tab), then the seed-PR table.")
    with gr.Row():
        top = engine.config.max_num_seqs
        c["n"] = gr.Slider(1, max(2, top), value=top, step=1, label=f"Concurrent requests N (at most {top})")
        c["mode"] = gr.Dropdown(modes, value=engine.snapshot()["mode"], label="Mode")
        c["seed"] = gr.Number(value=0, precision=0, label="Seed")
    c["prompts"] = gr.Textbox(label="Prompts (one per line, cycled)", lines=4, value=DEFAULT_PROMPTS)
    c["run"] = gr.Button("Run load test", variant="primary")
    c["status"] = gr.Markdown()
    c["table"] = gr.Dataframe(label="Run summary", interactive=False, headers=list(ui.LOAD_COLUMNS))
    c["per"] = gr.Dataframe(label="Per request", interactive=False,
                            headers=["request", "mode", "status", "ttfp_ms", "e2e_ms", "rtf", "audio_s"])
    return c
