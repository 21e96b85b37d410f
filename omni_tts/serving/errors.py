"""The service's errors as OpenAI-style JSON: `ApiError` (status, one-line message, the field it names)
and how an engine error maps onto it (400 for a bad request, 503 with Retry-After when the engine is
busy or shut down, 504 past the request deadline). Knows nothing about routes or the engine's insides.
"""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.responses import JSONResponse

from omni_tts.errors import DeadlineExceeded, EngineError, InputError, OmniTTSError, Overloaded
from omni_tts.ui import labels

# engine message openings -> the API field they are about
PARAMS = {"text": "input", "speaker": "voice", "language": "language", "instruct": "instructions",
          "reference audio": "ref_audio", "ref_text": "ref_text", "max_new_tokens": "max_new_tokens",
          "seed": "seed", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
          "repetition_penalty": "repetition_penalty", "task": "task_type", "mode": "mode"}
OPENING_ONLY = {"mode"}  # words other messages use too ("ICL mode needs ref_text")


class ApiError(Exception):
    """One error response: status, message (one line), the body field it names, OpenAI's error type."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.retry_after_s = retry_after_s

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}
        headers = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else None
        return JSONResponse(body, status_code=self.status, headers=headers)


def from_engine(e: OmniTTSError, retry_after_s: int = 1) -> ApiError:
    """An engine error in this API's field names: 400 (bad request), 503 + Retry-After (busy: try again;
    shut down or a mode that failed), 504 (past the deadline)."""
    message = labels.in_ui_words(str(e), labels.OPENAI_FIELDS)
    if isinstance(e, Overloaded):
        return ApiError(503, message, None, "overloaded", retry_after_s)
    if isinstance(e, DeadlineExceeded):
        return ApiError(504, message, None, "timeout")
    if isinstance(e, EngineError) and not isinstance(e, InputError):
        return ApiError(503, message, None, "server_error", retry_after_s)
    return ApiError(400, message, param_of(str(e)))


def param_of(message: str) -> str | None:
    """The API field an engine message is about: the key it opens with, else the first key named early on
    as a word of its own (ref_text is not text); None when it names none."""
    low = message.lower()
    keys = sorted(PARAMS, key=len, reverse=True)
    key = next((k for k in keys if low.startswith(k)), None)
    if key is None:
        found = [(m.start(), k) for k in keys if k not in OPENING_ONLY
                 and (m := re.search(rf"(?<!\w){re.escape(k)}\b", low[:40]))]
        key = min(found)[1] if found else None
    return PARAMS.get(key) if key else None


def clip_error(e: OmniTTSError, path: str | Path, field: str, retry_after_s: int = 1) -> ApiError:
    """An error about a reference clip the API wrote to the temporary file `path`, told with the field that
    carried the clip instead of that file: 400 naming `field` (ref_text when only the transcript is wrong);
    an engine that cannot take it answers as `from_engine` does."""
    if not isinstance(e, InputError):
        return from_engine(e, retry_after_s)
    message = " ".join(str(e).split())
    for said in (str(path), Path(path).name):
        for form in (f"reference audio '{said}'", f"reference audio {said}", f"'{said}'", said):
            message = message.replace(form, field)
    message = re.sub(r"^reference audio\b", field, message)
    param = "ref_text" if "ref_text" in message and field not in message else field
    return ApiError(400, message if message.startswith(param) else f"{param}: {message}", param)
