"""Helpers of the HTTP tests: a real uvicorn server over build_app on a free port (`serve`, the service's
own Server; `serve_app`, plain uvicorn for any FastAPI app), the engine's ended requests as they end (its
observer hook), and clients that leave early over raw sockets."""


from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from _fixtures import FIXTURES, free_port
from fastapi import FastAPI

from omni_tts.config import EngineConfig, SynthesisParams
from omni_tts.serving.app import build_app
from omni_tts.serving.server import Server
from omni_tts.serving.settings import ServeSettings

WAIT_S = 120.0  # generous: a loaded 2-core machine; every wait ends as soon as its condition holds
LONG = {"input": "Hello there, a long one.", "voice": "ryan", "max_new_tokens": 300, "seed": 3}  # 299 frames
SHORT = {"input": "Short.", "voice": "ryan", "max_new_tokens": 6, "seed": 3}


def tiny_config(**kw: Any) -> EngineConfig:
    return EngineConfig(model=str(FIXTURES / "custom_voice"), device="cpu", mode="eager", max_seq_len=512,
                        initial_chunk_frames=1, chunk_frames=4, **kw)


def params(**kw: Any) -> SynthesisParams:
    """A short sampled request to the tiny checkpoint's 'ryan', seeded; any field overridden by `kw`."""
    return SynthesisParams(**{"text": "Hello there.", "speaker": "ryan", "seed": 5, **kw})


def grown(before: dict, after: dict) -> dict:
    """The counters (e.g. EngineStats.outcomes) that changed from `before` to `after`, by how much."""
    return {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}


class Ended:
    """Every request the engine ends, by id (RequestMetrics), fed by EngineStats' observer hook."""

    def __init__(self, engine: Any) -> None:
        self.by_id: dict[int, Any] = {}
        self._cond = threading.Condition()
        engine.stats.observers.append(self._add)

    def _add(self, m: Any) -> None:
        with self._cond:
            self.by_id[m.request_id] = m
            self._cond.notify_all()

    def wait(self, ids: list[int], timeout: float = WAIT_S) -> list[Any]:
        """The metrics of `ids` once all have ended (AssertionError after `timeout`)."""
        with self._cond:
            ok = self._cond.wait_for(lambda: all(i in self.by_id for i in ids), timeout)
            assert ok, f"requests {sorted(set(ids) - set(self.by_id))} did not end within {timeout:.0f} s"
            return [self.by_id[i] for i in ids]

    def wait_new(self, known: set[int], n: int = 1, timeout: float = WAIT_S) -> list[Any]:
        """The first `n` requests to end whose ids are not in `known`."""
        with self._cond:
            ok = self._cond.wait_for(lambda: len(set(self.by_id) - known) >= n, timeout)
            assert ok, f"no {n} new requests ended within {timeout:.0f} s"
            return [self.by_id[i] for i in sorted(set(self.by_id) - known)[:n]]


def serve(engine: Any, settings: ServeSettings | None = None) -> tuple[Server, str]:
    server = Server(build_app(engine, settings), "127.0.0.1", free_port(), settings)
    return server, server.start()


def until(condition: Callable[[], bool], timeout: float = WAIT_S, what: str = "the condition") -> None:
    """Poll `condition` (state another thread changes) until it holds; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not hold within {timeout:.0f} s"
        time.sleep(0.01)


class Leaver:
    """One client over a raw connection: POSTs a body, reads the status line (and `first` body bytes when
    asked), then hangs up when told to."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
        self.conn.request("POST", "/v1/audio/speech", json.dumps(body), {"Content-Type": "application/json"})

    def status(self) -> tuple[int, int | None]:
        """(status, request id) once the response's headers are in."""
        self.r = self.conn.getresponse()
        rid = self.r.getheader("X-Request-Id")
        return self.r.status, int(rid) if rid else None

    def read(self, n: int) -> bytes:
        return self.r.read(n)

    def leave(self) -> None:
        self.conn.sock.close()
        self.conn.close()


@contextmanager
def serve_app(app: FastAPI) -> Iterator[str]:
    """`app` on 127.0.0.1; yields the base URL, stops at exit."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", ws="websockets-sansio")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(2000):  # started is set once the socket listens
            if server.started or not thread.is_alive():
                break
            thread.join(0.01)
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
