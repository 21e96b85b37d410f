"""omni-tts Gradio app: synthesis, engine panel, listening test and load test over one Engine.

Owns: the page layout (`build_demo(engine)`, testable without launching), the event handlers
(module-level functions taking the engine first, so tests call them directly), and `__main__`
(choose the model, build the engine from a preset, launch with a queue sized to max_num_seqs,
bind to 0.0.0.0:$PORT on a Hugging Face Space). Pure-Python helpers live in omni_tts/ui_support.py,
the tabs' components in omni_tts/ui_tabs.py.
Knows nothing about device math: everything goes through omni_tts.engine.engine.Engine's public API.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import queue
import random
import sys
import threading
import time
from typing import Any, Iterator

import gradio as gr
import pandas as pd

from omni_tts.ui import support as ui
from omni_tts.ui import tabs
from omni_tts.config import CompileMode, EngineConfig, SynthesisParams, load_preset, preset_names
from omni_tts.errors import OmniTTSError
from omni_tts.engine.metrics import RequestMetrics, now, summarize

CHUNK_TIMEOUT_S = 600.0  # longest wait between two chunks (a CPU 'default' compile can pause requests minutes)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Engine errors become a one-line gr.Error (no traceback); the app keeps serving."""
    try:
        yield
    except gr.Error:
        raise
    except OmniTTSError as e:
        raise gr.Error(str(e), print_exception=False) from None
    except Exception as e:  # a bug or device failure: still one line for the user
        first = (str(e).splitlines() or [""])[0]
        raise gr.Error(f"{type(e).__name__}: {first}", print_exception=True) from None


# ------------------------------------------------------------------ synthesis
def synthesize(engine: Any, session: dict, text: str, seed: float | None, *settings: Any,
               streaming: bool = True) -> Iterator[tuple]:
    """Generator: yields (audio, wav file, live metrics) - audio chunks as they come, then the file."""
    with user_errors():
        handle = engine.submit(ui.make_params(engine, text, seed, *settings))
        session["handle"] = handle
        try:
            for chunk in _chunks(handle):
                audio = ui.wav_bytes(chunk.samples, chunk.sample_rate) if streaming else gr.skip()
                yield audio, gr.skip(), ui.live_markdown(handle.metrics, None)
            result = handle.result()
        finally:
            if not handle.done:
                handle.cancel()
    path = ui.write_wav(result.wav, result.sample_rate, "omni-tts")
    final_audio = None if streaming else (result.sample_rate, ui.pcm16(result.wav))
    yield final_audio, path, ui.live_markdown(None, result.metrics)


def synthesize_in_call(engine: Any, session: dict, text: str, seed: float | None, *settings: Any) -> tuple:
    """ZeroGPU: one whole synthesis inside the caller's @spaces.GPU call, on the model's plain path
    (the engine's scheduler thread lives outside that call, where there is no GPU). No streaming."""
    with user_errors():
        params = ui.make_params(engine, text, seed, *settings)
        m = RequestMetrics(0, engine.mode.value, now())
        wav, codes = engine.model.synthesize(params)
    m.first_audio_at = m.finished_at = now()  # the whole clip is the first audio here
    m.frames, m.audio_samples, m.status = int(codes.shape[0]), int(wav.shape[0]), "done"
    m.sample_rate = engine.model.sample_rate
    engine.stats.on_finish(m)
    path = ui.write_wav(wav, m.sample_rate, "omni-tts")
    return (m.sample_rate, ui.pcm16(wav)), path, ui.live_markdown(None, m)


def _chunks(handle: Any) -> Iterator[Any]:
    """handle.stream(), but a silent engine (e.g. no scheduler in this process) ends in an error, not a hang."""
    try:
        yield from handle.stream(timeout=CHUNK_TIMEOUT_S)
    except queue.Empty:
        handle.cancel()
        raise gr.Error(f"the engine produced no audio for {CHUNK_TIMEOUT_S:.0f} s; request cancelled",
                       print_exception=False) from None


def stop(session: dict) -> str:
    handle = session.get("handle")
    if handle is not None and not handle.done:
        handle.cancel()
        return f"stopped request #{handle.id}"
    return "nothing running"


def voice_save(engine: Any, ref_audio: Any, ref_text: str, xvec_only: bool) -> str:
    with user_errors():
        prompt = ui.voice_prompt(engine, ref_audio, ref_text, xvec_only, None)
        path = ui.out_path("voice", ".safetensors")
        prompt.save(path)
        return path


# ------------------------------------------------------------------ engine panel
def apply_mode(engine: Any, mode: str, progress: Any = None, zero: bool = False) -> Iterator[tuple[str, str]]:
    """Generator: switch the engine's compile mode, yielding progress lines, then the capture cost."""
    why = engine.available_modes().get(mode, "unknown mode")
    if zero and mode not in ui.ZERO_GPU_MODES:
        why = "not on ZeroGPU (graphs captured at start-up do not survive between GPU calls)"
    if why is not None:
        gr.Warning(f"{mode} is unavailable here: {why}")
        yield f"**Not switched:** `{mode}` is unavailable: {why}", ui.engine_markdown(engine.snapshot())
        return
    messages: queue.Queue = queue.Queue()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["result"] = engine.set_compile_mode(mode, progress=messages.put)
        except Exception as e:  # reported on the handler's thread below
            outcome["error"] = e

    worker = threading.Thread(target=work, name="omni-tts-mode-switch", daemon=True)
    worker.start()
    lines: list[str] = [f"switching to `{mode}`..."]
    while worker.is_alive() or not messages.empty():
        try:
            lines.append(messages.get(timeout=0.25))
        except queue.Empty:
            continue
        if progress is not None:
            progress(None, desc=lines[-1])
        yield "**Working:** " + "\n\n".join(lines[-4:]), gr.skip()
    worker.join()
    if "error" in outcome:
        with user_errors():
            raise outcome["error"]
    yield ui.capture_markdown(outcome["result"]), ui.engine_markdown(engine.snapshot())


def refresh_panel(engine: Any, session: dict, plotted: tuple[int, int] = (-1, 0)) -> tuple:
    """Timer tick: live request figures, engine/memory line, and the plots when new requests finished.

    `plotted` is (last request plotted, ticks it was sent on): each new plot goes out on two ticks,
    because the browser's plot sometimes draws a fresh value without its newest point the first time."""
    handle = session.get("handle")
    running = handle.metrics if handle is not None and not handle.done else None
    recent = engine.stats.recent_requests(50)
    last = recent[-1] if recent else None
    count = last.request_id if last else 0
    plotted = (count, plotted[1] + 1 if plotted[0] == count else 1)
    if plotted[1] > 2:
        plots: tuple = (gr.skip(), gr.skip())
    else:  # padded limits: a point on the plot's edge is clipped out of sight
        frame = ui.history_frame(recent)
        xs = [float(frame["request"].min()) - 1, float(frame["request"].max()) + 1] if len(frame) else None
        plots = tuple(gr.update(value=frame, x_lim=xs, y_lim=[0, 1.2 * float(frame[y].max())] if len(frame) else None)
                      for y in ("ttfp_ms", "rtf"))
    return (ui.live_markdown(running, last), ui.engine_markdown(engine.snapshot()), *plots, plotted)


# ------------------------------------------------------------------ listening test
@contextlib.contextmanager
def mode_restored(engine: Any) -> Iterator[str]:
    """Yields the engine's mode; whatever `switch_to` does inside, the engine ends in that mode again."""
    original = engine.snapshot()["mode"]
    try:
        yield original
    finally:
        switch_to(engine, original)


def switch_to(engine: Any, mode: str) -> None:
    """Put the engine in `mode` unless it already is (a switch recompiles / recaptures)."""
    if engine.snapshot()["mode"] != mode:
        engine.set_compile_mode(mode)


def run_modes(engine: Any, modes: list[str], params: SynthesisParams) -> list[dict[str, Any]]:
    """Synthesize `params` once per mode (switching the engine), then restore the original mode."""
    clips: list[dict[str, Any]] = []
    with mode_restored(engine):
        for mode in modes:
            switch_to(engine, mode)
            result = engine.synthesize(dataclasses.replace(params))
            path = ui.write_wav(result.wav, result.sample_rate, f"clip-{mode.replace('+', '-')}")
            clips.append({"mode": mode, "ran_as": result.metrics.mode, "path": path, "codes": result.codes,
                          "metrics": result.metrics})
    return clips


def listening_test(engine: Any, text: str, seed: float, modes: list[str], *settings: Any,
                   tally: dict[str, Any] | None = None) -> tuple:
    """Clips per mode side by side, the code-matrix verdicts, exports, and a fresh A/B/X trial
    (the session's A/B/X tally in `tally` carries over)."""
    modes = list(modes or [])  # the UI offers each mode once; a repeated mode is a determinism check
    if len(modes) < 2:
        raise gr.Error("choose at least two modes to compare", print_exception=False)
    with user_errors():
        params = ui.make_params(engine, text, 0 if seed is None or seed < 0 else seed, *settings)
        params.validate()
        clips = run_modes(engine, modes, params)
    base = clips[0]
    verdicts = [ui.verdict_text(base["mode"], c["mode"], base["codes"], c["codes"]) for c in clips[1:]]
    rows = [{**ui.metrics_row(c["metrics"]), "mode": c["mode"], "ran_as": c["ran_as"], "frames": len(c["codes"]),
             "identical_to_first": ui.compare_codes(base["codes"], c["codes"])[0], "file": c["path"]} for c in clips]
    csv_path = ui.write_csv(rows, "listening-results")
    audio = [gr.update(value=c["path"], label=f"{c['mode']} · TTFP {ui.fmt(c['metrics'].ttfp_ms, ' ms')} · "
                       f"RTF {ui.fmt(c['metrics'].rtf, '', 3)}", visible=True) for c in clips[:tabs.N_CLIPS]]
    audio += [gr.update(value=None, visible=False)] * (tabs.N_CLIPS - len(audio))
    abx = {"trials": 0, "correct": 0, **(tally or {}), "a": clips[0]["path"], "b": clips[1]["path"],
           "modes": (clips[0]["mode"], clips[1]["mode"])}
    abx_state, x_path = _new_abx_trial(abx)
    table = pd.DataFrame(rows).drop(columns=["file"])
    return (*audio, "\n\n".join(verdicts), table, [c["path"] for c in clips] + [csv_path], abx_state, x_path,
            f"A = `{abx['modes'][0]}`, B = `{abx['modes'][1]}`. Which one is X?")


def _new_abx_trial(state: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Pick X at random (A or B) and copy that clip to a neutrally named file."""
    x_is = random.choice("AB")
    return {**state, "x_is": x_is}, ui.copy_out(state["a"] if x_is == "A" else state["b"], "X")


def abx_guess(state: dict[str, Any], guess: str) -> tuple[dict[str, Any], str, Any]:
    new, line = ui.abx_record(state or {}, guess)
    if "a" not in new:
        return new, line, gr.skip()
    new, x_path = _new_abx_trial(new)
    return new, line + " — a new X is ready.", x_path


# ------------------------------------------------------------------ load test
def load_test(engine: Any, n: float, mode: str, prompts: str, seed: float, *settings: Any) -> tuple:
    """N concurrent requests from the prompt list in `mode`; the seed-PR table for the run."""
    texts = [t.strip() for t in (prompts or "").splitlines() if t.strip()]
    if not texts:
        raise gr.Error("the prompt list is empty: give one prompt per line", print_exception=False)
    n = max(1, min(int(n), engine.config.max_num_seqs))
    with user_errors():
        template = ui.make_params(engine, texts[0], seed, *settings)
        template.validate()
        with mode_restored(engine) as original:
            switch_to(engine, mode or original)
            t0 = time.perf_counter()
            handles = [engine.submit(dataclasses.replace(template, text=texts[i % len(texts)]))
                       for i in range(n)]
            for h in handles:
                h.result()
            wall = time.perf_counter() - t0
    s = summarize([h.metrics for h in handles], wall)
    table = pd.DataFrame([ui.load_row(mode or original, n, s)])
    per = pd.DataFrame([ui.metrics_row(h.metrics) for h in handles])
    return table, per, f"{int(s['requests'])}/{n} requests done in {wall:.2f} s"


# ------------------------------------------------------------------ layout
def build_demo(engine: Any, model_reason: str = "", zero: bool = False) -> gr.Blocks:
    """The whole page over `engine`; nothing is launched."""
    info = ui.model_info(engine)
    model_reason = model_reason or info["reason"]
    streaming = ui.streaming_playback_supported() and not zero
    available = engine.available_modes()
    modes = [m for m in ui.MODES if available.get(m) is None and (not zero or m in ui.ZERO_GPU_MODES)]
    max_len = max(2, min(2048, engine.config.max_seq_len - 64))
    with gr.Blocks(title="omni-tts") as demo:
        gr.Markdown(ui.banner_markdown(info, model_reason), elem_id="banner")
        session = gr.State({})
        with gr.Row():
            with gr.Column(scale=3):
                with gr.Tab("Synthesis"):
                    s = tabs.synthesis_inputs(info, max_len)
                    with gr.Row():
                        s["go"] = gr.Button("Generate", variant="primary", elem_id="generate")
                        s["stop"] = gr.Button("Stop", variant="stop", elem_id="stop")
                    s["audio"] = gr.Audio(label="Output", streaming=streaming, autoplay=True, interactive=False,
                                          elem_id="output-audio")
                    s["file"] = gr.File(label="Download wav", interactive=False, elem_id="download", height=70)
                with gr.Tab("Listening test"):
                    lt = tabs.listening_tab(modes)
                with gr.Tab("Load test"):
                    ld = tabs.load_tab(engine, modes)
            with gr.Column(scale=2):
                p = tabs.engine_panel(engine, modes, ui.mode_notes(available, zero, streaming, engine.snapshot()["device"]))
        _wire(engine, s, p, lt, ld, session, info, streaming, zero)
    return demo


def _wire(engine: Any, s: dict, p: dict, lt: dict, ld: dict, session: Any, info: dict, streaming: bool,
          zero: bool) -> None:
    settings = [s[k] for k in ("task", "speaker", "language", "instruct", "temperature", "top_k", "top_p", "rep",
                               "max_len", "ref_audio", "ref_text", "xvec_only", "voice_file")]

    if zero:  # ZeroGPU: the GPU exists only inside @spaces.GPU calls: synthesize whole clips in one
        import spaces  # type: ignore[import-not-found]

        on_generate = spaces.GPU(lambda sess, text, seed, *rest: synthesize_in_call(engine, sess, text, seed, *rest))
    else:
        def on_generate(sess, text, seed, *rest):
            yield from synthesize(engine, sess, text, seed, *rest, streaming=streaming)
    go = s["go"].click(on_generate, [session, s["text"], s["seed"], *settings], [s["audio"], s["file"], p["live"]],
                       concurrency_id="synthesis")
    s["stop"].click(lambda sess: gr.Info(stop(sess)), [session], None, cancels=[go], queue=False)
    s["task"].change(lambda t: (gr.update(visible=t == "CustomVoice"), gr.update(visible=ui.instruct_visible(info, t)),
                                gr.update(visible=ui.TASK_IDS.get(t) == "voice_clone")),
                     [s["task"]], [s["speaker"], s["instruct"], s["clone_group"]], queue=False)
    s["voice_save"].click(lambda *a: voice_save(engine, *a), [s["ref_audio"], s["ref_text"], s["xvec_only"]],
                          [s["voice_out"]])

    def on_apply(mode, progress=gr.Progress()):
        yield from apply_mode(engine, mode, progress, zero)

    p["apply"].click(on_apply, [p["mode"]], [p["mode_status"], p["engine"]], concurrency_limit=1,
                     concurrency_id="engine-mode")
    plotted = gr.State((-1, 0))
    p["timer"].tick(lambda sess, n: refresh_panel(engine, sess, n), [session, plotted],
                    [p["live"], p["engine"], p["ttfp_plot"], p["rtf_plot"], plotted], show_progress="hidden",
                    concurrency_limit=None)
    lt["run"].click(lambda st, *a: listening_test(engine, *a, tally=st),
                    [lt["abx"], lt["text"], lt["seed"], lt["modes"], *settings],
                    [*lt["clips"], lt["verdict"], lt["table"], lt["export"], lt["abx"], lt["x_audio"],
                     lt["abx_info"]], concurrency_limit=1, concurrency_id="engine-mode")
    lt["pick_a"].click(lambda st: abx_guess(st, "A"), [lt["abx"]], [lt["abx"], lt["tally"], lt["x_audio"]])
    lt["pick_b"].click(lambda st: abx_guess(st, "B"), [lt["abx"]], [lt["abx"], lt["tally"], lt["x_audio"]])
    ld["run"].click(lambda *a: load_test(engine, *a), [ld["n"], ld["mode"], ld["prompts"], ld["seed"], *settings],
                    [ld["table"], ld["per"], ld["status"]], concurrency_limit=1, concurrency_id="engine-mode")


# ------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="omni-tts Gradio app (Qwen3-TTS 12 Hz)")
    p.add_argument("--preset", default="default" if "default" in preset_names() else None,
                   help=f"engine preset name or YAML path (available: {', '.join(preset_names())})")
    p.add_argument("--model", default=None, help="checkpoint dir or Hub id (default: env OMNI_TTS_MODEL, the HF "
                   "cache, Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice when online, else the embedded demo)")
    p.add_argument("--mode", default=None, choices=["auto", *(m.value for m in CompileMode)])
    p.add_argument("--host", default=None, help="default 127.0.0.1 (0.0.0.0 on a Space)")
    p.add_argument("--port", type=int, default=None, help="default 7860 (env PORT/GRADIO_SERVER_PORT on a Space)")
    p.add_argument("--share", action="store_true", help="create a public gradio.live link")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Build the engine (the runner picks the model: --model, OMNI_TTS_MODEL, HF cache, Hub, embedded) and serve."""
    from omni_tts.engine.engine import Engine

    args = parse_args(argv)
    say = lambda s: print(f"[omni-tts] {s}", file=sys.stderr, flush=True)  # noqa: E731
    zero = ui.zero_gpu()
    try:
        config = load_preset(args.preset, model=args.model, mode=args.mode) if args.preset else \
            EngineConfig(model=args.model, mode=args.mode or "auto")
        if zero and config.mode not in ui.ZERO_GPU_MODES:
            config.mode = ui.ZERO_GPU_MODES[0]
        engine = Engine.from_config(config, progress=say)
    except OmniTTSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    say(f"model: {ui.model_info(engine)['describe']}")
    demo = build_demo(engine, zero=zero)
    host, port = ui.bind_address(args.host, args.port)
    demo.queue(default_concurrency_limit=config.max_num_seqs, max_size=max(64, 8 * config.max_num_seqs))
    demo.launch(server_name=host, server_port=port, share=args.share or None,
                max_threads=max(40, 4 * config.max_num_seqs + 16), allowed_paths=[str(ui.OUT_DIR)],
                css=".metrics table {font-size: 0.85em}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
