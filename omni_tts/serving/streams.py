"""A request's audio on the event loop, for as long as its client stays: streamed bodies (raw pcm/wav,
server-sent events) and the wait for a whole clip.

Owns: waking the loop from the engine's threads (RequestHandle.listen) so no thread waits on a stream,
cancelling the request when its client goes away ("client gone": Starlette cancels a streaming response
when the client disconnects; a whole clip's wait watches for the disconnect itself), the per-stream bound
on audio made but not yet taken by a slow reader ("slow reader"), and ending a stream that cannot finish
as an error the client sees: an SSE `error` event, or a raw body aborted without its clean end.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import queue
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from omni_tts.engine.request import CLIENT_GONE
from omni_tts.errors import OmniTTSError
from omni_tts.serving.encoding import pcm_bytes, wav_stream_header
from omni_tts.serving.errors import from_engine

log = logging.getLogger("omni_tts.serving")
SLOW_READER = "slow reader"


class StreamAborted(Exception):
    """Raised out of a raw audio body that cannot finish: uvicorn drops the connection, so the client sees
    a cut transfer, not a short clip that looks complete (the reason is logged where it is raised)."""


class Feed:
    """The chunks of one request, taken on the event loop; it is woken by the engine's threads."""

    def __init__(self, handle: Any, max_backlog_bytes: int | None = None, bytes_per_sample: float = 2.0) -> None:
        self.handle, self.taken = handle, 0  # samples taken so far
        self.max_backlog, self.bytes_per_sample = max_backlog_bytes, bytes_per_sample
        self.task: asyncio.Task | None = None  # the task to cut when a slow reader falls too far behind
        self._wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        handle.listen(lambda: loop.call_soon_threadsafe(self._on_event))

    def _on_event(self) -> None:
        self._wake.set()
        backlog = (self.handle.metrics.audio_samples - self.taken) * self.bytes_per_sample
        if self.max_backlog and backlog > self.max_backlog and not self.handle.done:
            log.warning("request #%s cancelled: its reader is %.1f MB behind (bound %.1f MB)", self.handle.id,
                        backlog / 2**20, self.max_backlog / 2**20)
            self.handle.cancel(SLOW_READER)
            if self.task is not None:  # it may be stuck writing to a client that does not read
                self.task.cancel()

    async def __aiter__(self) -> AsyncIterator[Any]:
        while True:
            self._wake.clear()
            try:
                chunk = self.handle.take(0)
            except queue.Empty:
                await self._wake.wait()
                continue
            if chunk is None:
                return
            self.taken += chunk.samples.size
            yield chunk

    async def finished(self, request: Request) -> bool:
        """Wait for the request's end; -> False (and the request cancelled) when the client left first."""
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            while True:
                self._wake.clear()
                if self.handle.done or gone.done():
                    break
                woke = asyncio.ensure_future(self._wake.wait())
                await asyncio.wait({woke, gone}, return_when=asyncio.FIRST_COMPLETED)
                woke.cancel()
            ended = self.handle.done
        finally:
            gone.cancel()
            if not self.handle.done:
                self.handle.cancel(CLIENT_GONE)
        return ended


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body is already read, so nothing else arrives)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class AudioStream(StreamingResponse):
    """A streamed body over a request's Feed: the request is cancelled ("client gone") when the response
    ends before the request does, and the body's task can be cut by the Feed (a slow reader)."""

    def __init__(self, feed: Feed, body: AsyncIterator[bytes | str], **kw: Any) -> None:
        super().__init__(body, **kw)
        self.feed = feed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.feed.task = asyncio.current_task()
        try:
            await super().__call__(scope, receive, send)
        except asyncio.CancelledError:
            if self.feed.handle.cancel_reason != SLOW_READER:
                raise
            asyncio.current_task().uncancel()  # the cut is ours: the task ends with the abort instead
            raise StreamAborted(f"request #{self.feed.handle.id}: {SLOW_READER}") from None
        finally:
            if not self.feed.handle.done:
                self.feed.handle.cancel(CLIENT_GONE)


async def raw_body(feed: Feed, fmt: str) -> AsyncIterator[bytes]:
    """pcm (or wav: a header first) as it is made; a request that ends in an error aborts the body."""
    if fmt == "wav":
        yield wav_stream_header(feed.handle.sample_rate)
    try:
        async for chunk in feed:
            yield pcm_bytes(chunk.samples)
    except OmniTTSError as e:  # the status line is already sent: only a cut transfer tells the client
        log.warning("request #%s ended early, aborting its stream: %s", feed.handle.id, e)
        raise StreamAborted(str(e)) from None


async def sse_body(feed: Feed) -> AsyncIterator[str]:
    """`speech.audio.delta` events as audio is made, then `speech.audio.done` with the usage, or an
    `error` event when the request cannot finish (an engine error, a shutdown)."""
    handle = feed.handle
    try:
        async for chunk in feed:
            audio = base64.b64encode(pcm_bytes(chunk.samples)).decode()
            yield _event({"type": "speech.audio.delta", "audio": audio})
    except OmniTTSError as e:
        log.warning("request #%s ended early: %s", handle.id, e)
        err = from_engine(e)  # typed as the whole clip's response would be: timeout, overloaded, server_error
        yield _event({"type": "error", "error": {"message": err.message, "type": err.kind, "code": err.status}})
        return
    yield _event({"type": "speech.audio.done", "usage": usage(handle)})


def usage(handle: Any) -> dict[str, Any]:
    """Characters in, seconds out, and the request's timings (ms, to 0.1)."""
    m = handle.metrics
    r = lambda x: None if x is None else round(x, 1)  # noqa: E731
    return {"input_characters": len(handle.params.text), "output_seconds": round(m.audio_s, 3),
            "queue_ms": r(m.queue_ms), "ttfp_ms": r(m.ttfp_ms), "e2e_ms": r(m.e2e_ms)}


def _event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"
