"""The app's one public Gradio API endpoint, `/synthesize`: named parameters with defaults (only `text`
is required), a wav file and the request's metrics back.

Owns: the endpoint's parameters, their defaults and descriptions, and its hidden input/output
components (every other event of the page is private: omni_tts.ui.layout). Errors are the same
one-line messages as the form's. Usage:

    from gradio_client import Client
    wav_path, metrics = Client("http://127.0.0.1:7860/").predict("Hello", api_name="/synthesize")
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gradio as gr

from omni_tts import config, limits, voices
from omni_tts.models import stretch
from omni_tts.ui import engine_access, files, formatting, labels
from omni_tts.ui import support as ui
from omni_tts.ui.handlers import tracked, user_errors, visitor

API_NAME = "synthesize"


# One line per parameter: the API page's description, the function's docstring (MCP reads its Args) and
# the hidden components' info all come from here. Bounds are limits.LIMITS, the ones every request obeys.
def _bounds(name: str) -> str:
    return limits.LIMITS[name].describe()


PARAMS = {
    "text": f"the words to speak (at most {limits.MAX_INPUT_CHARS} characters; a long text is spoken in "
            "sentence-sized segments)",
    "task": f"one of {', '.join(config.TASKS)}, as on the command line ('' = the checkpoint's first task)",
    "speaker": "a speaker of a CustomVoice checkpoint, or a saved voice's name ('' = the first speaker)",
    "language": "the text's language, or 'auto' to detect it",
    "instruct": "how to speak (CustomVoice) or the voice to make (voice_design, required there)",
    "mode": "compile mode for this request: eager, default, reduce-overhead or default+cudagraph "
            "('' = the engine's default; only the modes this server runs)",
    "temperature": f"sampling temperature, {_bounds('temperature')} (0 = greedy)",
    "top_k": f"top-k, {_bounds('top_k')} (0 = off)",
    "top_p": f"top-p, {_bounds('top_p')}",
    "repetition_penalty": f"repetition penalty, {_bounds('repetition_penalty')} (1 = none)",
    "max_new_tokens": f"most tokens to make, {_bounds('max_new_tokens')}: the clip has at most one frame "
                      "(80 ms) fewer (empty = the checkpoint's default)",
    "seed": "random seed (-1 = a new one each time)",
    "ref_audio": "voice_clone: the reference clip (an audio file)",
    "ref_text": "voice_clone: what the reference clip says (needed unless x_vector_only)",
    "x_vector_only": "voice_clone: take the voice from the clip alone, without ref_text (lower fidelity)",
    "voice_file": "voice_clone: a saved voice (.safetensors) instead of ref_audio",
    "speed": "speaking speed, 0.25-4 (1 = as made); the pitch is kept",
}
DESCRIPTION = ("Synthesize `text` whole; returns the wav file and the request's metrics (TTFP, E2E, RTF, "
               "audio seconds). Parameters: " + "; ".join(f"{k}: {v}" for k, v in PARAMS.items()) + ". The same "
               "server also answers the OpenAI-compatible routes POST /v1/audio/speech (streaming "
               "too), GET /v1/audio/voices and GET /v1/models.")


def synthesize_request(engine: Any, info: Mapping[str, Any], text: str, task: str = "",
                       speaker: str = "", language: str = "auto", instruct: str = "", mode: str = "",
                       temperature: float | None = None, top_k: float | None = None, top_p: float | None = None,
                       repetition_penalty: float | None = None, max_new_tokens: float | None = None,
                       seed: float | None = -1, ref_audio: str | None = None, ref_text: str = "",
                       x_vector_only: bool = False, voice_file: str | None = None,
                       speed: float | None = 1.0, caller: str = "local") -> tuple[str, dict[str, Any]]:
    """One whole clip: (wav path, metrics). Empty task / speaker: the checkpoint's first; a speaker that
    names a saved voice: that voice (voice clone); mode '': the engine's default; sampling fields None:
    the checkpoint's generation defaults; seed -1: random; speed: 0.25-4, pitch kept. `caller`: the
    client's session (its request ends when the client leaves: handlers.left)."""
    saved = bool(speaker) and speaker not in info["speakers"] and voices.exists(speaker)
    f = ui.form(text=text or "", task=task or ("voice_clone" if saved else (info["tasks"] or ["custom_voice"])[0]),
                speaker=speaker or (info["speakers"] or [None])[0], language=language or "auto",
                saved_voice=speaker if saved else "",
                instruct=instruct or "", mode=mode or "", temperature=temperature, top_k=top_k, top_p=top_p,
                rep=repetition_penalty, max_len=max_new_tokens, seed=-1 if seed is None else seed,
                ref_audio=ref_audio or None, ref_text=ref_text or "", xvec_only=bool(x_vector_only),
                voice_file=voice_file or None)
    with user_errors("synthesis", labels.API_FIELDS):  # errors name the API's parameters, as given
        speed = stretch.check_speed(1.0 if speed is None else speed)
        params = ui.make_params(engine, f, info, ui.API_NAMES)
        with tracked(caller, engine.submit(engine_access.with_mode(params, f["mode"] or None))) as handle:
            result = handle.result()
        wav = stretch.change_speed(result.wav, result.sample_rate, speed)
    path = files.write_wav(wav, result.sample_rate, "omni-tts")
    m = result.metrics
    metrics = {**formatting.record(m, streaming=False), "frames": int(m.frames), "sample_rate": int(result.sample_rate)}
    metrics.pop("streaming", None)
    metrics.pop("note", None)
    return path, metrics


def add_endpoint(engine: Any, info: Mapping[str, Any]) -> None:
    """The hidden components and the `/synthesize` event (inside the caller's gr.Blocks)."""
    gen = info["generation"]
    with gr.Column(visible=False):
        inputs = [
            gr.Textbox(label="text"),
            gr.Textbox(value="", label="task"),
            gr.Textbox(value="", label="speaker"),
            gr.Textbox(value="auto", label="language"),
            gr.Textbox(value="", label="instruct"),
            gr.Textbox(value="", label="mode"),
            gr.Number(value=gen.get("temperature", 0.9), label="temperature"),
            gr.Number(value=gen.get("top_k", 50), label="top_k", precision=0),
            gr.Number(value=gen.get("top_p", 1.0), label="top_p"),
            gr.Number(value=gen.get("repetition_penalty", 1.05), label="repetition_penalty"),
            gr.Number(value=None, label="max_new_tokens", precision=0),
            gr.Number(value=-1, label="seed", precision=0),
            gr.Audio(type="filepath", label="ref_audio"),
            gr.Textbox(value="", label="ref_text"),
            gr.Checkbox(value=False, label="x_vector_only"),
            gr.File(label="voice_file", type="filepath"),
            gr.Number(value=1.0, label="speed", minimum=stretch.MIN_SPEED, maximum=stretch.MAX_SPEED),
        ]
        outputs = [gr.File(label="wav"), gr.JSON(label="metrics")]
        trigger = gr.Button("synthesize")

    def synthesize(text: str, task: str = "", speaker: str = "", language: str = "auto", instruct: str = "",
                   mode: str = "", temperature: float | None = gen.get("temperature", 0.9),
                   top_k: float | None = gen.get("top_k", 50), top_p: float | None = gen.get("top_p", 1.0),
                   repetition_penalty: float | None = gen.get("repetition_penalty", 1.05),
                   max_new_tokens: float | None = None, seed: float | None = -1, ref_audio: str | None = None,
                   ref_text: str = "", x_vector_only: bool = False,
                   voice_file: str | None = None, speed: float | None = 1.0, request: gr.Request = None
                   ) -> tuple[str, dict[str, Any]]:
        """Synthesize `text`; returns the wav file and the request's metrics (its Args: see PARAMS)."""
        return synthesize_request(engine, info, text, task, speaker, language, instruct, mode, temperature,
                                  top_k, top_p, repetition_penalty, max_new_tokens, seed, ref_audio, ref_text,
                                  x_vector_only, voice_file, speed, visitor(request))

    synthesize.__doc__ = DESCRIPTION + "\n\nArgs:\n" + "\n".join(f"    {k}: {v}" for k, v in PARAMS.items())
    for component, name in zip(inputs, PARAMS):
        component.info = PARAMS[name]
    trigger.click(synthesize, inputs, outputs, api_name=API_NAME, concurrency_id="synthesis",
                  api_description=DESCRIPTION)
