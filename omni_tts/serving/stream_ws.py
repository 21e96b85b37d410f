"""Text streamed in, audio streamed out: the WebSocket route `/v1/audio/speech/stream` (vLLM-Omni's protocol).

The client sends `{"type": "session.config", ...}` first (the speech route's fields: voice, language,
instructions, response_format or format (pcm or wav), speed, task_type, ref_audio, sampling, mode),
then `{"type": "input.text", "text": ...}` pieces and `{"type": "input.done"}`. The server sends, per
sentence as soon as the text completes it, `{"type": "audio.start", "sentence_index", "sentence_text",
"format"}`, binary audio frames as they are made (16-bit mono PCM at the model's rate; wav: a header
first), `{"type": "audio.done", "sentence_index"}`, and after the last `{"type": "session.done",
"total_sentences"}`; problems as `{"type": "error", "message", ...}`. A few sentences are synthesized
ahead while earlier ones are sent, in order. When either side closes, every request of the session is
cancelled; a request the engine refuses or that fails ends the session with its error (naming its
sentence), the close code saying whether to try again (1013). Owns the session's life
cycle; requests are made as the speech route makes them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
from typing import Any

import numpy as np
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from starlette.concurrency import run_in_threadpool

from omni_tts.engine.request import CLIENT_GONE
from omni_tts.errors import OmniTTSError
from omni_tts.limits import MAX_INPUT_CHARS
from omni_tts.models import stretch
from omni_tts.models.segments import take_sentences
from omni_tts.serving.encoding import pcm_bytes, wav_stream_header
from omni_tts.serving.errors import ApiError, from_engine
from omni_tts.serving.settings import ServeSettings
from omni_tts.serving.speech import SpeechService, json_object, parse

log = logging.getLogger("omni_tts.stream_ws")
AHEAD = 2  # sentences synthesized at once per session: the next one is ready when the current one ends
FORMATS = ("pcm", "wav")


class SentenceFailed(ApiError):
    """A sentence's request ended with an error: the session's last word, naming the sentence."""

    def __init__(self, e: ApiError, index: int) -> None:
        super().__init__(e.status, e.message, e.param, e.kind, e.retry_after_s)
        self.sentence_index = index


class Session:
    """One WebSocket session: its settings, the requests in flight, the sentences sent."""

    def __init__(self, ws: WebSocket, service: SpeechService) -> None:
        self.ws, self.service = ws, service
        self.params: Any = None
        self.format, self.speed = "pcm", 1.0
        self.handles: set[Any] = set()  # submitted and not yet sent (guarded by lock: submits run in threads)
        self.lock, self.closed, self.reason = threading.Lock(), False, ""  # reason: why it closed first
        self.sentences: asyncio.Queue = asyncio.Queue()  # complete sentences not yet submitted (None: the end)
        self.queue: asyncio.Queue = asyncio.Queue()  # (sentence, handle) submitted and not yet sent (None: the end)
        self.slots = asyncio.Semaphore(AHEAD)
        self.received = 0

    async def configure(self, message: dict[str, Any]) -> None:
        """The session's request settings, checked once as the speech route checks a body (ApiError)."""
        if message.get("type") != "session.config":
            raise ApiError(400, "the first message must be {\"type\": \"session.config\", ...}", "type")
        body = {k: v for k, v in message.items() if k not in ("type", "format")}
        self.format = str(message.get("format") or body.pop("response_format", None) or "pcm")
        if self.format not in FORMATS:
            raise ApiError(400, f"format '{self.format}' cannot be streamed; use pcm or wav", "response_format")
        req = parse(json.dumps({**body, "input": "."}).encode())
        self.speed = req.speed
        cap = self.service.settings.token_cap(self.ws.headers.get("authorization"))  # a public bind's anonymous cap
        self.params = await run_in_threadpool(self.service.params, req, cap)  # a reference clip is encoded once
        try:  # settings no sentence could run with (a mode not resident, a bad seed) end the session now
            self.service.engine.check(dataclasses.replace(self.params, text="."))
        except OmniTTSError as e:
            raise from_engine(e, self.service.settings.retry_after_s) from None

    async def receive(self) -> None:
        """Read the socket for as long as the session lasts (its pings and close frames are read only while
        the app reads): text until input.done, each sentence handed to `submit` as soon as it is complete
        (the session's text is bounded, so they never need to wait here), then only a close."""
        buffer, done = "", False
        while True:
            message = await self._next_message(idle=not done)
            kind = message.get("type") if isinstance(message, dict) else None
            if done:
                await self.error("the text ended with input.done: wait for session.done, or close to stop")
                continue
            if kind == "input.text" and isinstance(message.get("text"), str):
                buffer += message["text"]
                self.received += len(message["text"])
                if self.received > MAX_INPUT_CHARS:
                    raise ApiError(400, f"the session's text is over {MAX_INPUT_CHARS} characters; start another",
                                   "text")
                sentences, buffer = take_sentences(buffer)
            elif kind == "input.done":
                sentences, buffer, done = ([buffer.strip()] if buffer.strip() else []), "", True
            else:
                await self.error(_unexpected(message))
                continue
            for sentence in sentences + ([None] if done else []):
                self.sentences.put_nowait(sentence)

    async def submit(self) -> None:
        """Submit the sentences in order, at most AHEAD of them not yet sent, then end the send queue."""
        while (sentence := await self.sentences.get()) is not None:
            await self.slots.acquire()
            await self.queue.put((sentence, await self._submit(sentence)))
        await self.queue.put(None)

    async def _next_message(self, first: bool = False, idle: bool = True) -> dict[str, Any] | str:
        """The next message as a JSON object, or what is wrong with it; ApiError when none comes in time (a
        connection that sends nothing must not hold its place: the config is due as a request body is);
        without `idle`, as long as it takes."""
        settings = self.service.settings
        wait = settings.body_timeout_s if first else settings.ws_idle_timeout_s if idle else None
        try:
            raw = await asyncio.wait_for(self.ws.receive(), wait)
        except asyncio.TimeoutError:
            said = "no session.config" if first else "no message (input.done ends the text)"
            raise ApiError(408, f"{said} within {wait:g} s: the session ends", "type") from None
        if raw["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(raw.get("code", 1000))
        if raw.get("text") is None:
            return "a binary message (messages are JSON text)"
        try:  # read as the speech route reads a body: too deep, unsafe numbers and repeated keys are refused
            return json_object(raw["text"])
        except ApiError as e:
            return e.message.replace("the body", "the message")

    async def _submit(self, sentence: str) -> Any:
        """The sentence's request; a refusal ends the session (its settings, e.g. an unknown voice, would
        refuse every sentence)."""
        try:
            return await run_in_threadpool(self._submit_now, dataclasses.replace(self.params, text=sentence))
        except OmniTTSError as e:
            raise from_engine(e, self.service.settings.retry_after_s) from None

    def _submit_now(self, params: Any) -> Any:
        """Submit and register in one step, so a session closed meanwhile still cancels the request."""
        handle = self.service.engine.submit(params)
        with self.lock:
            self.handles.add(handle)
            if self.closed:
                handle.cancel(self.reason)
        return handle

    async def send(self) -> None:
        """Send every queued sentence's audio in order, then session.done."""
        index = 0
        while (item := await self.queue.get()) is not None:
            sentence, handle = item
            try:
                await self.ws.send_json({"type": "audio.start", "sentence_index": index, "sentence_text": sentence,
                                         "format": self.format})
                await self._audio(handle, index)
                await self.ws.send_json({"type": "audio.done", "sentence_index": index})
            finally:
                with self.lock:
                    self.handles.discard(handle)
                self.slots.release()
                index += 1
        await self.ws.send_json({"type": "session.done", "total_sentences": index})

    async def _audio(self, handle: Any, index: int) -> None:
        """The sentence's audio as binary frames as it is made (with speed != 1: at its end, stretched); a
        sentence that fails (past the deadline, a shutdown) ends the session with its error."""
        if self.format == "wav":
            await self.ws.send_bytes(wav_stream_header(handle.sample_rate))
        loop, chunks, kept = asyncio.get_running_loop(), iter(handle.stream()), []
        try:
            while (chunk := await loop.run_in_executor(None, next, chunks, None)) is not None:
                if self.speed == 1.0:
                    await self.ws.send_bytes(pcm_bytes(chunk.samples))
                else:
                    kept.append(chunk.samples)
        except OmniTTSError as e:
            raise SentenceFailed(from_engine(e, self.service.settings.retry_after_s), index) from None
        if kept:
            wav = stretch.change_speed(np.concatenate(kept), handle.sample_rate, self.speed)
            await self.ws.send_bytes(pcm_bytes(wav))

    async def error(self, message: str, index: int | None = None) -> None:
        body: dict[str, Any] = {"type": "error", "message": message}
        if index is not None:
            body["sentence_index"] = index
        await self.ws.send_json(body)

    def cancel_all(self, reason: str = "") -> None:
        with self.lock:
            if not self.closed:
                self.closed, self.reason = True, reason
            for handle in self.handles:
                handle.cancel(self.reason)


def router(engine: Any, settings: ServeSettings | None = None) -> APIRouter:
    """The WebSocket route over `engine`, to include in the app's FastAPI app."""
    service, r = SpeechService(engine, settings), APIRouter(prefix="/v1")

    @r.websocket("/audio/speech/stream")
    async def stream(ws: WebSocket) -> None:
        await ws.accept()
        session = Session(ws, service)
        tasks: list[asyncio.Task] = []
        try:
            first = await session._next_message(first=True)
            await session.configure(first if isinstance(first, dict) else {})
            reader = asyncio.create_task(session.receive())
            tasks = [reader, asyncio.create_task(session.submit()), asyncio.create_task(session.send())]
            await _until_sent(tasks)
            await ws.close()
        except ApiError as e:
            await _stop(tasks)  # nothing sent after the error: it is the session's last word
            await _last_word(ws, session, e)
        except (WebSocketDisconnect, RuntimeError, OSError) as e:  # the client left (or a send found it gone)
            log.info("stream session ended: %s", type(e).__name__)
            session.cancel_all(CLIENT_GONE)
        finally:
            session.cancel_all()
            await _stop(tasks)

    return r


async def _until_sent(tasks: list[asyncio.Task]) -> None:
    """Wait for the sender (the last task) to send session.done, then stop the reader (the first task); the
    first failure of any task (the reader's WebSocketDisconnect when the client leaves, an ApiError) is
    raised at once."""
    pending = set(tasks)
    while tasks[-1] in pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            t.result()  # raises the task's error; a reader only ends by raising
    await _stop(tasks[:1])


async def _stop(tasks: list[asyncio.Task]) -> None:
    """Cancel the session's reader and sender and wait until they have stopped."""
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _unexpected(message: dict[str, Any] | str) -> str:
    """What is wrong with a message the session cannot take now, and what it takes."""
    takes = "expected input.text (with a text string) or input.done"
    if isinstance(message, str):
        return f"{message}: {takes}"
    if message.get("type") == "session.config":
        return f"session.config comes once, as the first message: {takes}"
    return f"unknown message {str(message)[:80]}: {takes}"


async def _last_word(ws: WebSocket, session: Session, e: ApiError) -> None:
    """An error that ends the session: say it, then close (the client may have left already) with the
    code that says why: 1013 try again later (busy, shutting down), 1011 the server failed, 1008 a rule the
    session broke (a bad message or setting, the server's deadline)."""
    code = 1013 if e.status == 503 else 1011 if e.status == 500 else 1008
    try:
        await session.error(e.message, getattr(e, "sentence_index", None))
        await ws.close(code=code)
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass
