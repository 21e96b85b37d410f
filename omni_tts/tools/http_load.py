"""The benchmark's HTTP client: the same closed loop as `tools/load.py`, through `POST /v1/audio/speech`.

Measures as vLLM-Omni's serving benchmark does: TTFP from the POST to the first non-empty chunk of the
streamed 16-bit PCM body, E2E from the POST to the end of the body, audio seconds from its length. So
our server and another OpenAI-compatible speech server can be measured by the same client.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from omni_tts import RequestMetrics
from omni_tts.tools.load import PROMPTS, closed_loop

BYTES_PER_SAMPLE = 2  # pcm: 16-bit little-endian mono


def one_request(client: Any, url: str, body: dict[str, Any], rid: int, sample_rate: int) -> RequestMetrics:
    """POST one streamed request; its timings as a RequestMetrics (clock: this process)."""
    t0 = time.perf_counter()
    m = RequestMetrics(rid, str(body.get("mode") or ""), t0, sample_rate=sample_rate)
    size = 0
    with client.stream("POST", url, json=body, timeout=600) as r:
        if r.status_code != 200:
            r.read()
            m.status, m.error, m.finished_at = "error", f"HTTP {r.status_code}: {r.text[:120]}", time.perf_counter()
            return m
        for chunk in r.iter_bytes():
            if chunk and m.first_audio_at is None:
                m.first_audio_at = time.perf_counter()
            size += len(chunk)
    m.finished_at, m.status = time.perf_counter(), "done"
    m.audio_samples = size // BYTES_PER_SAMPLE
    return m


def run_http_load(base_url: str, concurrency: int, num_prompts: int, frames: int, voice: str | None,
                  mode: str | None, sample_rate: int = 24000) -> tuple[list[RequestMetrics], float]:
    """`concurrency` clients share `num_prompts` streamed requests of at most `frames` frames each."""
    import httpx

    url = base_url.rstrip("/") + "/v1/audio/speech"
    local = threading.local()  # one connection pool per client thread

    def work(i: int) -> RequestMetrics:
        if not hasattr(local, "client"):
            local.client = httpx.Client()
        body = {"input": PROMPTS[i % len(PROMPTS)], "voice": voice, "response_format": "pcm", "stream": True,
                "max_new_tokens": frames + 1, "seed": 1234 + i, "language": "English"}
        if mode:
            body["mode"] = mode
        return one_request(local.client, url, body, i, sample_rate)

    return closed_loop(concurrency, num_prompts, work)


def bench_http(base_url: str, concurrency: Sequence[int], num_prompts: int, frames: int, voice: str | None,
               mode: str | None, warmup: int) -> dict[int, dict[str, float]]:
    """Per concurrency: summarize()'s figures for the streamed requests that finished (warm-up excluded)."""
    from omni_tts.engine.testing import summarize

    out: dict[int, dict[str, float]] = {}
    for c in concurrency:
        run_http_load(base_url, c, max(warmup, c), frames, voice, mode)
        records, wall = run_http_load(base_url, c, max(num_prompts, c), frames, voice, mode)
        done = [m for m in records if m.status == "done"]
        errors = [m.error for m in records if m.status != "done"]
        out[c] = summarize(done, wall) if done else {"error": (errors or ["no request finished"])[0]}
    return out
