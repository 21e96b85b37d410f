"""OpenAI-compatible speech endpoints on the app's server: `POST /v1/audio/speech`, `GET /v1/audio/voices`,
`GET /v1/models`.

Owns: the request body (OpenAI's fields `model`, `input`, `voice`, `instructions`, `response_format`,
`speed`, `stream_format`, plus vLLM-Omni's `stream`, `task_type`, `language`, `ref_audio`, `ref_text`,
`x_vector_only_mode`, `max_new_tokens` and sampling fields; ours: `mode`), the audio encodings (wav, pcm: 16-bit
little-endian mono at the model's rate; flac, mp3, opus through libsndfile; aac through ffmpeg when
installed), streaming raw chunks as the engine makes them (`stream_format: "audio"` or `stream: true`,
and pcm always) or as server-sent events (`stream_format: "sse"`), and errors as OpenAI-style JSON
with proper status codes, in this API's field names. Uses only the Engine's public API and the same
request validation as every other entry point.
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import logging
import shutil
import struct
import subprocess
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import numpy as np
import soundfile as sf
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from omni_tts import voices
from omni_tts.config import SynthesisParams
from omni_tts.errors import EngineError, InputError, OmniTTSError
from omni_tts.models import stretch
from omni_tts.ui import files, labels

log = logging.getLogger("omni_tts.openai")
MAX_BODY_BYTES = 32 << 20  # a base64 reference clip of a few minutes fits; more is refused with 413
MEDIA = {"wav": "audio/wav", "pcm": "audio/L16", "flac": "audio/flac", "mp3": "audio/mpeg", "opus": "audio/ogg",
         "aac": "audio/aac"}
TASKS = {"customvoice": "custom_voice", "custom_voice": "custom_voice", "voicedesign": "voice_design",
         "voice_design": "voice_design", "base": "voice_clone", "voice_clone": "voice_clone"}
PARAMS = {"text": "input", "speaker": "voice", "language": "language", "instruct": "instructions",
          "reference audio": "ref_audio", "ref_text": "ref_text", "max_new_tokens": "max_new_tokens",
          "seed": "seed", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
          "repetition_penalty": "repetition_penalty", "task": "task_type"}


class SpeechRequest(BaseModel):
    """The body of POST /v1/audio/speech (unknown fields are refused, naming them)."""

    model_config = ConfigDict(extra="forbid")
    model: str = ""
    input: str
    voice: str | dict[str, str] | None = None
    instructions: str | None = None
    response_format: Literal["wav", "pcm", "flac", "mp3", "opus", "aac"] = "wav"
    speed: float = 1.0
    stream_format: Literal["audio", "sse"] | None = None
    stream: bool = False
    task_type: str | None = None
    language: str = "auto"
    ref_audio: str | None = None
    ref_text: str | None = None
    x_vector_only_mode: bool = False
    max_new_tokens: int | None = None
    seed: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    mode: str | None = None  # the CodePredictor's compile mode for this request (None: the engine's default)


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}
        return JSONResponse(body, status_code=self.status)


def _from_engine(e: OmniTTSError) -> ApiError:
    """An engine error as a 400 (bad request) or 503 (engine shut down), in this API's field names."""
    message = labels.in_ui_words(str(e), labels.OPENAI_FIELDS)
    if isinstance(e, EngineError) and not isinstance(e, InputError):
        return ApiError(503, message, None, "server_error")
    low = str(e).lower()
    param = next((api for key, api in PARAMS.items() if low.startswith(key) or f"{key} " in low[:40]), None)
    return ApiError(400, message, param)


def wav_stream_header(sample_rate: int) -> bytes:
    """A 16-bit mono wav header whose sizes say 'unknown length' (0xFFFFFFFF), for streamed wav."""
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate,
                                                                               2 * sample_rate, 2, 16)
            + b"data" + struct.pack("<I", 0xFFFFFFFF))


def encode(wav: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """The whole clip in `fmt` (ApiError 400 naming response_format when this server cannot make it)."""
    pcm = files.pcm16(wav)
    if fmt == "pcm":
        return pcm.astype("<i2").tobytes()
    if fmt == "aac":
        return _ffmpeg_aac(pcm, sample_rate)
    buf = io.BytesIO()
    kind = {"wav": ("WAV", "PCM_16"), "flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III"),
            "opus": ("OGG", "OPUS")}[fmt]
    try:
        sf.write(buf, pcm, sample_rate, format=kind[0], subtype=kind[1])
    except (sf.LibsndfileError, TypeError, ValueError) as e:
        raise ApiError(400, f"response_format '{fmt}' is not available on this server ({e})",
                       "response_format") from None
    return buf.getvalue()


def _ffmpeg_aac(pcm: np.ndarray, sample_rate: int) -> bytes:
    exe = shutil.which("ffmpeg")
    if exe is None:
        raise ApiError(400, "response_format 'aac' needs ffmpeg, which is not installed on this server; "
                            "use wav, pcm, flac, mp3 or opus", "response_format")
    cmd = [exe, "-loglevel", "error", "-f", "s16le", "-ar", str(sample_rate), "-ac", "1", "-i", "pipe:0",
           "-c:a", "aac", "-f", "adts", "pipe:1"]
    done = subprocess.run(cmd, input=pcm.astype("<i2").tobytes(), capture_output=True, timeout=120)
    if done.returncode != 0:
        raise ApiError(500, f"aac encoding failed: {done.stderr.decode(errors='replace').strip()[:200]}",
                       "response_format", "server_error")
    return done.stdout


class SpeechService:
    """The endpoints' logic over one engine (kept apart from FastAPI's routing so tests call it too)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.info = engine.model_info()
        self.name = str(self.info.get("name") or "omni-tts")

    def voices(self) -> dict[str, Any]:
        data = [{"id": s, "name": labels.SPEAKERS.get(s.lower(), (labels.speaker_label(s), ""))[0],
                 "description": labels.SPEAKERS.get(s.lower(), ("", ""))[1]} for s in self.info["speakers"]]
        return {"object": "list", "voices": [v["id"] for v in data], "data": data}

    def params(self, req: SpeechRequest) -> SynthesisParams:
        """The engine request of a body (ApiError naming the field for what only this API can get wrong)."""
        try:
            stretch.check_speed(req.speed)
            saved = voices.by_name(req.voice.get("id") if isinstance(req.voice, dict) else req.voice,
                                   self.info["speakers"])
        except InputError as e:
            raise ApiError(400, str(e), "voice" if "voice" in str(e).lower() else "speed") from None
        if saved is not None and "voice_clone" not in self.info["tasks"]:
            tasks = ", ".join(self.info["tasks"])
            raise ApiError(400, f"voice '{req.voice}' is a saved (cloned) voice, and this model ({tasks}) cannot "
                                "clone voices: load a Base checkpoint", "voice")
        task = TASKS.get((req.task_type or "").replace("-", "_").lower()) if req.task_type else None
        if req.task_type and task is None:
            raise ApiError(400, f"unknown task_type '{req.task_type}'; valid: CustomVoice, VoiceDesign, Base",
                           "task_type")
        task = task or ("voice_clone" if saved is not None else (self.info["tasks"] or ["custom_voice"])[0])
        if task not in self.info["tasks"]:
            raise ApiError(400, f"task_type '{req.task_type}' is not what this model does; it does: "
                           f"{', '.join(self.info['tasks'])}", "task_type")
        voice = req.voice.get("id") if isinstance(req.voice, dict) else req.voice
        speaker = None
        if task == "custom_voice":
            speaker = voice or (self.info["speakers"] or [None])[0]
        prompt = saved if saved is not None else self._voice_prompt(req) if task == "voice_clone" else None
        return SynthesisParams(text=req.input, task=task, speaker=speaker, language=req.language or "auto",
                               instruct=(req.instructions or "").strip() or None, temperature=req.temperature,
                               top_k=req.top_k, top_p=req.top_p, repetition_penalty=req.repetition_penalty,
                               max_new_tokens=req.max_new_tokens, seed=req.seed, voice=prompt, mode=req.mode)

    def _voice_prompt(self, req: SpeechRequest) -> Any:
        if not req.ref_audio:
            raise ApiError(400, "task_type Base (voice clone) needs ref_audio: base64 audio or a data: URL",
                           "ref_audio")
        data = req.ref_audio.split(",", 1)[1] if req.ref_audio.startswith("data:") else req.ref_audio
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "ref_audio is not valid base64", "ref_audio") from None
        path = files.out_dir().new("ref-audio", ".bin")
        path.write_bytes(raw)
        try:
            return self.engine.voice_prompt(str(path), (req.ref_text or "").strip() or None, req.x_vector_only_mode)
        finally:
            path.unlink(missing_ok=True)

    def speech(self, req: SpeechRequest) -> Response:
        try:
            handle = self.engine.submit(self.params(req))
        except OmniTTSError as e:
            raise _from_engine(e) from None
        streamed = req.stream_format is not None or req.stream or req.response_format == "pcm"
        if streamed and req.response_format not in ("pcm", "wav"):
            handle.cancel()
            raise ApiError(400, f"response_format '{req.response_format}' cannot be streamed; stream pcm or wav",
                           "response_format")
        if streamed and req.speed != 1.0:
            handle.cancel()
            raise ApiError(400, f"speed {req.speed:g} cannot be streamed (the time-stretch needs the whole clip): "
                                "ask for wav, flac, mp3, opus or aac without stream, or speed 1", "speed")
        headers = {"X-Sample-Rate": str(handle.sample_rate), "X-Request-Id": str(handle.id)}
        if req.stream_format == "sse":
            return StreamingResponse(self._sse(handle), media_type="text/event-stream", headers=headers)
        if streamed:
            return StreamingResponse(self._raw(handle, req.response_format), media_type=MEDIA[req.response_format],
                                     headers=headers)
        try:
            result = handle.result()
        except OmniTTSError as e:
            raise _from_engine(e) from None
        body = encode(stretch.change_speed(result.wav, result.sample_rate, req.speed), result.sample_rate,
                      req.response_format)
        return Response(body, media_type=MEDIA[req.response_format], headers=headers)

    def _raw(self, handle: Any, fmt: str) -> Iterator[bytes]:
        try:
            if fmt == "wav":
                yield wav_stream_header(handle.sample_rate)
            for chunk in handle.stream():
                yield files.pcm16(chunk.samples).astype("<i2").tobytes()
        except OmniTTSError as e:  # the status line is already sent: log it and end the body early
            log.warning("request #%s ended early: %s", handle.id, e)
        finally:
            if not handle.done:
                handle.cancel()  # the client went away

    def _sse(self, handle: Any) -> Iterator[str]:
        try:
            for chunk in handle.stream():
                audio = base64.b64encode(files.pcm16(chunk.samples).astype("<i2").tobytes()).decode()
                yield f"data: {json.dumps({'type': 'speech.audio.delta', 'audio': audio})}\n\n"
            m = handle.metrics
            usage = {"input_characters": len(handle.params.text), "output_seconds": round(m.audio_s, 3),
                     "queue_ms": m.queue_ms, "ttfp_ms": m.ttfp_ms, "e2e_ms": m.e2e_ms}
            yield f"data: {json.dumps({'type': 'speech.audio.done', 'usage': usage})}\n\n"
        except OmniTTSError as e:
            yield f"data: {json.dumps({'type': 'error', 'error': {'message': str(e)}})}\n\n"
        finally:
            if not handle.done:
                handle.cancel()


def router(engine: Any) -> APIRouter:
    """The /v1 routes over `engine`, to include in the app's FastAPI app."""
    service, r = SpeechService(engine), APIRouter(prefix="/v1")

    @r.post("/audio/speech")
    async def speech(request: Request) -> Response:
        try:
            body = await request.body()
            if len(body) > MAX_BODY_BYTES:
                raise ApiError(413, f"request body is {len(body)} bytes; at most {MAX_BODY_BYTES}")
            req = _parse(body)
            from starlette.concurrency import run_in_threadpool

            return await run_in_threadpool(service.speech, req)
        except ApiError as e:
            return e.response()

    @r.get("/audio/voices")
    def voices() -> dict[str, Any]:
        return service.voices()

    @r.get("/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": service.name, "object": "model", "owned_by": "omni-tts"}]}

    return r


def _parse(body: bytes) -> SpeechRequest:
    """The JSON body as a SpeechRequest; anything malformed -> ApiError 400 naming the first bad field."""
    try:
        data = json.loads(body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError(400, "the body is not valid JSON") from None
    if not isinstance(data, Mapping):
        raise ApiError(400, "the body must be a JSON object")
    try:
        return SpeechRequest.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(x) for x in first.get("loc", ())) or None
        raise ApiError(400, f"{field}: {first.get('msg', 'invalid')}", field) from None
