"""OpenAI-compatible speech route: `POST /v1/audio/speech` (the voices' routes: serving.voices).

Owns: the request body (OpenAI's fields `model`, `input`, `voice`, `instructions`, `response_format`,
`speed`, `stream_format`, plus vLLM-Omni's `stream`, `task_type`, `language`, `ref_audio`, `ref_text`,
`x_vector_only_mode`, `max_new_tokens` and sampling fields; ours: `mode`), reading it strictly (JSON only,
every bad value one 4xx naming its field: numbers outside JSON's safe range, nesting too deep, fields
given twice), the anonymous cap on `max_new_tokens` of a public bind, and choosing between a whole clip,
raw streamed chunks (`stream_format: "audio"` or `stream: true`, and pcm always) and server-sent events
(`stream_format: "sse"`). Uses only the Engine's public API and the same request validation as every
other entry point; the streams themselves live in serving.streams, the encodings in serving.encoding.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
from collections.abc import Awaitable
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from omni_tts import voices
from omni_tts.config import SynthesisParams
from omni_tts.errors import InputError, OmniTTSError
from omni_tts.models import stretch
from omni_tts.serving import streams
from omni_tts.serving.encoding import MEDIA, STREAMABLE, encode
from omni_tts.serving.errors import ApiError, clip_error, from_engine
from omni_tts.serving.settings import ServeSettings
from omni_tts.ui import files, labels

T = TypeVar("T")
TASKS = {"customvoice": "custom_voice", "custom_voice": "custom_voice", "voicedesign": "voice_design",
         "voice_design": "voice_design", "base": "voice_clone", "voice_clone": "voice_clone"}
API_TASKS = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign", "voice_clone": "Base"}
MAX_SAFE_INT = 2**53 - 1  # JSON's interoperable integers (RFC 8259 section 6)


class SpeechRequest(BaseModel):
    """The body of POST /v1/audio/speech (unknown fields are refused, naming them; no value is converted into
    another type: "stream": "yes" or "seed": true are refused, only a number may stand for a float)."""

    model_config = ConfigDict(extra="forbid", strict=True)
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

    @property
    def streamed(self) -> bool:
        return self.stream_format is not None or self.stream or self.response_format == "pcm"

    @property
    def voice_id(self) -> str | None:
        """The voice's name, given as a string or as {"id": name}."""
        return self.voice.get("id") if isinstance(self.voice, dict) else self.voice


class SpeechService:
    """The routes' logic over one engine (kept apart from FastAPI's routing so tests call it too)."""

    def __init__(self, engine: Any, settings: ServeSettings | None = None) -> None:
        self.engine, self.settings = engine, settings or ServeSettings()
        self.info = engine.model_info()
        self.name = str(self.info.get("name") or "omni-tts")

    def voices(self) -> dict[str, Any]:
        data = [{"id": s, "name": labels.SPEAKERS.get(s.lower(), (labels.speaker_label(s), ""))[0],
                 "description": labels.SPEAKERS.get(s.lower(), ("", ""))[1]} for s in self.info["speakers"]]
        return {"object": "list", "voices": [v["id"] for v in data], "data": data}

    def params(self, req: SpeechRequest, token_cap: int | None = None) -> SynthesisParams:
        """The engine request of a body (ApiError naming the field for what only this API can get wrong)."""
        try:
            stretch.check_speed(req.speed)
        except InputError as e:
            raise ApiError(400, str(e), "speed") from None
        if req.streamed and req.speed != 1.0:
            raise ApiError(400, f"speed {req.speed:g} cannot be streamed (the time-stretch needs the whole clip): "
                                "ask for wav, flac, mp3, opus or aac without stream, or speed 1", "speed")
        if isinstance(req.voice, dict) and (set(req.voice) != {"id"} or not req.voice["id"].strip()):
            raise ApiError(400, "voice: an object names its voice as {\"id\": \"<name>\"} and nothing else", "voice")
        saved = self._saved_voice(req)
        if req.streamed and req.response_format not in STREAMABLE:
            raise ApiError(400, f"response_format '{req.response_format}' cannot be streamed; stream pcm or wav",
                           "response_format")
        task = TASKS.get((req.task_type or "").replace("-", "_").lower()) if req.task_type else None
        if req.task_type and task is None:
            raise ApiError(400, f"unknown task_type '{req.task_type}'; valid: CustomVoice, VoiceDesign, Base",
                           "task_type")
        task = task or ("voice_clone" if saved is not None else (self.info["tasks"] or ["custom_voice"])[0])
        if task not in self.info["tasks"]:
            raise ApiError(400, f"task_type '{req.task_type}' is not what this model does; it does: "
                           f"{', '.join(self.info['tasks'])}", "task_type")
        if req.ref_audio and (task != "voice_clone" or saved is not None):
            said = f"voice '{_quoted(req.voice_id or '')}' is a saved voice" if saved is not None else \
                f"task_type {API_TASKS[task]} does not clone a voice"
            raise ApiError(400, f"ref_audio is not used here: {said}; send either a saved voice or ref_audio",
                           "ref_audio")
        speaker = self._speaker(req) if task == "custom_voice" else None
        prompt = saved if saved is not None else self._voice_prompt(req) if task == "voice_clone" else None
        return SynthesisParams(text=req.input, task=task, speaker=speaker, language=req.language or "auto",
                               instruct=(req.instructions or "").strip() or None, temperature=req.temperature,
                               top_k=req.top_k, top_p=req.top_p, repetition_penalty=req.repetition_penalty,
                               max_new_tokens=_capped(req.max_new_tokens, token_cap), seed=req.seed,
                               voice=prompt, mode=req.mode)

    def _speaker(self, req: SpeechRequest) -> str | None:
        """The voice named (or the model's first); an unknown one is refused here, quoted as given."""
        voice = req.voice_id
        speakers = self.info["speakers"]
        if not voice:
            return (speakers or [None])[0]
        if voice.strip().lower() not in {s.lower() for s in speakers}:
            raise ApiError(400, f"unknown voice '{_quoted(voice)}'; valid: {', '.join(speakers) or 'none'}", "voice")
        return voice

    def _saved_voice(self, req: SpeechRequest) -> Any:
        """The saved voice `voice` names (omni_tts.voices; built-in speakers win), else None."""
        voice = req.voice_id
        try:
            saved = voices.by_name(voice, self.info["speakers"])
        except InputError as e:
            raise ApiError(400, str(e), "voice") from None
        if saved is not None and "voice_clone" not in self.info["tasks"]:
            tasks = ", ".join(self.info["tasks"])
            raise ApiError(400, f"voice '{voice}' is a saved (cloned) voice, and this model ({tasks}) cannot "
                                "clone voices: load a Base checkpoint", "voice")
        return saved

    def _voice_prompt(self, req: SpeechRequest) -> Any:
        if not req.ref_audio:
            if req.voice_id:  # a name the library does not hold: say so, rather than ask for a clip
                raise ApiError(400, f"unknown voice '{_quoted(req.voice_id)}': no saved voice has that name (saved: "
                                    f"{', '.join(voices.saved_voices()) or 'none'}); or send ref_audio to clone "
                                    "one for this request", "voice")
            raise ApiError(400, "task_type Base (voice clone) needs ref_audio: base64 audio or a data: URL",
                           "ref_audio")
        url = req.ref_audio.startswith("data:")
        _, comma, data = req.ref_audio.partition(",") if url else ("", ",", req.ref_audio)
        if not comma:
            raise ApiError(400, "ref_audio: a data: URL carries its audio after a comma (data:audio/wav;base64,...)",
                           "ref_audio")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "ref_audio is not valid base64", "ref_audio") from None
        path = files.out_dir().new("ref-audio", ".bin")
        path.write_bytes(raw)
        try:
            return self.engine.voice_prompt(str(path), (req.ref_text or "").strip() or None, req.x_vector_only_mode)
        except OmniTTSError as e:
            raise clip_error(e, path, "ref_audio", self.settings.retry_after_s) from None
        finally:
            path.unlink(missing_ok=True)

    def submit(self, req: SpeechRequest, token_cap: int | None = None) -> Any:
        """Check and submit (in a worker thread: prompts and reference clips are prepared here)."""
        params = self.params(req, token_cap)
        try:
            return self.engine.submit(params)
        except OmniTTSError as e:
            raise from_engine(e, self.settings.retry_after_s) from None

    async def speech(self, request: Request) -> Response:
        check_json(request.headers.get("content-type"))  # before the body: no upload for a refused one
        req = parse(await _body(request, self.settings))
        try:
            handle = await run_in_threadpool(self.submit, req, self.settings.token_cap(
                request.headers.get("authorization")))
        except OmniTTSError as e:  # the voice prompt's checks
            raise from_engine(e, self.settings.retry_after_s) from None
        headers = {"X-Sample-Rate": str(handle.sample_rate), "X-Request-Id": str(handle.id)}
        sse = req.stream_format == "sse"
        # a whole clip is kept until it is finished anyway: only a stream's reader can fall behind
        feed = streams.Feed(handle, self.settings.stream_buffer_bytes if req.streamed else None,
                            8 / 3 if sse else 2.0)
        if sse:
            return streams.AudioStream(feed, streams.sse_body(feed), media_type="text/event-stream", headers=headers)
        if req.streamed:
            return streams.AudioStream(feed, streams.raw_body(feed, req.response_format),
                                       media_type=MEDIA[req.response_format], headers=headers)
        if not await feed.finished(request):
            return Response(status_code=499)  # nobody is left to read it
        try:
            result = handle.result(0)
        except OmniTTSError as e:  # answered with the request's id, as its audio would have been
            r = from_engine(e, self.settings.retry_after_s).response()
            r.headers.update(headers)
            return r
        wav = await run_in_threadpool(stretch.change_speed, result.wav, result.sample_rate, req.speed)
        body = await run_in_threadpool(encode, wav, result.sample_rate, req.response_format)
        return Response(body, media_type=MEDIA[req.response_format], headers=headers)


def _quoted(name: str, limit: int = 64) -> str:
    """A name as a message quotes it: JSON-escaped (no control characters in a log line), cut at `limit`."""
    return json.dumps(name[:limit])[1:-1] + ("..." if len(name) > limit else "")


def _capped(asked: int | None, cap: int | None) -> int | None:
    if cap is None:
        return asked
    if asked is None:
        return cap
    if asked > cap:
        raise ApiError(400, f"max_new_tokens {asked} is above this server's {cap} for anonymous callers (an "
                       f"admin token as 'Authorization: Bearer' lifts it)", "max_new_tokens")
    return asked


async def _body(request: Request, settings: ServeSettings) -> bytes:
    """The request body, at most max_body_bytes (413), arriving within body_timeout_s (408)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > settings.max_body_bytes:
        raise ApiError(413, f"request body is {declared} bytes; at most {settings.max_body_bytes}")

    async def read() -> bytes:
        out = bytearray()
        async for piece in request.stream():
            out += piece
            if len(out) > settings.max_body_bytes:
                raise ApiError(413, f"request body is over {settings.max_body_bytes} bytes")
        return bytes(out)

    try:
        return await body_in_time(read(), settings)
    except ClientDisconnect:  # nobody is left to answer: no error worth a traceback
        raise ApiError(499, "the client left before its request body arrived") from None


async def body_in_time(reading: Awaitable[T], settings: ServeSettings) -> T:
    """`reading` (a request body being read) awaited for at most body_timeout_s; past it, a 408."""
    try:
        return await asyncio.wait_for(reading, settings.body_timeout_s)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {settings.body_timeout_s:g} s") from None


class _Unsafe(Exception):
    """A number JSON cannot carry exactly between systems (raised from inside the JSON scanner)."""


def _int(text: str) -> int:
    # the length test first: int() refuses (and is slow on) thousands of digits
    if len(text.lstrip("-")) > 16 or abs(int(text)) > MAX_SAFE_INT:
        shown = text if len(text) <= 20 else f"{text[:20]}... ({len(text)} characters)"
        raise _Unsafe(f"{shown} is outside JSON's safe integer range (at most {MAX_SAFE_INT} either way)")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Unsafe(f"{text[:20]} is not a finite number")
    return value


def _constant(text: str) -> Any:
    raise _Unsafe(f"{text} is not a JSON number")


_DECODER = json.JSONDecoder(parse_int=_int, parse_float=_float, parse_constant=_constant)
_SPACE = " \t\n\r"


def check_json(content_type: str | None) -> None:
    """ApiError 415 unless the body is declared JSON (checked before it is read: a client that sent
    'Expect: 100-continue' is refused before it uploads)."""
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind != "application/json" and not (kind.startswith("application/") and kind.endswith("+json")):
        raise ApiError(415, f"the body must be JSON sent as Content-Type: application/json (got "
                       f"'{kind or 'none'}')", kind="unsupported_media_type")


def parse(body: bytes, content_type: str | None = "application/json") -> SpeechRequest:
    """The JSON body as a SpeechRequest; anything else is an ApiError: 415 for a body that is not JSON,
    400 naming the first bad field."""
    check_json(content_type)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "the body is not valid UTF-8") from None
    data = json_object(text)
    try:
        return SpeechRequest.model_validate(data)
    except ValidationError as e:
        errors = e.errors()
        field = str((errors[0].get("loc") or ("body",))[0])
        # a field of several accepted types (voice: a name or {"id": name}) fails once per type
        said = dict.fromkeys(x.get("msg", "invalid") for x in errors if (x.get("loc") or ("body",))[0] == field)
        raise ApiError(400, f"{field}: {', or '.join(said)}", field) from None


def json_object(text: str) -> dict[str, Any]:
    """A JSON object read member by member with json's own scanner, so a value that cannot be read (too
    deep, an unsafe number) is reported under its field's name."""
    i = _skip(text, 0)
    if text[i:i + 1] != "{":
        raise ApiError(400, "the body must be a JSON object" if text.strip() else "the body is empty")
    out: dict[str, Any] = {}
    i = _skip(text, i + 1)
    if text[i:i + 1] == "}":
        return _end(text, i, out)
    while True:
        key, i = _scan(text, i, None)
        if not isinstance(key, str) or text[_skip(text, i):_skip(text, i) + 1] != ":":
            raise ApiError(400, f"the body is not valid JSON (near character {i})")
        value, i = _scan(text, _skip(text, _skip(text, i) + 1), key)
        if key in out:
            raise ApiError(400, f"{key}: given twice", key)
        out[key] = value
        i = _skip(text, i)
        if text[i:i + 1] == "}":
            return _end(text, i, out)
        if text[i:i + 1] != ",":
            raise ApiError(400, f"the body is not valid JSON (near character {i})")
        i = _skip(text, i + 1)


def _scan(text: str, i: int, field: str | None) -> tuple[Any, int]:
    try:
        return _DECODER.scan_once(text, i)
    except _Unsafe as e:
        raise ApiError(400, f"{field}: {e}", field) from None
    except RecursionError:
        raise ApiError(400, f"{field}: nested too deeply", field) from None
    except (StopIteration, ValueError):
        where = f" in {field}" if field else ""
        raise ApiError(400, f"the body is not valid JSON (near character {i}{where})", field) from None


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _SPACE:
        i += 1
    return i


def _end(text: str, i: int, out: dict[str, Any]) -> dict[str, Any]:
    if _skip(text, i + 1) != len(text):
        raise ApiError(400, "the body is not valid JSON (text after the object)")
    return out


def router(service: SpeechService) -> APIRouter:
    """The /v1 speech routes over `service`."""
    r = APIRouter(prefix="/v1")

    @r.post("/audio/speech")
    async def speech(request: Request) -> Response:
        try:
            return await service.speech(request)
        except ApiError as e:
            return e.response()

    return r
