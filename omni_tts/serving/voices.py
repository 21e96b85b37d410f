"""Saved voices over HTTP: `POST /v1/audio/voices` (multipart), `GET /v1/audio/voices`,
`DELETE /v1/audio/voices/{name}`.

Owns: the upload form (file `audio_sample` up to 10 MB, `name`, `consent`, optional `ref_text` and
`x_vector_only`), its checks and error statuses (400 naming the field, 409 for a taken name, 413 for
a clip over the limit, 411 for a body of unknown length, 403 when the admin gate refuses), the
listing of built-in speakers beside saved voices with their kind, and the admin gate on changes. The
voices are made with the engine's public `voice_prompt` and kept in the library the page uses
(omni_tts.voices).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from omni_tts import voices
from omni_tts.errors import InputError, OmniTTSError
from omni_tts.serving.errors import ApiError, clip_error
from omni_tts.serving.settings import ADMIN_ENV, ServeSettings
from omni_tts.serving.speech import SpeechService, body_in_time

MAX_SAMPLE_BYTES = 10 << 20
FORM_FIELDS = {"audio_sample", "name", "consent", "ref_text", "x_vector_only"}
_YES, _NO = {"1", "true", "yes", "on"}, {"", "0", "false", "no", "off"}


def _flag(value: Any, field: str) -> bool:
    text = str(value or "").strip().lower()
    if text not in _YES | _NO:
        raise ApiError(400, f"{field} must be true or false (got {str(value)[:40]!r})", field)
    return text in _YES


def _admin(settings: ServeSettings, request: Request, what: str) -> None:
    """Refuse (403) a change of the library unless this caller may make it: with an admin token set, whoever
    sends it as 'Authorization: Bearer <token>'; without one, anyone on a private bind, nobody on a public one."""
    if settings.admin_token:
        if not settings.is_admin(request.headers.get("authorization")):
            raise ApiError(403, f"{what} changes the server's voice library: send the admin token (set by "
                                f"{ADMIN_ENV} on the server) as 'Authorization: Bearer <token>'", None,
                           "permission_error")
    elif settings.public:
        raise ApiError(403, f"{what} is off on a public server: start it with {ADMIN_ENV}=<token> and send that "
                            "token as 'Authorization: Bearer <token>'", None, "permission_error")


def saved_entry(name: str) -> dict[str, Any]:
    return {**voices.describe(name), "object": "audio.voice"}


class VoiceService:
    """The routes' logic over one engine and the voice library."""

    def __init__(self, engine: Any, settings: ServeSettings) -> None:
        self.engine, self.speech = engine, SpeechService(engine, settings)
        self.tasks = engine.model_info()["tasks"]

    def listing(self) -> dict[str, Any]:
        listed = self.speech.voices()
        builtin = [{**v, "kind": "builtin"} for v in listed["data"]]
        saved = [saved_entry(n) for n in voices.saved_voices()]
        return {"object": "list", "voices": listed["voices"] + [v["name"] for v in saved], "data": builtin + saved}

    def create(self, form: Any) -> dict[str, Any]:
        unknown = sorted(set(form.keys()) - FORM_FIELDS)
        if unknown:
            raise ApiError(400, f"unknown form field '{unknown[0]}'; valid: {', '.join(sorted(FORM_FIELDS))}",
                           unknown[0])
        name = str(form.get("name") or "")
        try:
            stem = voices.voice_name(name)
        except InputError as e:
            raise ApiError(400, f"name: {e}", "name") from None
        consent = str(form.get("consent") or "").strip()
        if consent.lower() in _NO:
            raise ApiError(400, "consent is required: confirm that the speaker of audio_sample agreed to have "
                                "their voice cloned (consent=true, or a consent record's id)", "consent")
        x_only = _flag(form.get("x_vector_only"), "x_vector_only")
        ref_text = str(form.get("ref_text") or "").strip() or None
        if "voice_clone" not in self.tasks:
            raise ApiError(400, f"this model ({', '.join(self.tasks)}) cannot clone voices: saving a voice needs "
                                "a Base checkpoint", "audio_sample")
        if voices.exists(stem):
            raise ApiError(409, f"a voice named '{stem}' already exists; delete it first or pick another name", "name")
        prompt = self._prompt(form.get("audio_sample"), ref_text, x_only)
        try:
            record = voices.save(stem, prompt, {"consent": consent, "source": "api"})
        except voices.VoiceExists as e:  # saved by someone else meanwhile
            raise ApiError(409, str(e), "name") from None
        return {**record, "object": "audio.voice"}

    def _prompt(self, upload: Any, ref_text: str | None, x_only: bool) -> Any:
        if not isinstance(upload, UploadFile):
            raise ApiError(400, "audio_sample is required: attach the reference clip as a file", "audio_sample")
        data = upload.file.read(MAX_SAMPLE_BYTES + 1)
        if len(data) > MAX_SAMPLE_BYTES:
            raise ApiError(413, f"audio_sample is over {MAX_SAMPLE_BYTES >> 20} MB", "audio_sample")
        fd, tmp = tempfile.mkstemp(suffix=Path(upload.filename or "").suffix[:8] or ".bin")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return self.engine.voice_prompt(tmp, ref_text, x_only)
        except OmniTTSError as e:
            raise clip_error(e, tmp, "audio_sample", self.speech.settings.retry_after_s) from None
        finally:
            Path(tmp).unlink(missing_ok=True)

    def delete(self, name: str) -> dict[str, Any]:
        try:
            stem = voices.voice_name(name)
        except InputError as e:
            raise ApiError(400, f"name: {e}", "name") from None
        stored = voices.delete(stem)  # as it was saved, whatever the case asked
        if stored is None:
            raise ApiError(404, f"no saved voice named '{stem}'", "name", "not_found_error")
        return {"id": stored, "object": "audio.voice.deleted", "deleted": True}


def router(engine: Any, settings: ServeSettings | None = None) -> APIRouter:
    """The voice routes over `engine`; `settings` say whether the bind is public and the admin token."""
    settings = settings or ServeSettings()
    service, r = VoiceService(engine, settings), APIRouter(prefix="/v1")

    @r.get("/audio/voices")
    def listing() -> dict[str, Any]:
        return service.listing()

    @r.post("/audio/voices")
    async def create(request: Request) -> JSONResponse:
        try:
            _admin(settings, request, "Saving a voice")
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind not in ("multipart/form-data", "application/x-www-form-urlencoded"):  # a form, even a fileless one
                raise ApiError(415, "send the voice as a multipart form (Content-Type: multipart/form-data) with "
                                    f"audio_sample, name and consent (got '{kind[:60] or 'none'}')",
                               kind="unsupported_media_type")
            declared = request.headers.get("content-length", "")
            if not declared.isdigit():  # a body of unknown length would be spooled whole before any check
                raise ApiError(411, "send the form with a Content-Length header")
            size = int(declared)
            if size > MAX_SAMPLE_BYTES + (1 << 20):
                raise ApiError(413, f"request body is {size} bytes; audio_sample may be at most "
                                    f"{MAX_SAMPLE_BYTES >> 20} MB", "audio_sample")
            try:
                form = await body_in_time(request.form(max_files=1, max_fields=len(FORM_FIELDS)), settings)
            except ApiError:
                raise
            except Exception as e:  # noqa: BLE001 - starlette raises its own types for a malformed form
                raise ApiError(400, f"the body is not a valid multipart form ({e})") from None
            try:
                return JSONResponse(await run_in_threadpool(service.create, form))
            finally:
                await form.close()
        except ApiError as e:
            return e.response()

    @r.delete("/audio/voices/{name}")
    def delete(name: str, request: Request) -> JSONResponse:
        try:
            _admin(settings, request, "Deleting a voice")
            return JSONResponse(service.delete(name))
        except ApiError as e:
            return e.response()

    return r
