"""The Synthesis tab's handlers: generate (streamed or whole), stop, save a voice, refresh the panel.

Owns: turning a form into a request and its audio, file and figures; the visitor's history (kept in the
caller's gr.State, so every visitor sees only their own requests); the running requests of each visitor
(so Stop cancels only theirs, and a closed tab or a handler Gradio closes because its client left ends
them as "client gone"); stopped requests' partial audio; a Speed other than 1 (the finished clip
stretched and played whole); the notice when a clip was cut at its length cap; every error as one toast
in the UI's words plus one log line. Handlers are plain functions taking the engine first, so tests call
them directly. Uses only the Engine's public API, plus omni_tts.ui.engine_access for what it does not
expose yet.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import gradio as gr
import numpy as np

from omni_tts import voices
from omni_tts.engine.request import CLIENT_GONE
from omni_tts.errors import OmniTTSError
from omni_tts.models import stretch
from omni_tts.ui import engine_access, files, formatting, labels, plots
from omni_tts.ui import support as ui

log = logging.getLogger("omni_tts.app")
CHUNK_TIMEOUT_S = 600.0  # longest wait between two chunks (a CPU 'default' compile can pause requests minutes)
_running: dict[str, list] = {}  # visitor key -> their requests in flight: (handle, its number for them)
_running_lock = threading.Lock()


def visitor(request: gr.Request | None) -> str:
    """The key of this browser session ('local' when a handler is called directly)."""
    return getattr(request, "session_hash", None) or "local"


@contextlib.contextmanager
def user_errors(what: str = "request", fields: Mapping[str, str] = labels.UI_FIELDS) -> Iterator[None]:
    """Any failure becomes one gr.Error toast in the UI's words (`fields`: the engine's names -> the
    caller's) and one log line (no traceback)."""
    try:
        yield
    except gr.Error:
        raise
    except OmniTTSError as e:
        message = labels.in_ui_words(str(e), fields)
        log.warning("%s refused: %s", what, message)
        raise gr.Error(message, print_exception=False) from None
    except Exception as e:  # a bug or device failure: still one line for the visitor and the log
        message = f"{what} failed: {type(e).__name__}: {labels.in_ui_words((str(e).splitlines() or [''])[0], fields)}"
        log.error(message)
        raise gr.Error(message, print_exception=False) from None


@contextlib.contextmanager
def tracked(key: str, handle: Any, number: int = 0) -> Iterator[Any]:
    """`handle` is this visitor's while the block runs (Stop and a closed tab find it); a block left before
    the request ends (its consumer gone: Gradio closes a generator whose client left) cancels it."""
    with _running_lock:
        _running.setdefault(key, []).append((handle, number))
    try:
        yield handle
    finally:
        with _running_lock:
            mine = _running.get(key, [])
            mine[:] = [(h, n) for h, n in mine if h is not handle]
            if not mine:
                _running.pop(key, None)
        if not handle.done:
            handle.cancel(CLIENT_GONE)


def _current(key: str) -> tuple[Any, int]:
    """This visitor's newest request in flight and its number for them ((None, 0): none)."""
    with _running_lock:
        return (_running.get(key) or [(None, 0)])[-1]


def _start(engine: Any, f: Mapping[str, Any], info: Mapping[str, Any]) -> Any:
    """Validate the form and submit it in the mode it asks for ('' = the engine's default)."""
    params = ui.make_params(engine, f, info)
    return engine.submit(engine_access.with_mode(params, f.get("mode") or None))


def synthesize(engine: Any, f: Mapping[str, Any], history: list | None = None, streaming: bool = True,
               request: gr.Request | None = None, info: Mapping[str, Any] | None = None) -> Iterator[tuple]:
    """Generator over (streamed chunk, whole clip, file, live table, history, notice).

    Streaming: each chunk goes to the streamed player as it is made; else the clip goes to the plain
    player when finished. A Speed other than 1 stretches the finished clip, so that request plays as a
    whole clip. A stopped request keeps its partial audio (unstretched) as a labelled download and is
    recorded in the history like any other."""
    info = info or engine.model_info()
    history, key, samples = list(history or []), visitor(request), []
    number = formatting.next_number(history)
    with user_errors("synthesis"):
        speed = ui.speed(f)
        handle = _start(engine, f, info)
    streaming = streaming and speed == 1.0  # the stretch needs the whole clip: nothing to stream
    notice = ui.speed_notice(speed) or gr.skip()
    with tracked(key, handle, number):
        with user_errors("synthesis"):
            for chunk in _chunks(handle):
                samples.append(chunk.samples)
                audio = files.wav_bytes(chunk.samples, chunk.sample_rate) if streaming else gr.skip()
                running = formatting.record(handle.metrics, streaming, number=number)
                yield (audio, gr.skip(), gr.skip(), formatting.live_markdown(running, _last(history)), gr.skip(),
                       notice)
    with user_errors("synthesis"):
        result = _finish(engine, handle, samples, history, streaming, number, speed)
    yield result


def _finish(engine: Any, handle: Any, samples: list[np.ndarray], history: list, streaming: bool,
            number: int, speed: float = 1.0) -> tuple:
    """The last yield: the whole clip (or what was made before Stop), its download, figures, notice."""
    m, sr = handle.metrics, handle.sample_rate
    wav = np.concatenate(samples) if samples else np.zeros(0, np.float32)
    stopped = m.status == "cancelled"
    note = capped = ""
    if stopped:
        note = f"Stopped: request #{number} kept {len(wav) / sr:.1f} s of audio (partial download below)."
    else:
        wav = stretch.change_speed(wav, sr, speed)
        cap = handle.max_frames
        asked = handle.params.max_new_tokens or engine.model_info()["generation"].get("max_new_tokens")
        capped = formatting.capped_notice(m.frames, cap, asked)
        if capped:
            gr.Warning(capped)
        note = " ".join(x for x in (ui.speed_notice(speed), capped) if x)
    path = files.write_wav(wav, sr, "stopped-partial" if stopped else "omni-tts") if len(wav) else None
    label = f"Stopped: partial audio ({len(wav) / sr:.1f} s)" if stopped else "Download wav"
    entry = formatting.record(m, streaming, "stopped" if stopped else ("capped" if capped else ""), number)
    history = (history + [entry])[-formatting.HISTORY_LEN:]
    whole = (sr, files.pcm16(wav)) if not streaming and len(wav) else gr.skip()
    return (gr.skip(), whole, gr.update(value=path, label=label, visible=path is not None),
            formatting.live_markdown(None, entry), history, note)


def _last(history: list) -> Mapping[str, Any] | None:
    return history[-1] if history else None


def _chunks(handle: Any) -> Iterator[Any]:
    """handle.stream(), but a silent engine ends in an error, not a hang; a stop ends it quietly."""
    try:
        yield from handle.stream(timeout=CHUNK_TIMEOUT_S)
    except queue.Empty:
        handle.cancel()
        raise gr.Error(f"the engine made no audio for {CHUNK_TIMEOUT_S:.0f} s; the request was cancelled",
                       print_exception=False) from None
    except OmniTTSError:
        if handle.metrics.status != "cancelled":  # a stop is not an error
            raise


def synthesize_in_call(engine: Any, f: Mapping[str, Any], history: list | None = None,
                       info: Mapping[str, Any] | None = None) -> tuple:
    """ZeroGPU: one whole synthesis inside the caller's GPU call (the scheduler thread has no GPU there)."""
    from omni_tts.engine.metrics import RequestMetrics, now

    info = info or engine.model_info()
    with user_errors("synthesis"):
        speed = ui.speed(f)
        params = ui.make_params(engine, f, info)
        params.validate()
        m = RequestMetrics(0, engine.mode.value, now(), sample_rate=engine.sample_rate)
        wav, frames = engine_access.synthesize_whole(engine, params)
        made, wav = int(wav.shape[0]), stretch.change_speed(wav, engine.sample_rate, speed)
    m.first_audio_at = m.finished_at = now()  # the whole clip is the first audio here
    m.frames, m.audio_samples, m.status = frames, made, "done"
    entry = formatting.record(m, streaming=False, number=formatting.next_number(history))
    path = files.write_wav(wav, m.sample_rate, "omni-tts")
    history = (list(history or []) + [entry])[-formatting.HISTORY_LEN:]
    return (gr.skip(), (m.sample_rate, files.pcm16(wav)), gr.update(value=path, label="Download wav", visible=True),
            formatting.live_markdown(None, entry), history, ui.speed_notice(speed))


def stop(request: gr.Request | None = None) -> str:
    """Cancel this visitor's running request; the toast says what happened."""
    handle, number = _current(visitor(request))
    if handle is not None and not handle.done:
        handle.cancel()
        gr.Info(f"Stopping request #{number}: the audio made so far stays available")
        return f"stopped request #{number}"
    gr.Info("Nothing to stop: no request of yours is running")
    return "nothing running"


def left(request: gr.Request | None = None) -> None:
    """The visitor closed the page (Gradio's unload, on the end of its heartbeat): their requests end."""
    with _running_lock:
        handles = [h for h, _ in _running.get(visitor(request), [])]
    for handle in handles:
        handle.cancel(CLIENT_GONE)


def voice_save(engine: Any, f: Mapping[str, Any], name: str) -> tuple[Any, Any]:
    """Make a voice from the clone fields, keep it in the voice library under `name`, offer it as a download.
    Returns (the library dropdown's update, the download)."""
    with user_errors("saving the voice"):
        stem = files.voice_name(name)
        prompt = ui.voice_prompt(engine, {**f, "voice_file": None, "saved_voice": ""})
        voices.save(stem, prompt, {"source": "page"})  # the library the API lists, with its metadata
        download = files.copy_out(str(files.voice_path(stem)), stem)
    gr.Info(f"Saved voice '{stem}' to the voice library")
    return gr.update(choices=[""] + files.saved_voices(), value=stem), gr.update(value=download, visible=True)


def settled(engine: Any, request: gr.Request | None = None) -> bool:
    """Nothing left for the panel's timer to follow: none of this visitor's requests runs, the engine
    has no request in flight and no mode is still warming."""
    handle, _ = _current(visitor(request))
    snap = engine.snapshot()
    busy = snap.active or snap.waiting
    warming = any(v.state in ("warming", "queued") for v in snap.modes.values())
    return (handle is None or handle.done) and not busy and not warming


def saved_voice_choices(current: str | None = None) -> Any:
    """The saved-voice dropdown read again from the voice store (on page load: voices saved meanwhile,
    also through the API, appear)."""
    choices = [""] + files.saved_voices()
    return gr.update(choices=choices, value=current if current in choices else "")


def refresh_panel(engine: Any, history: list | None, plotted: int = -1,
                  request: gr.Request | None = None) -> tuple:
    """Timer tick: this visitor's live table, the engine-wide figures and readiness, and the plots when
    the visitor's history changed since `plotted` (the newest request drawn)."""
    history = list(history or [])
    handle, number = _current(visitor(request))
    running = formatting.record(handle.metrics, number=number) if handle is not None and not handle.done else None
    newest = history[-1]["request"] if history else -1
    drawn: tuple = (gr.skip(), gr.skip())
    if newest != plotted:
        drawn = (plots.scatter_svg(history, "ttfp_ms", "TTFP of your requests (ms)", " ms"),
                 plots.scatter_svg(history, "rtf", "RTF of your requests"))
    readiness = formatting.readiness_markdown(engine_access.mode_readiness(engine), engine.mode_notes())
    return (formatting.live_markdown(running, _last(history)), formatting.engine_markdown(engine.snapshot()),
            readiness, *drawn, newest)
