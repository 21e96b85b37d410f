"""The uvicorn server that runs the service's app, with its limits set: connections and tasks at once,
idle keep-alive, the size of a request's headers (incomplete: uvicorn's bound; complete: `HeaderChecks`,
which also refuses ambiguous body framing), a deadline for headers that never complete (uvicorn has none:
a connection that sends part of a request line and waits would stay open), and a bounded shutdown.

Owns `Server` (start in a thread and wait until it listens, stop, wait, and `close`: the shutdown in
order, draining the engine first) and the quiet abort of a stream that cannot finish
(serving.streams.StreamAborted: uvicorn logs an ASGI exception with a traceback for it; the stream
already logged its reason). Knows nothing about Gradio; of the engine, only `drain` and `shutdown`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from omni_tts.errors import OmniTTSError
from omni_tts.serving.errors import ApiError
from omni_tts.serving.settings import ServeSettings
from omni_tts.serving.streams import StreamAborted


class HeaderDeadlineH11(H11Protocol):
    """uvicorn's h11 protocol, plus: a connection with no response under way and no keep-alive timer (its
    next request's headers not complete, or bytes still arriving after its response, which stop uvicorn's
    keep-alive timer) is closed `header_timeout_s` after its first byte (or the connection's start)."""

    header_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _idle(self) -> bool:
        """No response under way and no keep-alive timer: nothing would ever close this connection."""
        return self.timeout_keep_alive_task is None and (self.cycle is None or self.cycle.response_complete)

    def _arm(self) -> None:
        """Start the deadline while the connection is idle (never restarted by more bytes)."""
        if not self._idle():
            self._disarm()
        elif self._header_timer is None and not self.transport.is_closing():
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expire(self) -> None:
        self._header_timer = None
        if self._idle() and not self.transport.is_closing():
            self.transport.close()


class HeaderChecks:
    """ASGI middleware for what uvicorn's h11 lets through: an HTTP request whose request line and headers,
    complete, exceed `limit` bytes is a 431 (h11 bounds only headers still arriving, so a large block sent in
    one write is parsed whole; a WebSocket handshake is bounded by the websockets library); one with both
    Content-Length and Transfer-Encoding, whose framing two parsers may read apart, is a 400. Both close the
    connection."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        refusal = self._refusal(scope) if scope["type"] == "http" else None
        if refusal is None:
            return await self.app(scope, receive, send)
        response = refusal.response()
        response.headers["connection"] = "close"
        await response(scope, receive, send)

    def _refusal(self, scope: dict) -> ApiError | None:
        if _header_bytes(scope) > self.limit:
            return ApiError(431, f"request headers over {self.limit} bytes")
        if {b"content-length", b"transfer-encoding"} <= {k.lower() for k, _ in scope.get("headers", [])}:
            return ApiError(400, "a request may not carry both Content-Length and Transfer-Encoding")
        return None


def _header_bytes(scope: dict) -> int:
    """The fewest bytes the request line and headers took ('METHOD target HTTP/1.1', each header 'name:value',
    CRLFs): what the parser dropped (whitespace around values) is not counted, so none is over-counted."""
    query = scope.get("query_string", b"")
    line = len(scope.get("method", "GET")) + len(scope.get("raw_path") or b"") + (len(query) + 1 if query else 0) + 12
    return line + sum(len(k) + len(v) + 3 for k, v in scope.get("headers", [])) + 2


class _QuietAborts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], StreamAborted))


_QUIET_ABORTS = _QuietAborts()  # one instance: adding it again is a no-op


def _check_bind(host: str, port: int) -> None:
    """OmniTTSError naming why `host`:`port` cannot be listened on (taken, not an address of this machine,
    not allowed), before uvicorn would log it and leave its thread."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            s.bind(infos[0][4])
    except OSError as e:
        raise OmniTTSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def config(app: Any, host: str, port: int, settings: ServeSettings) -> uvicorn.Config:
    """uvicorn's settings for `app` with the service's limits."""
    protocol = type("Protocol", (HeaderDeadlineH11,), {"header_timeout_s": settings.header_timeout_s})
    return uvicorn.Config(HeaderChecks(app, settings.max_header_bytes), host=host, port=port, http=protocol,
                          log_config=None, access_log=False,
                          limit_concurrency=settings.limit_concurrency,
                          timeout_keep_alive=settings.timeout_keep_alive_s,
                          h11_max_incomplete_event_size=settings.max_header_bytes,
                          timeout_graceful_shutdown=settings.graceful_shutdown_s)


class Server:
    """`app` served by uvicorn on a thread of its own (the caller's thread stays free for signals)."""

    def __init__(self, app: Any, host: str, port: int, settings: ServeSettings | None = None) -> None:
        self.settings = settings or ServeSettings()
        self.server = uvicorn.Server(config(app, host, port, self.settings))
        self.host, self.port = host, port
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, name="omni-tts-http", daemon=True)
        logging.getLogger("uvicorn.error").addFilter(_QUIET_ABORTS)

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 60.0) -> str:
        """Serve in the background; -> the local URL once it listens (OmniTTSError naming why it cannot)."""
        _check_bind(self.host, self.port)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if self._ended.is_set() or time.monotonic() > deadline:
                raise OmniTTSError(f"the HTTP server did not start on {self.host}:{self.port} (see the log above)")
            time.sleep(0.02)
        return self.url

    def _run(self) -> None:
        try:
            self.server.run()
        finally:
            self._ended.set()

    def wait(self) -> None:
        """Block until the server stops (in slices, so the caller's thread still takes signals). On an event,
        not the thread's join: a KeyboardInterrupt inside join can leave the thread marked as stopped while
        it still runs (Python 3.11), and `stop` would then not wait for uvicorn's graceful exit."""
        while not self._ended.wait(0.5):
            pass

    def close(self, engine: Any, say: Callable[[str], None] | None = None) -> None:
        """Shut down in order: new requests are refused (503, /ready 503) while the accepted ones finish,
        for at most graceful_shutdown_s; then the engine ends the rest as errors (an SSE error event, a cut
        raw stream: never a short clip that looks whole); then the HTTP server stops."""
        grace = self.settings.graceful_shutdown_s
        try:
            if not engine.drain(grace) and say:
                say(f"requests still running after {grace} s of shutdown end with an error")
        except KeyboardInterrupt:  # a second Ctrl-C: stop waiting
            pass
        finally:
            engine.shutdown()
            self.stop()

    def stop(self, timeout: float | None = None) -> None:
        """Stop accepting, let open requests end (at most graceful_shutdown_s), then cut them."""
        self.server.should_exit = True
        if self._thread.ident is None:  # never started (its address could not be bound)
            return
        self._ended.wait(timeout if timeout is not None else self.settings.graceful_shutdown_s + 5)
